"""m07: prompts split into chunks that share each step's token budget with the running decodes give exactly
m06's (and transformers') greedy tokens; no step exceeds the budget; decoders get a token every step."""

from __future__ import annotations

import pytest

from conftest import random_prompts
from milestones.m01_naive_loop import SamplingParams
from paged_helpers import (CHATS, StepRecorder, assert_blocks_all_free, generate_exactly, greedy, make_engine, poison,
                           reference)

M07 = "m07_chunked_prefill"
PROMPTS = random_prompts(4, 40, 40, seed=41)  # 40 tokens each; cut to the lengths a test needs


@pytest.fixture
def engine_on(tied_checkpoint, tokenizer_cache):
    """``engine_on(milestone, **config)``: a fresh engine on the tied checkpoint."""
    return lambda milestone=M07, **config: make_engine(milestone, tied_checkpoint[0], **config)


def test_prompts_shorter_than_equal_to_and_longer_than_the_budget(engine_on, tied_checkpoint):
    prompts = [PROMPTS[0][:17], PROMPTS[1][:16], PROMPTS[2][:15], PROMPTS[3]]
    engine = engine_on(max_num_seqs=4, block_size=4, max_num_batched_tokens=16, kv_cache_tokens=256)
    poison(engine)
    with StepRecorder(engine) as recorder:
        outputs = engine.generate(prompts, greedy(5), use_tqdm=False)
    m06 = engine_on("m06_prefix_cache", max_num_seqs=4, block_size=4, kv_cache_tokens=256).generate(
        prompts, greedy(5), use_tqdm=False)
    for prompt, out, whole in zip(prompts, outputs, m06):
        assert out.token_ids == whole.token_ids == reference(tied_checkpoint[1], prompt, 5)
    recorder.assert_fed_as_scheduled({o.request_id: o.prompt_token_ids + o.token_ids for o in outputs})
    assert max(step.num_batched_tokens for step in recorder.steps) == 16
    # The first prompt (17 tokens) takes the whole first step and finishes with one token in the second,
    # where the 16-token one gets the rest of the budget.
    first_id = recorder.steps[0].scheduled[0][0]
    assert recorder.steps[0].scheduled == [(first_id, 0, 16)]
    assert recorder.steps[1].scheduled[0] == (first_id, 16, 1) and recorder.steps[1].num_batched_tokens == 16
    assert engine.stats.tokens_computed == sum(len(p) + 5 - 1 for p in prompts)  # chunking recomputes nothing
    assert_blocks_all_free(engine)


@pytest.mark.parametrize("length, budget, chunks", [(15, 16, [15]), (16, 16, [16]), (17, 16, [16, 1]),
                                                    (10, 3, [3, 3, 3, 1])])
def test_one_prompt_is_fed_in_chunks_of_the_budget(engine_on, tied_checkpoint, length, budget, chunks):
    engine = engine_on(max_num_seqs=2, block_size=4, max_num_batched_tokens=budget, kv_cache_tokens=64)
    prompt = PROMPTS[0][:length]
    with StepRecorder(engine) as recorder:
        (out,) = engine.generate([prompt], greedy(3), use_tqdm=False)
    fed = [step.scheduled[0][2] for step in recorder.steps]
    assert fed == chunks + [1, 1]  # the prompt's chunks, then two decodes (the third token is never fed)
    starts = [step.scheduled[0][1] for step in recorder.steps]
    assert starts[:len(chunks)] == [sum(chunks[:i]) for i in range(len(chunks))]
    assert out.token_ids == reference(tied_checkpoint[1], prompt, 3)


def test_a_budget_of_one_token_still_finishes_everything_exactly(engine_on, tied_checkpoint):
    # One token a step holds one running request (the config refuses a budget below max_num_seqs).
    prompts = [PROMPTS[0][:5], PROMPTS[1][:9], PROMPTS[2][:2]]
    engine = engine_on(max_num_seqs=1, block_size=4, max_num_batched_tokens=1, kv_cache_tokens=128)
    with StepRecorder(engine) as recorder:
        outputs = engine.generate(prompts, greedy(3), use_tqdm=False)
    for prompt, out in zip(prompts, outputs):
        assert out.token_ids == reference(tied_checkpoint[1], prompt, 3)
    assert all(step.num_batched_tokens == 1 for step in recorder.steps)
    assert engine.stats.steps == sum(len(p) + 3 - 1 for p in prompts)  # one position per step, none wasted


