"""Token ids in, text deltas out: what a streaming server may send after each new token.

Two things make "decode the new token and send it" wrong:

* **A character can span tokens.** Qwen3's tokens are byte sequences, and one character may be 2-4 UTF-8
  bytes split across tokens: "é" can arrive as two tokens of one byte each. Decoding the first alone gives
  the replacement character "\ufffd". So text is decoded over a small window of recent tokens, and held
  back while the window ends in an incomplete character::

      tokens:   ...  [ prefix_offset ........ read_offset ......... len ]
      text:          prefix_text (already sent)  | new text (sent unless it ends in "\ufffd")

  The window restarts at a point where the text was complete, so every decode is short (O(1) per token,
  not O(length)).

* **A stop string can span tokens.** With ``stop=["\\n\\nUser:"]``, text ending in "\\n\\nUs" might be the
  start of it. Sending "\\n\\nUs" and then finding the stop would leak text the client asked not to see.
  So the longest tail of the unsent text that could begin a stop string is held back until the next token
  decides::

      text:   sent ........ | sendable now | held: a prefix of some stop string
                            ^ self.sent

  Invariant: the sent text never ends in a proper prefix of a stop string, so a match can only start at or
  after ``self.sent``, and only that part is searched.

When the request finishes, everything held is flushed (no more tokens can complete a character or a stop).
"""

from __future__ import annotations

from collections.abc import Sequence

REPLACEMENT_CHAR = "\ufffd"  # what decoding an incomplete UTF-8 sequence produces


class IncrementalDetokenizer:
    """Feed it a request's output token ids as they grow; it returns the text that is safe to send.

    ``stop``: strings that end the request; the text before the first match is kept, the stop string and
    everything after it are dropped (``self.stopped`` becomes True: the caller aborts the request).
    """

    def __init__(self, tokenizer, stop: Sequence[str] = (), skip_special_tokens: bool = True) -> None:
        if any(not s for s in stop):
            raise ValueError("stop strings must be non-empty")
        self.tokenizer = tokenizer
        self.stop = list(stop)
        self.skip_special_tokens = skip_special_tokens
        self.token_ids: list[int] = []
        self.prefix_offset = 0  # the decode window starts here ...
        self.read_offset = 0  # ... and its text up to here has been turned into self.text already
        self.text = ""  # everything decoded so far (sent + held), cut at a stop string when one matched
        self.sent = 0  # len(self.text) already returned to the caller
        self.stopped = False

    def update(self, token_ids: Sequence[int], finished: bool = False) -> str:
        """Take all output token ids so far (a longer list each call); return the new sendable text."""
        if self.stopped:
            return ""
        new_ids = token_ids[len(self.token_ids):]
        self.token_ids.extend(new_ids)
        self._decode_window(flush=finished)
        end = self._find_stop()
        if end is not None:
            self.text, self.stopped = self.text[:end], True
            return self._send(end)
        if finished:
            return self._send(len(self.text))
        return self._send(len(self.text) - self._held_stop_prefix())

    # ------------------------------------------------------------------ characters across tokens

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def _decode_window(self, flush: bool) -> None:
        prefix_text = self._decode(self.token_ids[self.prefix_offset:self.read_offset])
        window_text = self._decode(self.token_ids[self.prefix_offset:])
        complete = not window_text.endswith(REPLACEMENT_CHAR)
        if len(window_text) > len(prefix_text) and (complete or flush):
            self.text += window_text[len(prefix_text):]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)

    # ------------------------------------------------------------------ stop strings across tokens

    def _find_stop(self) -> int | None:
        """Where the earliest stop string starts in the unsent text, or None."""
        matches = [i for i in (self.text.find(s, self.sent) for s in self.stop) if i != -1]
        return min(matches) if matches else None

    def _held_stop_prefix(self) -> int:
        """Length of the longest unsent tail that is a proper prefix of some stop string."""
        unsent = self.text[self.sent:]
        longest = 0
        for stop in self.stop:
            for k in range(min(len(stop) - 1, len(unsent)), longest, -1):
                if unsent.endswith(stop[:k]):
                    longest = k
                    break
        return longest

    def _send(self, end: int) -> str:
        delta = self.text[self.sent:end]
        self.sent = max(self.sent, end)
        return delta
