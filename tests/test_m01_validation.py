"""Bad input to m01 is a ``ValueError`` that names the problem, raised before any work is done."""

from __future__ import annotations

import re

import pytest
import torch
from conftest import VOCAB

from milestones.m01_naive_loop import EngineConfig, LLMEngine, SamplingParams

MAX_POSITIONS = 512  # the tiny checkpoint's max_position_embeddings


@pytest.fixture(scope="module")
def engine(tied_checkpoint, engine_factory):
    return engine_factory("m01_naive_loop", tied_checkpoint[0])


@pytest.fixture
def forward_calls(engine):
    """Counts the model's forward passes while a test runs."""
    calls = []
    handle = engine.model.register_forward_pre_hook(lambda module, args: calls.append(args[0].shape))
    yield calls
    handle.remove()


def generate(engine, prompts, params=None):
    return engine.generate(prompts, params if params is not None else SamplingParams(max_tokens=2), use_tqdm=False)


# --------------------------------------------------------------------------- prompts


def test_empty_string_prompt(engine, forward_calls):
    with pytest.raises(ValueError, match="empty string"):
        generate(engine, [""])
    assert forward_calls == []


def test_empty_token_list(engine, forward_calls):
    with pytest.raises(ValueError, match="no tokens"):
        generate(engine, [[]])
    assert forward_calls == []


@pytest.mark.parametrize("bad", [VOCAB, VOCAB + 100, -1])
def test_token_id_out_of_range(engine, forward_calls, bad):
    with pytest.raises(ValueError, match=rf"{bad}.*outside \[0, {VOCAB}\)"):
        generate(engine, [[5, bad, 7]])
    assert forward_calls == []


def test_string_prompt_whose_tokens_the_model_lacks(engine, forward_calls):
    """The fallback tokenizer has Qwen3's 151k ids; the tiny model only 512. That is bad input too, caught
    before any forward pass, not an IndexError in the embedding."""
    ids = engine.tokenizer.encode("Hello world", add_special_tokens=False)
    assert max(ids) >= VOCAB
    with pytest.raises(ValueError, match=rf"outside \[0, {VOCAB}\)"):
        generate(engine, ["a b c", "Hello world"])
    assert forward_calls == []


@pytest.mark.parametrize("bad", [[1.5, 2], ["a", "b"], [[1, 2]], None, 7])
def test_malformed_prompt(engine, forward_calls, bad):
    with pytest.raises(ValueError, match="string or a list of token ids"):
        generate(engine, [[4, 5], bad])
    assert forward_calls == []


@pytest.mark.parametrize("bad, shown", [(True, "bool True"), (False, "bool False"), (None, "NoneType None"),
                                        ({"id": 5}, "dict {'id': 5}"), (b"ab", "bytes b'ab'"),
                                        (5.0, "float 5.0")])
def test_token_id_of_the_wrong_type(engine, forward_calls, bad, shown):
    """``True`` is an ``int`` to Python (``True == 1``), so it needs a check of its own."""
    with pytest.raises(ValueError, match=rf"^prompt 1: .*token 1 is {re.escape(shown)}"):
        generate(engine, [[4, 5], [6, bad, 7]])
    assert forward_calls == []


@pytest.mark.parametrize("bad, shown", [({"ids": [5]}, "dict"), (b"hello", "bytes"), (None, "NoneType"),
                                        (7, "int"), ((i for i in [5]), "generator")])
def test_prompt_of_the_wrong_type_is_named_by_its_index(engine, forward_calls, bad, shown):
    with pytest.raises(ValueError, match=rf"^prompt 2: a prompt is a string or a list of token ids, got {shown}"):
        generate(engine, [[4, 5], [6], bad])
    assert forward_calls == []


@pytest.mark.parametrize("bad, shown", [({"a": [1]}, "dict"), (b"abc", "bytes"), (None, "NoneType"),
                                        (7, "int"), ({(1, 2)}, "set")])
def test_prompts_that_are_not_a_list(engine, forward_calls, bad, shown):
    with pytest.raises(ValueError, match=rf"^prompts must be a string or a list of prompts, got {shown}"):
        generate(engine, bad)
    assert forward_calls == []


def test_string_with_a_lone_surrogate(engine, forward_calls):
    with pytest.raises(ValueError, match=r"^prompt 1: .*not valid Unicode.*'\\ud800' at index 2"):
        generate(engine, [[4, 5], "ab\ud800c"])
    assert forward_calls == []


def test_numpy_integer_token_ids_are_accepted(engine):
    np = pytest.importorskip("numpy")
    plain = generate(engine, [[4, 5, 6]])[0]
    from_numpy = generate(engine, [list(np.array([4, 5, 6], dtype=np.int64))])[0]
    assert from_numpy.prompt_token_ids == [4, 5, 6] and all(type(t) is int for t in from_numpy.prompt_token_ids)
    assert from_numpy.token_ids == plain.token_ids