def test_decoders_get_a_token_every_step_while_a_long_prompt_is_chunked(engine_on, tied_checkpoint):
    engine = engine_on(max_num_seqs=4, block_size=4, max_num_batched_tokens=8, kv_cache_tokens=256)
    poison(engine)
    decoders = [engine.add_request(PROMPTS[i][:3], greedy(24)) for i in range(3)]
    tokens: dict[str, list[int]] = {}
    while len(tokens) < 3:  # until all three are decoding
        for out in engine.step():
            tokens[out.request_id] = out.token_ids
    long = engine.add_request(PROMPTS[3], greedy(4))
    with StepRecorder(engine) as recorder:
        chunked_steps = 0
        while long not in tokens:
            outs = engine.step()
            seen = {out.request_id for out in outs}
            assert set(decoders) <= seen, "a decoder missed a step while the prompt was chunked"
            for out in outs:
                tokens[out.request_id] = out.token_ids
            chunked_steps += 1
        while engine.has_unfinished():
            for out in engine.step():
                tokens[out.request_id] = out.token_ids
    # 3 decode tokens + 5 prompt tokens per step: 40 tokens take 8 steps, and the chunks end inside blocks.
    assert chunked_steps == 8
    starts = [start for step in recorder.steps for rid, start, n in step.scheduled if rid == long and n > 1]
    assert starts[:3] == [0, 5, 10] and any(start % 4 for start in starts)
    assert max(step.num_batched_tokens for step in recorder.steps) <= 8
    for i, request_id in enumerate(decoders):
        assert tokens[request_id] == reference(tied_checkpoint[1], PROMPTS[i][:3], 24)
    assert tokens[long] == reference(tied_checkpoint[1], PROMPTS[3], 4)
    assert_blocks_all_free(engine)


def test_aborting_a_prompt_mid_chunk_frees_its_blocks_and_keeps_what_it_computed_findable(engine_on, tied_checkpoint):
    engine = engine_on(max_num_seqs=2, block_size=4, max_num_batched_tokens=8, kv_cache_tokens=128)
    request_id = engine.add_request(PROMPTS[3], greedy(4))  # 40 tokens: 5 chunks of 8
    for _ in range(3):
        assert engine.step() == []  # no token until the last chunk
    assert engine.abort(request_id) is True
    assert_blocks_all_free(engine)
    assert engine.block_manager.num_cached_free_blocks == 6  # the 24 computed tokens stay findable
    with StepRecorder(engine) as recorder:
        (out,) = engine.generate([PROMPTS[3]], greedy(4), use_tqdm=False)
    assert out.num_cached_tokens == 24 and recorder.steps[0].scheduled[0][1:] == (24, 8)
    assert out.token_ids == reference(tied_checkpoint[1], PROMPTS[3], 4)


def test_chunking_prefix_hits_and_preemption_together(engine_on, tied_checkpoint):
    budget = 10
    engine = engine_on(max_num_seqs=4, block_size=4, max_num_batched_tokens=budget, kv_cache_tokens=56)
    outputs, recorder = generate_exactly(engine, tied_checkpoint[1], CHATS, 12)
    stats = engine.stats
    assert stats.num_preemptions >= 1 and stats.prefix_cache_hit_tokens >= 24
    assert any(0 < start % 4 for step in recorder.steps for _, start, n in step.scheduled if n > 1)
    assert all(step.num_batched_tokens <= budget for step in recorder.steps)
    assert any(len(step.scheduled) > 1 and any(n > 1 for *_, n in step.scheduled) for step in recorder.steps), \
        "no step mixed a prompt chunk with other work"
    assert_blocks_all_free(engine)


