"""m12: steps planned one ahead give exactly m11's (and transformers') tokens — no token too many, none too few.

The overlap itself is timing, but what it must preserve is not: whatever step a request finishes on (its
``max_tokens``, a stop token, EOS), whatever happens to it while a step is in flight (an abort, a preemption),
and whether its prompt was chunked or found in the prefix cache, its tokens are the ones a step-by-step engine
gives. On a CPU the same code runs with the same one-step-late bookkeeping, so these tests pin it in CI.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import random_prompts
from kernel_signatures import TritonLaunches
from milestones.m01_naive_loop import SamplingParams
from paged_helpers import CHATS, StepRecorder, assert_blocks_all_free, drain, generate_exactly, greedy, make_engine

M12, M11 = "m12_async_scheduling", "m11_engine_core"
PROMPTS = random_prompts(6, 3, 30, seed=121)
KNOBS = dict(max_num_seqs=4, block_size=4, max_num_batched_tokens=12, kv_cache_tokens=96)


@pytest.fixture
def engine_on(tied_checkpoint, tokenizer_cache):
    """``engine_on(milestone, **config)``: a fresh engine on the tied checkpoint."""
    return lambda milestone=M12, **config: make_engine(milestone, tied_checkpoint[0], **config)


def tokens(outputs) -> list[list[int]]:
    return [o.token_ids for o in outputs]


def test_greedy_tokens_equal_transformers_under_chunking_prefix_hits_and_preemption(engine_on, tied_checkpoint):
    engine = engine_on(max_num_seqs=4, block_size=4, max_num_batched_tokens=10, kv_cache_tokens=56)
    outputs, recorder = generate_exactly(engine, tied_checkpoint[1], CHATS, [12, 12, 10, 12])
    assert engine.stats.num_preemptions >= 1 and engine.stats.prefix_cache_hit_tokens >= 24
    assert any(n > 1 and len(step.scheduled) > 1 for step in recorder.steps for *_, n in step.scheduled)
    assert_blocks_all_free(engine)


def test_a_step_feeds_the_ids_it_never_read_back(engine_on):
    """Decodes of a pending token get their input id from the previous step's samples, on the device."""
    engine = engine_on(**KNOBS)
    with StepRecorder(engine) as recorder:
        outputs = engine.generate(PROMPTS[:3], greedy(6), use_tqdm=False)
    recorder.assert_fed_as_scheduled({o.request_id: o.prompt_token_ids + o.token_ids for o in outputs})
    assert tokens(outputs) == tokens(engine_on(M11, **KNOBS).generate(PROMPTS[:3], greedy(6), use_tqdm=False))


def test_stop_tokens_on_every_possible_step(engine_on):
    """A request that stops on its k-th token, for every k, with other requests finishing around it."""
    reference = engine_on(M11, **KNOBS)
    free_run = reference.generate(PROMPTS, greedy(10), use_tqdm=False)
    engine = engine_on(**KNOBS)
    for k in range(10):
        params = [SamplingParams(max_tokens=10, stop_token_ids=[run.token_ids[k]], ignore_eos=True)
                  for run in free_run]
        got = engine.generate(PROMPTS, params, use_tqdm=False)
        expected = reference.generate(PROMPTS, params, use_tqdm=False)
        assert tokens(got) == tokens(expected), k
        assert [o.finish_reason for o in got] == [o.finish_reason for o in expected]
        assert all(o.token_ids[-1] == p.stop_token_ids[0] or o.finish_reason == "length"
                   for o, p in zip(got, params))
        assert_blocks_all_free(engine)


def test_eos_ends_a_request_one_step_late_without_an_extra_token(engine_on):
    reference = engine_on(M11, **KNOBS)
    (free,) = reference.generate([PROMPTS[0]], greedy(8), use_tqdm=False)
    for k in (0, 3, 7):  # the checkpoint's EOS, as if the model had emitted it at step k
        engine = engine_on(**KNOBS)
        engine.eos_token_ids = reference.eos_token_ids = frozenset({free.token_ids[k]})
        params = SamplingParams(max_tokens=8)
        (got,) = engine.generate([PROMPTS[0]], params, use_tqdm=False)
        (expected,) = reference.generate([PROMPTS[0]], params, use_tqdm=False)
        assert got.token_ids == expected.token_ids == free.token_ids[:free.token_ids.index(free.token_ids[k]) + 1]
        assert got.finish_reason == "stop"