def test_flat_list_of_ints_as_prompts(engine, forward_calls):
    with pytest.raises(ValueError, match=r"wrap one token-id prompt as \[\[id"):
        generate(engine, [5, 6, 7])
    assert forward_calls == []


def test_no_prompts(engine):
    with pytest.raises(ValueError, match="no prompts"):
        generate(engine, [])


# --------------------------------------------------------------------------- sampling params


@pytest.mark.parametrize("max_tokens", [0, -3])
def test_max_tokens_below_one(max_tokens):
    with pytest.raises(ValueError, match=rf"max_tokens.*{max_tokens}"):
        SamplingParams(max_tokens=max_tokens)


def test_max_tokens_not_an_integer():
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=2.5)


@pytest.mark.parametrize("temperature", [-0.1, -2.0])
def test_negative_temperature(temperature):
    with pytest.raises(ValueError, match=rf"temperature.*{temperature}"):
        SamplingParams(temperature=temperature)


@pytest.mark.parametrize("top_p", [0.0, -0.5, 1.01, 2.0])
def test_top_p_outside_zero_one(top_p):
    with pytest.raises(ValueError, match=rf"top_p.*{top_p}"):
        SamplingParams(top_p=top_p)


@pytest.mark.parametrize("top_k", [-2, -10])
def test_top_k_below_minus_one(top_k):
    with pytest.raises(ValueError, match=rf"top_k.*{top_k}"):
        SamplingParams(top_k=top_k)


@pytest.mark.parametrize("field, value, shown", [
    ("temperature", float("nan"), "nan"), ("temperature", float("inf"), "inf"),
    ("temperature", float("-inf"), "-inf"), ("top_p", float("nan"), "nan"), ("top_p", float("inf"), "inf"),
])
def test_non_finite_floats(field, value, shown):
    """``nan < 0`` is False, so a plain range check lets NaN through."""
    with pytest.raises(ValueError, match=rf"^{field} must be a finite number, got {shown}"):
        SamplingParams(**{field: value})


@pytest.mark.parametrize("field, value", [
    ("max_tokens", True), ("max_tokens", 4.0), ("max_tokens", "4"), ("max_tokens", None),
    ("top_k", 2.0), ("top_k", "5"), ("top_k", True),
    ("seed", True), ("seed", 1.5), ("seed", "7"),
    ("temperature", True), ("temperature", "0.5"), ("temperature", None),
    ("top_p", True), ("top_p", "1"),
])
def test_numbers_of_the_wrong_type(field, value):
    with pytest.raises(ValueError, match=rf"^{field} must be an? (integer|number), got {re.escape(repr(value))} "):
        SamplingParams(**{field: value})


@pytest.mark.parametrize("seed", [-1, 2**64])
def test_seed_outside_what_a_generator_takes(seed):
    with pytest.raises(ValueError, match=rf"seed must be in \[0, 2\*\*64\).*{seed}"):
        SamplingParams(seed=seed)


