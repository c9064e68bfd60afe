"""Shared fixtures: a tiny random Qwen3 built by transformers (fp32, CPU), saved as a checkpoint our engine loads.

The reference for every correctness test is transformers' own ``generate`` on the very same weights. A reference
is only worth comparing against if a bug would change it, so the test models are built to be sensitive:

* **every norm weight is random** (input, post-attention, final, ``q_norm``, ``k_norm``; each layer and each norm
  its own draw in [0.5, 1.5]): an RMSNorm that ignores its weight, or q_norm and k_norm swapped, changes the tokens.
  transformers initialises them all to 1.0, where both bugs are invisible.
* **matrices are drawn with std 0.3**, not transformers' 0.02: with 0.02 a tied model's residual stream stays close
  to the input embedding, so greedy decoding repeats the last prompt token, and two engines that both repeat it
  agree whatever their attention does. With 0.3 the continuations vary.
* **the reference fixtures check themselves** (``assert_reference_is_informative``): varied tokens, not the last
  prompt token over and over, different outputs for different prompts, and a clear top-1 logit at every greedy
  step (so exact equality in fp32 never hangs on a near-tie). A change that makes the models degenerate again fails
  loudly at fixture setup instead of quietly weakening every test.

Mutation checks: ``python tests/mutation_check.py`` reintroduces known bugs (RMSNorm ignoring its weight, q/k norm
swapped, RoPE positions off by one, FCFS overtaking) in a scratch copy of the repository and lists the tests that
catch each one.
"""

from __future__ import annotations

import ctypes
import os
import random
import signal
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

VOCAB = 512
EOS = 3  # an id the random model can emit; tests that want fixed lengths pass ignore_eos
INIT_STD = 0.3  # std of every matrix and the embedding (transformers' default is 0.02: see the module docstring)
NORM_WEIGHT_RANGE = (0.5, 1.5)  # every RMSNorm weight element is drawn uniformly from this range
MIN_LOGIT_GAP = 1e-4  # a reference's top-1 logit must beat the runner-up by this much at every greedy step


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``-n auto``: a worker per core), each worker's torch takes its share of the cores: with
    every worker on every core, their threads only wait on each other (the tests' models are tiny)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        torch.set_num_threads(max(1, cores // workers))


def end_with_this_process() -> None:
    """``preexec_fn`` for a server a test starts: Linux sends it SIGTERM when the test process ends, however it
    ends (``PR_SET_PDEATHSIG``), so a suite stopped from outside (a CI timeout, a killed pytest) leaves no server
    behind. Where there is no ``prctl`` (macOS), the test's own ``finally`` is all there is."""
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def env_with_checkout(**extra: str) -> dict[str, str]:
    """The environment for a test's own Python script: the checkout on PYTHONPATH, because a script's folder, not
    the working directory, starts ``sys.path`` (a machine that runs the suite without installing the package, as
    the GPU call does, finds milestones/ there)."""
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return {**os.environ, **extra, "PYTHONPATH": os.pathsep.join(filter(None, [checkout, os.environ.get("PYTHONPATH")]))}


def tiny_hf_config(tie_word_embeddings: bool = True) -> Qwen3Config:
    return Qwen3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
        rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=tie_word_embeddings,
        bos_token_id=1, eos_token_id=EOS, pad_token_id=0, initializer_range=INIT_STD,
    )


def norm_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every RMSNorm weight by name: per layer ``input_layernorm``, ``post_attention_layernorm``,
    ``self_attn.q_norm``, ``self_attn.k_norm``, and the final ``model.norm``."""
    return {name: p for name, p in model.named_parameters() if name.endswith("norm.weight")}


def randomize_norm_weights(model: torch.nn.Module, seed: int) -> None:
    """Draw every norm weight from ``NORM_WEIGHT_RANGE``, independently per element, norm and layer."""
    generator = torch.Generator().manual_seed(seed)
    low, high = NORM_WEIGHT_RANGE
    with torch.no_grad():
        for weight in norm_weights(model).values():
            weight.copy_(low + (high - low) * torch.rand(weight.shape, generator=generator))


def build_tiny_model(tie_word_embeddings: bool = True, seed: int = 0) -> Qwen3ForCausalLM:
    """The tiny random Qwen3 every correctness test runs: std-0.3 matrices, random norm weights, eval mode."""
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(tiny_hf_config(tie_word_embeddings)).eval()
    randomize_norm_weights(model, seed)
    return model


def save_tiny_checkpoint(directory, tie_word_embeddings: bool = True, seed: int = 0, max_shard_size=None):
    model = build_tiny_model(tie_word_embeddings, seed)
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(directory, **kwargs)
    return model


@pytest.fixture(scope="session", params=[True, False], ids=["tied", "untied"])
def tiny_checkpoint(request, tmp_path_factory):
    """(checkpoint directory, the transformers model saved there), with tied and with untied embeddings."""
    directory = tmp_path_factory.mktemp("tied" if request.param else "untied")
    model = save_tiny_checkpoint(directory, tie_word_embeddings=request.param)
    return directory, model


def hf_greedy_with_gaps(model, prompt_ids: list[int], max_new_tokens: int,
                        ignore_eos: bool = True) -> tuple[list[int], list[float]]:
    """transformers' greedy tokens for one unpadded prompt, and at each step the top-1 minus top-2 logit."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
            max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0,
            eos_token_id=None if ignore_eos else EOS, output_scores=True, return_dict_in_generate=True,
        )
    gaps = [float(top[0] - top[1]) for top in (scores[0].float().topk(2).values for scores in out.scores)]
    return out.sequences[0, len(prompt_ids):].tolist(), gaps


