"""m09's incremental detokenizer: streamed text never splits a character and never leaks a partial stop string."""

from __future__ import annotations

import pytest

from milestones.m09_server.detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer

TEXT = "héllo 𠀀 wörld 🫠 𝔘 ok, then\n\nUser: more 㐀 text"


@pytest.fixture(scope="module")
def tokenizer(tokenizer_cache):
    from milestones.m01_naive_loop.tokenizer import load_tokenizer

    return load_tokenizer(None)


def stream(tokenizer, ids: list[int], stop=(), finish_at_end: bool = True) -> tuple[list[str], IncrementalDetokenizer]:
    """Feed ``ids`` one token at a time, as the engine does; returns every delta."""
    detokenizer = IncrementalDetokenizer(tokenizer, stop)
    deltas = []
    for n in range(1, len(ids) + 1):
        deltas.append(detokenizer.update(ids[:n], finished=finish_at_end and n == len(ids)))
        if detokenizer.stopped:
            break
    return deltas, detokenizer


def test_multibyte_characters_split_across_tokens_are_held_until_complete(tokenizer):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    assert any(REPLACEMENT_CHAR in tokenizer.decode([i]) for i in ids)  # the text really has split characters
    deltas, _ = stream(tokenizer, ids)
    assert "".join(deltas) == TEXT
    assert not any(REPLACEMENT_CHAR in d for d in deltas)
    assert "" in deltas  # some steps sent nothing: half a character was waiting


def test_a_stream_cut_inside_a_character_sends_its_bytes_when_it_finishes(tokenizer):
    """max_tokens may end a request inside a character: "𠀀" is three tokens, and a request can stop after the
    first or the second. Then no later token will complete it, so the finishing update sends what was held:
    the text is exactly ``decode`` of the ids, replacement character and all, fed one by one or all at once."""
    ids = tokenizer.encode("héllo 𠀀 wörld", add_special_tokens=False)
    cuts = [n for n in range(1, len(ids) + 1) if tokenizer.decode(ids[:n]).endswith(REPLACEMENT_CHAR)]
    assert len(cuts) >= 2  # after the first and the second of "𠀀"'s tokens
    for n in cuts:
        expected = tokenizer.decode(ids[:n])
        deltas, _ = stream(tokenizer, ids[:n])
        assert "".join(deltas) == expected and deltas[-1].endswith(REPLACEMENT_CHAR), n
        assert not any(REPLACEMENT_CHAR in d for d in deltas[:-1])  # held back until the end...
        deltas, _ = stream(tokenizer, ids[:n], stop=["never there"])  # ... with or without stop strings
        assert "".join(deltas) == expected, n
        assert IncrementalDetokenizer(tokenizer).update(ids[:n], finished=True) == expected, n


def test_special_tokens_are_skipped(tokenizer):
    ids = tokenizer.encode("hi there", add_special_tokens=False) + [151645]  # <|im_end|>
    deltas, _ = stream(tokenizer, ids)
    assert "".join(deltas) == "hi there"


def test_stop_string_across_tokens_is_never_sent(tokenizer):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    deltas, detokenizer = stream(tokenizer, ids, stop=["\n\nUser:"])
    assert "".join(deltas) == TEXT[:TEXT.index("\n\nUser:")]
    assert detokenizer.stopped
    # The tokens before the stop arrived one by one, yet no delta ever carried its first characters.
    assert not any("\n" in d for d in deltas)


def test_possible_stop_prefix_is_held_then_released(tokenizer):
    ids = tokenizer.encode("a\n\nUsers like it", add_special_tokens=False)
    detokenizer = IncrementalDetokenizer(tokenizer, ["\n\nUser:"])
    sent, held = "", 0
    for n in range(1, len(ids) + 1):
        sent += detokenizer.update(ids[:n])
        decoded = tokenizer.decode(ids[:n])
        if decoded.endswith(("\n\n", "\n\nUser")):
            assert sent == "a"  # "\n\nUser" could still become "\n\nUser:"
            held += 1
    assert held  # the tokenization did stop on a possible prefix
    sent += detokenizer.update(ids, finished=True)
    assert sent == "a\n\nUsers like it" and not detokenizer.stopped


def test_earliest_of_several_stops_wins_and_finish_flushes(tokenizer):
    ids = tokenizer.encode("one two three four", add_special_tokens=False)
    deltas, _ = stream(tokenizer, ids, stop=["four", "two"])
    assert "".join(deltas) == "one "
    deltas, detokenizer = stream(tokenizer, ids, stop=["fourteen"])  # "four" at the end: held, then flushed
    assert "".join(deltas) == "one two three four" and not detokenizer.stopped
    assert deltas[-1].endswith("four")


def test_several_tokens_at_once_and_updates_after_a_stop(tokenizer):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    detokenizer = IncrementalDetokenizer(tokenizer, ["wörld"])
    assert detokenizer.update(ids[:4]) + detokenizer.update(ids) == "héllo 𠀀 "
    assert detokenizer.update(ids + ids, finished=True) == ""


def test_empty_stop_string_is_refused(tokenizer):
    with pytest.raises(ValueError, match="non-empty"):
        IncrementalDetokenizer(tokenizer, [""])