def test_an_abort_while_its_step_is_in_flight(engine_on):
    engine = engine_on(**KNOBS)
    prompts = [PROMPTS[0][:4], PROMPTS[1][:4]]  # both in the first step's budget
    first = engine.add_request(prompts[0], greedy(8))
    second = engine.add_request(prompts[1], greedy(8))
    assert engine.step() == []  # step 1 launched; nothing read back yet
    seen = {o.request_id: o for o in engine.step()}  # step 2 launched, step 1's tokens read
    assert set(seen) == {first, second}
    assert engine.abort(first)  # its step-2 token is in flight
    rest = drain(engine)
    assert first not in rest and len(rest[second].token_ids) == 8
    assert_blocks_all_free(engine)
    expected = engine_on(M11, **KNOBS).generate([prompts[1]], greedy(8), use_tqdm=False)[0]
    assert rest[second].token_ids == expected.token_ids


def test_off_is_m11_step_for_step(engine_on):
    prompts, params = PROMPTS[:4], [greedy(n) for n in (3, 9, 1, 6)]
    off = engine_on(async_scheduling=False, **KNOBS)
    m11 = engine_on(M11, **KNOBS)
    assert tokens(off.generate(prompts, params, use_tqdm=False)) == tokens(m11.generate(prompts, params,
                                                                                          use_tqdm=False))
    for name in ("steps", "tokens_computed", "running_per_step"):
        assert getattr(off.stats, name) == getattr(m11.stats, name), name


def test_seeded_sampling_matches_m11_under_preemption(engine_on):
    params = [SamplingParams(max_tokens=10, temperature=0.9, top_p=0.9, seed=300 + i, ignore_eos=True)
              for i in range(len(CHATS))]
    knobs = dict(max_num_seqs=4, block_size=4, max_num_batched_tokens=10, kv_cache_tokens=52)
    engine = engine_on(**knobs)
    got = engine.generate(CHATS, params, use_tqdm=False)
    assert tokens(got) == tokens(engine_on(M11, **knobs).generate(CHATS, params, use_tqdm=False))
    assert engine.stats.num_preemptions >= 1


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=st.lists(st.integers(1, 7), min_size=1, max_size=5), stop_at=st.lists(st.integers(0, 8), max_size=5),
       abort_after=st.one_of(st.none(), st.integers(0, 6)), blocks=st.integers(8, 24))
def test_no_request_ever_gets_more_than_max_tokens(engine_on, lengths, stop_at, abort_after, blocks):
    """Random lengths, stop tokens, an abort at a random step and a cache small enough to preempt: every request
    gets at most ``max_tokens``, exactly m11's tokens when it was not aborted, and every block comes back."""
    knobs = dict(max_num_seqs=3, block_size=4, max_num_batched_tokens=8, kv_cache_tokens=4 * blocks)
    prompts = [PROMPTS[i % len(PROMPTS)][:8] for i in range(len(lengths))]
    params = [SamplingParams(max_tokens=n, stop_token_ids=[stop_at[i]] if i < len(stop_at) else [],
                             ignore_eos=True) for i, n in enumerate(lengths)]
    engine, reference = engine_on(**knobs), engine_on(M11, **knobs)
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    latest, step = {}, 0
    while engine.has_unfinished():
        for out in engine.step():
            latest[out.request_id] = out
        if step == abort_after:
            engine.abort(ids[0])
        step += 1
    expected = reference.generate(prompts, params, use_tqdm=False)
    for i, (request_id, sp) in enumerate(zip(ids, params)):
        out = latest.get(request_id)
        got = [] if out is None else out.token_ids
        assert len(got) <= sp.max_tokens
        if i == 0 and abort_after is not None:
            assert got == expected[0].token_ids[:len(got)]
        else:
            assert got == expected[i].token_ids and out.finish_reason == expected[i].finish_reason
    assert_blocks_all_free(engine)


def test_replayed_decode_steps_take_their_ids_from_the_previous_step(tied_checkpoint, tokenizer_cache):
    """The graph path: inputs loaded into m10's static buffers, then the pending rows overwritten from step N's
    samples (here without capturing, the kernels in Triton's interpreter, as m10's own CPU test does)."""
    from milestones.m12_async_scheduling import EngineConfig, LLMEngine

    config = EngineConfig(model=str(tied_checkpoint[0]), device="cpu", max_num_seqs=4, block_size=4,
                          kv_cache_tokens=256, attention_backend="triton")
    engine = LLMEngine(config)
    engine.graph_runner = engine.build_graph_runner(capture=False)
    prompts, params = PROMPTS[:3], [greedy(n) for n in (5, 2, 4)]
    got = engine.generate(prompts, params, use_tqdm=False)
    assert engine.stats.graph_steps >= 3
    expected = make_engine(M11, tied_checkpoint[0], max_num_seqs=4, block_size=4, kv_cache_tokens=256)
    assert tokens(got) == tokens(expected.generate(prompts, params, use_tqdm=False))