@pytest.mark.parametrize("value, message", [
    (5, r"stop_token_ids must be a list of token ids, got 5 \(int\)"),
    ("12", r"stop_token_ids must be a list of token ids, got '12' \(str\)"),
    (None, r"stop_token_ids must be a list of token ids, got None"),
    ([1, True], r"stop_token_ids\[1\] must be an integer, got True \(bool\)"),
    ([1.5], r"stop_token_ids\[0\] must be an integer, got 1.5"),
    ([4, -2], r"stop_token_ids must be token ids >= 0, got \[4, -2\]"),
])
def test_stop_token_ids_not_a_list_of_token_ids(value, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(stop_token_ids=value)


def test_ignore_eos_must_be_a_bool():
    with pytest.raises(ValueError, match="ignore_eos must be True or False, got 'yes'"):
        SamplingParams(ignore_eos="yes")


def test_numpy_numbers_are_accepted_as_plain_python_numbers():
    np = pytest.importorskip("numpy")
    params = SamplingParams(max_tokens=np.int64(4), top_k=np.int32(3), seed=np.uint64(7),
                            temperature=np.float32(0.5), top_p=np.float64(0.9), stop_token_ids=[np.int64(3)])
    assert (params.max_tokens, params.top_k, params.seed, params.stop_token_ids) == (4, 3, 7, [3])
    assert type(params.max_tokens) is int and type(params.temperature) is float and type(params.seed) is int


def test_valid_edges_are_accepted():
    SamplingParams(max_tokens=1, temperature=0.0, top_k=-1, top_p=1.0)
    SamplingParams(top_k=0, top_p=1e-3, temperature=100.0, seed=0)


def test_mismatched_number_of_sampling_params(engine, forward_calls):
    with pytest.raises(ValueError, match="3 prompts but 2 sampling params"):
        generate(engine, [[4], [5], [6]], [SamplingParams(), SamplingParams()])
    assert forward_calls == []


def test_sampling_params_of_the_wrong_type(engine, forward_calls):
    with pytest.raises(ValueError, match=r"sampling_params\[1\] must be a SamplingParams, got dict"):
        generate(engine, [[4], [5]], [SamplingParams(), {"max_tokens": 3}])
    assert forward_calls == []


@pytest.mark.parametrize("bad", [{"max_tokens": 3, "temperature": 0.5}, "greedy", 3])
def test_sampling_params_that_are_neither_one_nor_a_list(engine, forward_calls, bad):
    """A dict with as many keys as there are prompts must not pass for one SamplingParams per prompt."""
    with pytest.raises(ValueError, match=rf"^sampling_params must be a SamplingParams, .* got {type(bad).__name__}"):
        generate(engine, [[4], [5]], bad)
    assert forward_calls == []


# --------------------------------------------------------------------------- lengths


def test_prompt_plus_max_tokens_beyond_configured_max_model_len(tied_checkpoint, engine_factory):
    engine = engine_factory("m01_naive_loop", tied_checkpoint[0], max_model_len=32)
    assert engine.max_model_len == 32
    with pytest.raises(ValueError, match=r"30 tokens.*max_tokens \(3\).*33.*max_model_len \(32\)"):
        generate(engine, [[7] * 30], SamplingParams(max_tokens=3))
    output = generate(engine, [[7] * 30], SamplingParams(max_tokens=2, ignore_eos=True))[0]  # exactly 32: fine
    assert len(output.token_ids) == 2


def test_prompt_plus_max_tokens_beyond_the_model_limit(engine, forward_calls):
    assert engine.max_model_len == MAX_POSITIONS  # defaults to max_position_embeddings
    with pytest.raises(ValueError, match=rf"max_model_len \({MAX_POSITIONS}\)"):
        generate(engine, [[7] * 500], SamplingParams(max_tokens=13))
    with pytest.raises(ValueError, match="max_model_len"):
        generate(engine, [[7] * (MAX_POSITIONS + 1)], SamplingParams(max_tokens=1))
    assert forward_calls == []
    output = generate(engine, [[7] * 509], SamplingParams(max_tokens=3, ignore_eos=True))[0]  # exactly 512: fine
    assert len(output.token_ids) == 3


@pytest.mark.parametrize("max_model_len", [MAX_POSITIONS + 1, 10**6])
def test_max_model_len_outside_the_model_limit(tied_checkpoint, tokenizer_cache, max_model_len):
    with pytest.raises(ValueError, match=rf"max_model_len.*\[1, {MAX_POSITIONS}\].*{max_model_len}"):
        LLMEngine(EngineConfig(model=str(tied_checkpoint[0]), device="cpu", max_model_len=max_model_len))


@pytest.mark.parametrize("max_model_len", [0, -5])
def test_max_model_len_below_one_is_refused_by_the_config(max_model_len):
    with pytest.raises(ValueError, match=rf"max_model_len must be an integer >= 1 or None, got {max_model_len}"):
        EngineConfig(max_model_len=max_model_len)


# --------------------------------------------------------------------------- engine config


@pytest.mark.parametrize("name", ["no-such-preset", "tiny2"])
def test_unknown_model(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=re.escape(repr(name))):
        LLMEngine(EngineConfig(model=name, device="cpu"))


@pytest.mark.parametrize("dtype", ["float8", "fp32", "int8"])
def test_unknown_dtype(dtype):
    with pytest.raises(ValueError, match=rf"unknown dtype '{dtype}'"):
        LLMEngine(EngineConfig(model="tiny", device="cpu", dtype=dtype))


def test_unknown_device():
    with pytest.raises(ValueError, match="unknown device 'tpu-ish'"):
        LLMEngine(EngineConfig(model="tiny", device="tpu-ish"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_cuda_without_gpu(device):
    with pytest.raises(ValueError, match=rf"'{device}'.*no CUDA GPU"):
        LLMEngine(EngineConfig(model="tiny", device=device))


# --------------------------------------------------------------------------- nothing runs before validation


def test_one_bad_prompt_of_several_means_no_work(tied_checkpoint, engine_factory):
    fresh = engine_factory("m01_naive_loop", tied_checkpoint[0], seed=123)  # its stats have never been touched
    calls = []
    handle = fresh.model.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        with pytest.raises(ValueError, match=r"^prompt 2: "):  # the third prompt, by its index in the list
            generate(fresh, [[4, 5, 6], [7, 8], [9, VOCAB + 1], [10]], SamplingParams(max_tokens=4))
        assert calls == []
        assert fresh.stats.steps == 0 and fresh.stats.tokens_computed == 0
        generate(fresh, [[4, 5, 6]])  # the hook does see real work
        assert len(calls) == 2
    finally:
        handle.remove()


def test_bad_params_for_one_prompt_means_no_work(engine, forward_calls):
    too_long = SamplingParams(max_tokens=MAX_POSITIONS)
    with pytest.raises(ValueError, match="max_model_len"):
        generate(engine, [[4, 5], [6, 7], [8, 9]], [SamplingParams(), SamplingParams(), too_long])
    assert forward_calls == []
