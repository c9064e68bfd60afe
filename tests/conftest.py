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
