"""An interrupted ``generate()`` (Ctrl-C, or a forward pass that raises) leaves the engine as it found it.

The exception reaches the caller unchanged, and the requests of that call are aborted on the way out: nothing
stays queued, every K/V slot is free again (m04), no sampler state is left behind, and the next ``generate``
gives transformers' tokens. Later milestones inherit this from m01's ``generate`` and m04's
``abort_requests``; each one that holds new state extends ``abort_requests`` and this test.
"""

from __future__ import annotations

import importlib.util
from contextlib import contextmanager

import pytest
from conftest import GREEDY_MAX_TOKENS, mixed_length_prompts

from milestones.m01_naive_loop import SamplingParams

GREEDY = SamplingParams(max_tokens=GREEDY_MAX_TOKENS, ignore_eos=True)
M04 = "m04_continuous_batching"


@contextmanager
def failing_forward(model, fail_at: int, error: BaseException):
    """Raise ``error`` from the model's ``fail_at``-th forward pass (1-based) while the block runs."""
    calls = []

    def hook(module, args):
        calls.append(1)
        if len(calls) == fail_at:
            raise error

    handle = model.register_forward_pre_hook(hook)
    try:
        yield calls
    finally:
        handle.remove()


def half_sampled(n: int) -> list[SamplingParams]:
    """Every other request samples (it holds a generator in the sampler while it runs), the rest are greedy."""
    return [SamplingParams(max_tokens=GREEDY_MAX_TOKENS, temperature=0.8, ignore_eos=True) if i % 2 else GREEDY
            for i in range(n)]


def assert_idle(engine) -> None:
    assert engine.sampler._generators == {}, "sampler state of aborted requests was left behind"
    scheduler = getattr(engine, "scheduler", None)
    if scheduler is not None:  # m04 on
        assert not engine.has_unfinished()
        assert not scheduler.waiting and not scheduler.running
    block_manager = getattr(engine, "block_manager", None)
    if block_manager is not None:  # m05 on: paged blocks
        assert block_manager.num_used_blocks == 0 and block_manager.block_tables == {}
    elif scheduler is not None:  # m04: contiguous regions
        assert scheduler.allocator.reserved_slots == 0
        assert scheduler.allocator.largest_free_range == scheduler.allocator.capacity


# m04: prefill 1 admits the first three requests (K/V reserved, nothing sampled yet); by forward 5 some have
# finished, others are mid-decode and the rest still wait for a seat.
@pytest.mark.parametrize("fail_at", [1, 5])
@pytest.mark.parametrize("error", [KeyboardInterrupt(), RuntimeError("CUDA error: out of memory")],
                         ids=["ctrl-c", "forward-raises"])
def test_m04_survives_an_interrupted_generate(tiny_checkpoint, engine_factory, hf_reference, fail_at, error):
    # A config no other test uses: this engine is ours alone.
    engine = engine_factory(M04, tiny_checkpoint[0], max_num_seqs=3, kv_cache_tokens=1000)
    prompts = mixed_length_prompts()
    with failing_forward(engine.model, fail_at, error) as calls:
        with pytest.raises(type(error)) as info:
            engine.generate(prompts, half_sampled(len(prompts)), use_tqdm=False)
    assert info.value is error and len(calls) == fail_at
    assert_idle(engine)
    outputs = engine.generate(prompts, GREEDY, use_tqdm=False)  # no "still unfinished" error: the engine is idle
    assert [o.token_ids for o in outputs] == hf_reference
    assert_idle(engine)


def test_m04_interrupt_leaves_step_api_requests_alone(tiny_checkpoint, engine_factory, hf_reference):
    """``generate`` refuses to run beside pending step-API requests, and that refusal must not abort them."""
    engine = engine_factory(M04, tiny_checkpoint[0], max_num_seqs=3, kv_cache_tokens=1000)
    pending = engine.add_request([5, 6, 7], SamplingParams(max_tokens=4, ignore_eos=True))
    with pytest.raises(ValueError, match="idle engine"):
        engine.generate([[8, 9]], GREEDY, use_tqdm=False)
    finished = []
    while engine.has_unfinished():
        finished += [o for o in engine.step() if o.finish_reason is not None]
    assert [(o.request_id, o.finish_reason, len(o.token_ids)) for o in finished] == [(pending, "length", 4)]
    assert_idle(engine)


# m01 and m02 run one request at a time, 12 forward passes each: forward 15 is mid-way through request 1,
# a sampled one. m03's forward 4 is a decode step of its first batch of four, two of them sampled.
@pytest.mark.parametrize("milestone, extra, fail_at, error", [
    ("m01_naive_loop", {}, 15, KeyboardInterrupt()),
    ("m02_kv_cache", {}, 15, RuntimeError("boom")),
    ("m03_static_batching", {"max_num_seqs": 4}, 4, KeyboardInterrupt()),
], ids=["m01", "m02", "m03"])
def test_m01_to_m03_leave_no_state_behind(tiny_checkpoint, engine_factory, hf_reference, milestone, extra,
                                          fail_at, error):
    engine = engine_factory(milestone, tiny_checkpoint[0], **extra)
    prompts = mixed_length_prompts()
    with failing_forward(engine.model, fail_at, error):
        with pytest.raises(type(error)):
            engine.generate(prompts, half_sampled(len(prompts)), use_tqdm=False)
    assert_idle(engine)
    outputs = engine.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.token_ids for o in outputs] == hf_reference


LATER = [name for name in ("m05_paged_blocks", "m06_prefix_cache", "m07_chunked_prefill", "m08_triton_kernel",
                           "m09_server", "m10_cuda_graphs") if importlib.util.find_spec(f"milestones.{name}")]


@pytest.mark.parametrize("milestone", LATER)
def test_later_milestones_inherit_it(tiny_checkpoint, engine_factory, hf_reference, milestone):
    """Paged blocks, a prefix cache, chunked prefill: whatever a later engine holds, an interrupted run gives it
    back (through m04's ``abort_requests`` and the engine's own ``abort``)."""
    engine = engine_factory(milestone, tiny_checkpoint[0], max_num_seqs=3, kv_cache_tokens=1024)
    prompts = mixed_length_prompts()
    with failing_forward(engine.model, 5, KeyboardInterrupt()):
        with pytest.raises(KeyboardInterrupt):
            engine.generate(prompts, half_sampled(len(prompts)), use_tqdm=False)
    assert_idle(engine)
    outputs = engine.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.token_ids for o in outputs] == hf_reference
    assert_idle(engine)