def test_served_through_the_engine_core(tied_checkpoint, tokenizer_cache):
    """m12's engine in m11's core process, behind m09's server: streams equal offline ``generate``."""
    import asyncio

    from milestones.m12_async_scheduling import EngineConfig, LLMEngine

    config = EngineConfig(model=str(tied_checkpoint[0]), device="cpu", **KNOBS)
    prompts, lengths = PROMPTS, [1, 7, 3, 9, 2, 5]
    expected = LLMEngine(config).generate(prompts, [greedy(n) for n in lengths], use_tqdm=False)

    async def serve() -> list[list[int]]:
        client = LLMEngine.make_engine_client(config)
        client.start()
        try:
            streams = [await client.add_request(p, greedy(n)) for p, n in zip(prompts, lengths)]
            results = []
            for stream in streams:
                async for output in stream:
                    last = output
                results.append(list(last.token_ids))
            return results
        finally:
            await client.shutdown()

    assert asyncio.run(asyncio.wait_for(serve(), 120)) == tokens(expected)


# --------------------------------------------------------------------------- the fused kernels (Triton's interpreter)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_kernels_compute_what_the_unfused_layers_do(dtype):
    import torch.nn.functional as F

    from milestones.m01_naive_loop.model import RotaryEmbedding, apply_rope
    from milestones.m12_async_scheduling.fused_kernels import add_rms_norm, qk_norm_rope, silu_and_mul

    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    generator = torch.Generator().manual_seed(5)
    tokens, dim, heads, kv_heads, head_dim = 7, 96, 4, 2, 32

    def randn(*shape):
        return torch.randn(*shape, generator=generator).to(dtype)

    x, residual, weight = randn(tokens, dim), randn(tokens, dim), randn(dim)
    fused_residual = residual.clone()
    out = add_rms_norm(x, fused_residual, weight, 1e-6)
    expected_residual = residual + x
    # One rounding to the model's dtype, as torch's own addition (Triton's interpreter may round a bfloat16 the
    # other way at a tie: one unit in the last place)
    torch.testing.assert_close(fused_residual, expected_residual, atol=0, rtol=0 if dtype == torch.float32 else 2**-7)
    torch.testing.assert_close(out, F.rms_norm(expected_residual, (dim,), weight, 1e-6), atol=tolerance,
                               rtol=tolerance)

    qkv, norm_weight = randn(tokens, (heads + 2 * kv_heads) * head_dim), randn(heads + kv_heads, head_dim)
    rope = RotaryEmbedding(head_dim, 128, 1e6).to(dtype)
    positions = torch.tensor([0, 1, 5, 17, 64, 100, 127])
    q, k = qk_norm_rope(qkv, heads, kv_heads, head_dim, norm_weight, rope.cos, rope.signed_sin, positions, 1e-6)
    qk = qkv[:, :(heads + kv_heads) * head_dim].view(tokens, heads + kv_heads, head_dim)
    expected = apply_rope(F.rms_norm(qk, (head_dim,), eps=1e-6) * norm_weight, *rope.lookup(positions))
    torch.testing.assert_close(q, expected[:, :heads], atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(k, expected[:, heads:], atol=tolerance, rtol=tolerance)

    gate_up = randn(tokens, 2 * 80)
    torch.testing.assert_close(silu_and_mul(gate_up), F.silu(gate_up[:, :80]) * gate_up[:, 80:], atol=tolerance,
                               rtol=tolerance)


def test_the_fused_layers_give_transformers_tokens(tied_checkpoint, tokenizer_cache):
    """The decode graphs record the fused layers: run through the runner's buffers (not captured, on a CPU)."""
    from milestones.m12_async_scheduling import EngineConfig, LLMEngine
    from milestones.m12_async_scheduling.fused_layers import FusedQwen3Model
    from paged_helpers import reference

    engine = LLMEngine(EngineConfig(model=str(tied_checkpoint[0]), device="cpu", attention_backend="triton",
                                    **KNOBS))
    engine.graph_runner = engine.build_graph_runner(capture=False)
    assert isinstance(engine.graph_runner.model.model, FusedQwen3Model)
    assert not isinstance(engine.model.model, FusedQwen3Model)  # eager steps keep m10's layers
    outputs = engine.generate(PROMPTS[:3], [greedy(n) for n in (4, 6, 2)], use_tqdm=False)
    assert engine.stats.graph_steps > 0
    assert tokens(outputs) == [reference(tied_checkpoint[1], p, n) for p, n in zip(PROMPTS[:3], (4, 6, 2))]


def test_token_buckets_pad_little():
    from milestones.m12_async_scheduling.piecewise import token_buckets

    assert token_buckets(8192) == [16, 32, 64, 128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192]
    assert token_buckets(100) == [16, 32, 64, 100] and token_buckets(10) == [10]


@pytest.mark.parametrize("mode", ["full_and_piecewise", "full"])
def test_mixed_steps_replayed_in_pieces_give_transformers_tokens(tied_checkpoint, tokenizer_cache, mode):
    """Steps with prompt chunks run through the runner's buffers (not captured, on a CPU), padded to a bucket:
    ``full_and_piecewise``: attention between the pieces on the real rows only; ``full``: the whole pass over the
    static metadata, padding rows stored nowhere and unused tiles idle; under chunking, prefix hits and
    preemption."""
    from milestones.m12_async_scheduling import EngineConfig, LLMEngine
    from milestones.m12_async_scheduling.full_graphs import FullGraphRunner

    engine = LLMEngine(EngineConfig(model=str(tied_checkpoint[0]), device="cpu", attention_backend="triton",
                                    max_num_seqs=4, block_size=4, max_num_batched_tokens=10, kv_cache_tokens=56,
                                    cudagraph_mode=mode))
    engine.graph_runner = engine.build_graph_runner(capture=False)
    engine.piecewise = engine.build_piecewise_runner(capture=False)
    assert isinstance(engine.piecewise, FullGraphRunner) == (mode == "full")
    assert engine.piecewise.buckets == [10]
    outputs, _ = generate_exactly(engine, tied_checkpoint[1], CHATS, [12, 12, 10, 12])
    stats = engine.stats
    assert stats.piecewise_steps > 0 and stats.graph_steps > 0 and stats.eager_steps == 0
    assert stats.num_preemptions >= 1 and stats.prefix_cache_hit_tokens > 0


# --------------------------------------------------------------------------- one compiled kernel per kernel


def test_eager_and_replayed_steps_launch_every_kernel_with_one_signature(tied_checkpoint, tokenizer_cache,
                                                                         monkeypatch):
    """Triton compiles a kernel per signature (pointer dtypes and alignment, integers equal to 1 or divisible by
    16), and capturing compiles only those the graphs hold: an eager step that hands a kernel another one (int64
    lengths, a block-table width that is a multiple of 16, a tile list at an odd offset) compiles a new kernel in
    the middle of serving. So each kernel has one signature per variant (its constexprs: tests/kernel_signatures.py),
    launched from a decode graph, a mixed step's whole graph or pieces, or eagerly (decodes beyond the graphs'
    batch sizes; mixed steps with ``full_decode_only``)."""
    from milestones.m10_cuda_graphs.graph_runner import CUDAGraphRunner
    from milestones.m12_async_scheduling import EngineConfig, LLMEngine
    from milestones.m12_async_scheduling.full_graphs import FullGraphRunner
    from milestones.m12_async_scheduling.piecewise import PiecewiseGraphRunner

    launches = TritonLaunches(monkeypatch)
    launches.in_graphs(CUDAGraphRunner, "forward")  # a decode graph
    launches.in_graphs(PiecewiseGraphRunner, "piece")  # a piece (attention between pieces is launched eagerly)
    launches.in_graphs(FullGraphRunner, "forward")  # a mixed step's whole graph
    params = greedy(3)
    # 3 sequences, graphs for 2: eager decode steps too. The whole graphs' tile list holds 16 / 32 + 3 = 4 tiles
    # (its second row 16-byte aligned), an eager step's 1 to 3 (not): an alignment the kernel must not key on.
    # max_model_len 64: the decode graphs' context bound, short enough that they run direct, as eager steps do
    # (with 512 they split, a variant of its own by design, and no decode signature would be compared).
    for mode in ("full", "full_decode_only"):
        engine = LLMEngine(EngineConfig(model=str(tied_checkpoint[0]), device="cpu", attention_backend="triton",
                                        max_num_seqs=3, max_cuda_graph_batch_size=2, block_size=4,
                                        max_num_batched_tokens=16, kv_cache_tokens=256, max_model_len=64,
                                        cudagraph_mode=mode))
        engine.graph_runner = engine.build_graph_runner(capture=False)
        if mode == "full":
            engine.piecewise = engine.build_piecewise_runner(capture=False)
        for prompt in random_prompts(4, 3, 13, seed=8):  # each arrives while the ones before it decode
            engine.add_request(prompt, params)
            engine.step()
        drain(engine)
        assert engine.stats.graph_steps > 0 and (engine.stats.piecewise_steps if mode == "full"
                                                 else engine.stats.eager_steps) > 0

    assert not launches.differing()
    assert launches.in_both() >= {"_store_kv_kernel", "_paged_decode_kernel", "_paged_prefill_kernel"}
    assert set(launches.launched) >= {"_add_rms_norm_kernel", "_qk_norm_rope_kernel", "_silu_and_mul_kernel"}