def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int, ignore_eos: bool = True) -> list[int]:
    """transformers' greedy ``generate`` for one unpadded prompt: the ground truth."""
    return hf_greedy_with_gaps(model, prompt_ids, max_new_tokens, ignore_eos)[0]


def reference_problems(prompts: list[list[int]], outputs: list[list[int]], gaps: list[float]) -> list[str]:
    """Why a greedy reference would make a weak test; empty when it is fine (``assert_reference_is_informative``)."""
    problems = []
    for i, (prompt, tokens) in enumerate(zip(prompts, outputs)):
        counts = Counter(tokens)
        if len(counts) < max(2, len(tokens) // 3):
            problems.append(f"output {i} has only {len(counts)} distinct tokens in {len(tokens)}: {tokens}")
        if counts.most_common(1)[0][1] > len(tokens) // 2:
            problems.append(f"output {i} is mostly one token: {tokens}")
        if counts[prompt[-1]] > len(tokens) // 4:
            problems.append(f"output {i} repeats its last prompt token {prompt[-1]}: {tokens}")
    if len({tuple(tokens) for tokens in outputs}) < len(outputs):
        problems.append("different prompts gave the same output")
    if gaps and min(gaps) < MIN_LOGIT_GAP:
        problems.append(f"a greedy step is a near-tie (top-1 minus top-2 logit {min(gaps):.1e} < {MIN_LOGIT_GAP:.0e})")
    return problems


def assert_reference_is_informative(prompts: list[list[int]], outputs: list[list[int]], gaps: list[float]) -> None:
    """Refuse a reference that a broken engine could match by luck.

    Each output must have several distinct tokens, not be mostly one token, and not keep repeating its prompt's last
    token (what a model whose residual stream is just the input embedding does); different prompts must give
    different outputs; and no greedy step may be a near-tie, so that exact fp32 equality stays robust.
    """
    problems = reference_problems(prompts, outputs, gaps)
    assert not problems, "the test model's greedy reference is degenerate:\n  " + "\n  ".join(problems)


def greedy_reference(model, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """transformers' greedy tokens (EOS ignored) for each prompt, checked by ``assert_reference_is_informative``."""
    results = [hf_greedy_with_gaps(model, prompt, max_new_tokens) for prompt in prompts]
    outputs = [tokens for tokens, _ in results]
    assert_reference_is_informative(prompts, outputs, [gap for _, gaps in results for gap in gaps])
    return outputs


def random_prompts(n: int, min_len: int, max_len: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(4, VOCAB) for _ in range(rng.randint(min_len, max_len))] for _ in range(n)]


@contextmanager
def recorded_model_inputs(engine) -> Iterator[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Record ``(input_ids, positions)`` of every forward pass ``engine.model`` runs inside the ``with`` block.

    Token equality cannot see every position bug: RoPE depends only on the distance between a query and a key, so a
    row whose positions are ALL shifted by one gives the same tokens (until the shift runs past the RoPE table).
    Tests that check the positions themselves use this.
    """
    calls: list[tuple[torch.Tensor, torch.Tensor]] = []
    model = engine.model
    original = model.forward

    def forward(input_ids, positions, attention):
        calls.append((input_ids.detach().clone(), positions.detach().clone()))
        return original(input_ids, positions, attention)

    model.forward = forward  # an instance attribute: nn.Module.__call__ finds it before the class's forward
    try:
        yield calls
    finally:
        del model.forward


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
    return greedy_reference(model, mixed_length_prompts(), GREEDY_MAX_TOKENS)


@pytest.fixture(scope="session")
def tied_checkpoint(tmp_path_factory):
    """A single tied checkpoint, for tests that need one model but not both embedding layouts."""
    directory = tmp_path_factory.mktemp("tied-only")
    return directory, save_tiny_checkpoint(directory, tie_word_embeddings=True)


@pytest.fixture(scope="session")
def wide_tied_checkpoint(tmp_path_factory):
    """A second tied checkpoint (another seed), for tests that compare two tied models' worth of tokens.

    It was once the only tied model whose greedy tokens varied (the others used transformers' std 0.02); every
    test model is built that way now, so this one just adds a different draw of the same recipe.
    """
    directory = tmp_path_factory.mktemp("wide-tied")
    return directory, save_tiny_checkpoint(directory, tie_word_embeddings=True, seed=1)


@pytest.fixture(scope="session")
def wide_tied_reference(wide_tied_checkpoint):
    """transformers' greedy tokens on ``wide_tied_checkpoint`` for each of ``mixed_length_prompts()``."""
    return greedy_reference(wide_tied_checkpoint[1], mixed_length_prompts(), GREEDY_MAX_TOKENS)


def _skip_where_the_interpreter_cannot_run():
    """A test that needs Triton's interpreter skips, with the reason, where this Triton's interpreter cannot run the
    kernels (Triton 3.6 beside numpy 2, as on the project's GPU machine); everywhere else it runs."""
    try:
        return (yield)
    except Exception as error:
        if "interpreter cannot run these kernels" in str(error):
            pytest.skip(f"Triton's interpreter is unavailable here: {error}")
        raise


pytest_runtest_setup = pytest.hookimpl(wrapper=True)(lambda item: (yield from _skip_where_the_interpreter_cannot_run()))
pytest_runtest_call = pytest.hookimpl(wrapper=True)(lambda item: (yield from _skip_where_the_interpreter_cannot_run()))
