"""Shared fixtures: a tiny random Qwen3 built by transformers (fp32, CPU), saved as a checkpoint our engine loads.

The reference for every correctness test is transformers' own ``generate`` on the very same weights.
"""

from __future__ import annotations

import random

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

VOCAB = 512
EOS = 3  # an id the random model can emit; tests that want fixed lengths pass ignore_eos


def tiny_hf_config(tie_word_embeddings: bool = True) -> Qwen3Config:
    return Qwen3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
        rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=tie_word_embeddings,
        bos_token_id=1, eos_token_id=EOS, pad_token_id=0,
    )


def save_tiny_checkpoint(directory, tie_word_embeddings: bool = True, seed: int = 0, max_shard_size=None):
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(tiny_hf_config(tie_word_embeddings)).eval()
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(directory, **kwargs)
    return model


@pytest.fixture(scope="session", params=[True, False], ids=["tied", "untied"])
def tiny_checkpoint(request, tmp_path_factory):
    """(checkpoint directory, the transformers model saved there), with tied and with untied embeddings."""
    directory = tmp_path_factory.mktemp("tied" if request.param else "untied")
    model = save_tiny_checkpoint(directory, tie_word_embeddings=request.param)
    return directory, model


def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int, ignore_eos: bool = True) -> list[int]:
    """transformers' greedy ``generate`` for one unpadded prompt: the ground truth."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
            max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0,
            eos_token_id=None if ignore_eos else EOS,
        )
    return out[0, len(prompt_ids):].tolist()


def random_prompts(n: int, min_len: int, max_len: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(4, VOCAB) for _ in range(rng.randint(min_len, max_len))] for _ in range(n)]


# --------------------------------------------------------------------------- shared by the m01/m02 engine tests

# Prompt lengths for the greedy-equivalence tests: from one token up to ~60.
PROMPT_LENGTHS = (1, 2, 3, 6, 11, 19, 30, 44, 60)
GREEDY_MAX_TOKENS = 12


def mixed_length_prompts(seed: int = 1) -> list[list[int]]:
    """One prompt per length in ``PROMPT_LENGTHS`` (ids 4..VOCAB-1, so never EOS or a special id)."""
    rng = random.Random(seed)
    return [[rng.randrange(4, VOCAB) for _ in range(n)] for n in PROMPT_LENGTHS]


@pytest.fixture(scope="session")
def tokenizer_cache(tmp_path_factory):
    """Engines on a tokenizer-less checkpoint fall back to Qwen3's built-in tokenizer, which is cached on disk.

    Point that cache at a temp dir so tests never write the user's cache; seed it from the user's cache when
    one exists, so it is not rebuilt from the ranks (several seconds).
    """
    import shutil

    from milestones.m01_naive_loop import tokenizer as tokmod

    root = tmp_path_factory.mktemp("engine-tokenizer-cache")
    existing = tokmod.cache_dir()
    if (existing / "tokenizer.json").is_file():
        shutil.copytree(existing, root / tokmod.CACHE_SUBDIR)
    mp = pytest.MonkeyPatch()
    mp.setenv("NANOSERVE_CACHE", str(root))
    tokmod.qwen3_tokenizer.cache_clear()
    yield root
    mp.undo()
    tokmod.qwen3_tokenizer.cache_clear()


@pytest.fixture(scope="session")
def engine_factory(tokenizer_cache):
    """``make(milestone, directory, **EngineConfig kwargs)``: one engine per (milestone, checkpoint, config)."""
    import importlib

    engines = {}

    def make(milestone: str, directory, **config_kwargs):
        key = (milestone, str(directory), tuple(sorted(config_kwargs.items())))
        if key not in engines:
            module = importlib.import_module(f"milestones.{milestone}")
            config = module.EngineConfig(model=str(directory), device="cpu", **config_kwargs)
            engines[key] = module.LLMEngine(config)
        return engines[key]

    return make


@pytest.fixture(scope="session")
def m01_engine(tiny_checkpoint, engine_factory):
    return engine_factory("m01_naive_loop", tiny_checkpoint[0])


@pytest.fixture(scope="session")
def m02_engine(tiny_checkpoint, engine_factory):
    return engine_factory("m02_kv_cache", tiny_checkpoint[0])


@pytest.fixture(scope="session")
def hf_reference(tiny_checkpoint):
    """transformers' greedy tokens (``GREEDY_MAX_TOKENS``, EOS ignored) for each of ``mixed_length_prompts()``."""
    _, model = tiny_checkpoint
    return [hf_greedy(model, prompt, GREEDY_MAX_TOKENS) for prompt in mixed_length_prompts()]


@pytest.fixture(scope="session")
def tied_checkpoint(tmp_path_factory):
    """A single tied checkpoint, for tests that need one model but not both embedding layouts."""
    directory = tmp_path_factory.mktemp("tied-only")
    return directory, save_tiny_checkpoint(directory, tie_word_embeddings=True)


@pytest.fixture(scope="session")
def wide_tied_checkpoint(tmp_path_factory):
    """Tied embeddings, weights drawn with std 0.3 instead of transformers' 0.02.

    With std 0.02 a tied tiny model's residual stream stays close to the input embedding, so greedy decoding
    mostly repeats the last prompt token, and a greedy comparison on it says little about attention. Wider
    weights make it produce varied tokens.
    """
    directory = tmp_path_factory.mktemp("wide-tied")
    config = tiny_hf_config(tie_word_embeddings=True)
    config.initializer_range = 0.3
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).eval()
    model.save_pretrained(directory)
    return directory, model