def test_an_unlimited_budget_is_m06_step_for_step(engine_on):
    prompts = [PROMPTS[0][:30], PROMPTS[1][:7], PROMPTS[2]]
    knobs = dict(max_num_seqs=4, block_size=4, kv_cache_tokens=256)
    unlimited = engine_on(max_num_batched_tokens=None, **knobs)
    m06 = engine_on("m06_prefix_cache", **knobs)
    params = [greedy(n) for n in (6, 9, 3)]
    a = unlimited.generate(prompts, params, use_tqdm=False)
    b = m06.generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    for name in ("steps", "tokens_computed", "running_per_step", "blocks_used_per_step"):
        assert getattr(unlimited.stats, name) == getattr(m06.stats, name), name


def test_unlimited_budget_config():
    from milestones.m07_chunked_prefill import EngineConfig
    from milestones.m07_chunked_prefill.config import UNLIMITED_TOKENS

    assert EngineConfig(max_num_batched_tokens=None).max_num_batched_tokens == UNLIMITED_TOKENS
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        EngineConfig(max_num_batched_tokens=0)


def test_a_budget_below_max_num_seqs_is_refused_as_vllm_does():
    # Decodes are served first, one token each, until the budget is spent: with fewer tokens than running
    # requests some decoders would get nothing for whole steps, so "no decoder waits more than one step" needs
    # max_num_batched_tokens >= max_num_seqs. vLLM's SchedulerConfig refuses the same.
    from milestones.m07_chunked_prefill import EngineConfig
    from milestones.m07_chunked_prefill.config import UNLIMITED_TOKENS

    with pytest.raises(ValueError, match=r"^max_num_batched_tokens \(4\) must be at least max_num_seqs \(8\)"):
        EngineConfig(max_num_batched_tokens=4, max_num_seqs=8)
    assert EngineConfig(max_num_batched_tokens=8, max_num_seqs=8).max_num_batched_tokens == 8
    assert EngineConfig(max_num_batched_tokens=None, max_num_seqs=8).max_num_batched_tokens == UNLIMITED_TOKENS


def test_the_demo_refuses_a_budget_below_its_running_requests_in_one_line(tied_checkpoint, tokenizer_cache, capsys):
    from milestones.m07_chunked_prefill.__main__ import main

    with pytest.raises(SystemExit) as exited:  # 2 decoders + 1 long prompt run at once: a budget of 2 is too small
        main(["--model", str(tied_checkpoint[0]), "--device", "cpu", "--num-decoders", "2", "--num-long", "1",
              "--budgets", "2"])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "Traceback" not in err
    (line,) = [line for line in err.splitlines() if "error:" in line]
    assert "max_num_batched_tokens (2) must be at least max_num_seqs (3)" in line


def test_demo_sweeps_budgets_with_identical_tokens(tied_checkpoint, tokenizer_cache, capsys):
    from milestones.m07_chunked_prefill.__main__ import main

    rows = main(["--model", str(tied_checkpoint[0]), "--device", "cpu", "--num-decoders", "2", "--decoder-tokens",
                 "8", "--num-long", "1", "--long-len", "40", "--every", "2", "--budgets", "16,6"])
    out = capsys.readouterr().out
    assert "decoder ITL max (ms)" in out and "lower decoder ITL max (ms) than m06" in out
    assert "identical tokens (greedy): yes" in out
    assert [row["label"] for row in rows] == ["m06 (whole prompts)", "m07 budget 16", "m07 budget 6"]
    # Counts, not timings: a smaller budget spreads the same work over more steps.
    steps = [row["steps"] for row in rows]
    assert steps[0] < steps[1] < steps[2]


def test_seeded_sampling_matches_m02_under_chunking_hits_and_preemption(engine_on):
    # Each request draws from its own generator, so recomputing after a preemption, or sampling only at the end
    # of the last chunk, must not change what it samples.
    params = [SamplingParams(max_tokens=10, temperature=0.9, top_p=0.9, seed=200 + i, ignore_eos=True)
              for i in range(len(CHATS))]
    engine = engine_on(max_num_seqs=4, block_size=4, max_num_batched_tokens=10, kv_cache_tokens=52)
    sampled = engine.generate(CHATS, params, use_tqdm=False)
    solo = engine_on("m02_kv_cache").generate(CHATS, params, use_tqdm=False)
    assert [o.token_ids for o in sampled] == [o.token_ids for o in solo]
    assert engine.stats.num_preemptions >= 1 and engine.stats.prefix_cache_hit_tokens > 0
