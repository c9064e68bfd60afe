"""m04: continuous batching and the step API give each request exactly its solo (and transformers') tokens."""

from __future__ import annotations

import pytest

from conftest import GREEDY_MAX_TOKENS, hf_greedy, mixed_length_prompts, random_prompts, recorded_model_inputs
from milestones.m01_naive_loop import SamplingParams

GREEDY = SamplingParams(max_tokens=GREEDY_MAX_TOKENS, ignore_eos=True)
M04 = "m04_continuous_batching"


@pytest.mark.parametrize("max_num_seqs", [1, 2, 5, 16])
def test_greedy_matches_transformers_for_any_batch(tiny_checkpoint, engine_factory, hf_reference, max_num_seqs):
    engine = engine_factory(M04, tiny_checkpoint[0], max_num_seqs=max_num_seqs, kv_cache_tokens=2048)
    outputs = engine.generate(mixed_length_prompts(), GREEDY, use_tqdm=False)
    assert [o.token_ids for o in outputs] == hf_reference


def test_mixed_lengths_match_transformers_m03_and_m02(tiny_checkpoint, engine_factory):
    directory, hf_model = tiny_checkpoint
    prompts = random_prompts(9, 1, 50, seed=7)
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (1, 14, 3, 20, 5, 12, 2, 9, 16)]
    m04 = engine_factory(M04, directory, max_num_seqs=3, kv_cache_tokens=2048).generate(prompts, params, use_tqdm=False)
    m03 = engine_factory("m03_static_batching", directory, max_num_seqs=3).generate(prompts, params, use_tqdm=False)
    m02 = engine_factory("m02_kv_cache", directory).generate(prompts, params, use_tqdm=False)
    for prompt, p, a, b, c in zip(prompts, params, m04, m03, m02):
        assert a.token_ids == b.token_ids == c.token_ids == hf_greedy(hf_model, prompt, p.max_tokens)


def test_requests_added_mid_decode(tiny_checkpoint, engine_factory):
    directory, hf_model = tiny_checkpoint
    engine = engine_factory(M04, directory, max_num_seqs=4, kv_cache_tokens=2048)
    prompts = random_prompts(5, 2, 40, seed=11)
    lengths = [15, 4, 10, 7, 12]
    ids = [engine.add_request(prompts[i], SamplingParams(max_tokens=lengths[i], ignore_eos=True)) for i in (0, 1)]
    tokens: dict[str, list[int]] = {}
    for _ in range(6):  # the first two are mid-decode when the others arrive
        for out in engine.step():
            tokens[out.request_id] = out.token_ids
    assert 0 < len(tokens[ids[0]]) < lengths[0]
    ids += [engine.add_request(prompts[i], SamplingParams(max_tokens=lengths[i], ignore_eos=True)) for i in (2, 3, 4)]
    finish = {}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id] = out.token_ids
            finish[out.request_id] = out.finish_reason
    for i, request_id in enumerate(ids):
        assert tokens[request_id] == hf_greedy(hf_model, prompts[i], lengths[i])
        assert finish.get(request_id, "length") == "length"
    assert engine.scheduler.allocator.reserved_slots == 0


def test_no_request_overtakes_the_head_of_the_queue(tiny_checkpoint, engine_factory):
    """FCFS under memory pressure: a small request that would fit waits behind a big head that does not."""
    directory, hf_model = tiny_checkpoint
    engine = engine_factory(M04, directory, max_num_seqs=4, kv_cache_tokens=64)
    prompts = random_prompts(3, 20, 20, seed=12)
    prompts[2] = prompts[2][:3]
    lengths = [20, 20, 3]  # K/V slots needed: 39, 39, 5; the pool holds 64, so the second waits for the first
    ids = [engine.add_request(p, SamplingParams(max_tokens=n, ignore_eos=True)) for p, n in zip(prompts, lengths)]
    first_step, tokens, step = {}, {}, 0
    while engine.has_unfinished():
        step += 1
        for out in engine.step():
            first_step.setdefault(out.request_id, step)
            tokens[out.request_id] = out.token_ids
    assert [first_step[i] for i in ids] == [1, 21, 21]  # the small one is admitted with the big one it queued behind
    for request_id, prompt, n in zip(ids, prompts, lengths):
        assert tokens[request_id] == hf_greedy(hf_model, prompt, n)


def test_every_token_gets_its_position_in_its_own_sequence(tiny_checkpoint, engine_factory):
    """Positions fed to the model: a padded prefill row starts at 0, a decode row continues from its own length.
    (Positions all shifted by one would give the same tokens: RoPE sees only distances.)"""
    engine = engine_factory(M04, tiny_checkpoint[0], max_num_seqs=4, kv_cache_tokens=2048)
    prompts = [random_prompts(1, n, n, seed=n)[0] for n in (5, 9, 1, 3)]
    for prompt, n in zip(prompts, (4, 2, 3, 1)):
        engine.add_request(prompt, SamplingParams(max_tokens=n, ignore_eos=True))
    checked_prefill_rows = checked_decode_rows = 0
    while engine.has_unfinished():
        with recorded_model_inputs(engine) as calls:
            outputs = engine.step()
        ((ids, positions),) = calls
        assert ids.shape[0] == len(outputs)  # one row per request the step touched, in the same order
        for row, out in enumerate(outputs):
            n = len(out.prompt_token_ids)
            if len(out.token_ids) == 1:  # this step prefilled it
                assert ids[row, ids.shape[1] - n:].tolist() == out.prompt_token_ids
                assert positions[row, ids.shape[1] - n:].tolist() == list(range(n))
                checked_prefill_rows += 1
            else:  # it fed its previous token, at the position right after everything before it
                assert ids[row].tolist() == [out.token_ids[-2]]
                assert positions[row].tolist() == [n + len(out.token_ids) - 2]
                checked_decode_rows += 1
    assert (checked_prefill_rows, checked_decode_rows) == (4, 3 + 1 + 2 + 0)


def test_step_outputs_carry_the_new_token(tiny_checkpoint, engine_factory):
    engine = engine_factory(M04, tiny_checkpoint[0], max_num_seqs=2, kv_cache_tokens=2048)
    request_id = engine.add_request([5, 6, 7], SamplingParams(max_tokens=3, ignore_eos=True))
    seen = []
    while engine.has_unfinished():
        (out,) = engine.step()
        assert out.request_id == request_id
        seen.append(list(out.token_ids))
    assert [len(s) for s in seen] == [1, 2, 3]
    assert seen[0] == seen[2][:1] and seen[1] == seen[2][:2]


def test_abort_frees_the_request(tiny_checkpoint, engine_factory):
    engine = engine_factory(M04, tiny_checkpoint[0], max_num_seqs=1, kv_cache_tokens=2048)
    running = engine.add_request([5] * 10, SamplingParams(max_tokens=30, ignore_eos=True))
    waiting = engine.add_request([6] * 10, SamplingParams(max_tokens=30, ignore_eos=True))
    engine.step()
    engine.step()
    allocator = engine.scheduler.allocator
    assert allocator.reserved_slots == 39  # running holds prompt + max_tokens - 1 slots; waiting holds none
    assert engine.abort(waiting) is True
    assert engine.abort(running) is True
    assert allocator.reserved_slots == 0 and allocator.largest_free_range == allocator.capacity
    assert not engine.has_unfinished()
    assert engine.abort(running) is False and engine.abort("no-such-id") is False
    # The engine keeps working after aborts.
    other = engine.add_request([7] * 4, SamplingParams(max_tokens=2, ignore_eos=True))
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    assert outs[-1].request_id == other and outs[-1].finish_reason == "length"


def test_small_pool_queues_requests_but_stays_exact(tiny_checkpoint, engine_factory, hf_reference):
    # Room for one or two requests at a time: admission waits for K/V, the answers do not change.
    engine = engine_factory(M04, tiny_checkpoint[0], max_num_seqs=8, kv_cache_tokens=80)
    outputs = engine.generate(mixed_length_prompts(), GREEDY, use_tqdm=False)
    assert [o.token_ids for o in outputs] == hf_reference
    assert engine.stats.kv_reserved_peak_bytes <= 80 * engine.kv_bytes_per_token
    assert engine.stats.kv_used_peak_bytes <= engine.stats.kv_reserved_peak_bytes


def test_request_larger_than_the_pool_is_rejected(tiny_checkpoint, engine_factory):
    engine = engine_factory(M04, tiny_checkpoint[0], max_num_seqs=2, kv_cache_tokens=32)
    with pytest.raises(ValueError, match="K/V slots"):
        engine.add_request([5] * 20, SamplingParams(max_tokens=20))
    with pytest.raises(ValueError, match="K/V slots"):
        engine.generate([[5] * 3, [5] * 20], SamplingParams(max_tokens=20), use_tqdm=False)
    assert not engine.has_unfinished()  # nothing was queued


@pytest.mark.parametrize("prompt, params, message", [
    ([5, True], None, r"^prompt: .*token 1 is bool True"),
    ({"ids": [5]}, None, r"^prompt: a prompt is a string or a list of token ids, got dict"),
    ([5, 6], {"max_tokens": 3}, r"^prompt: sampling params must be SamplingParams, got dict"),
])
def test_add_request_refuses_bad_input_and_queues_nothing(tiny_checkpoint, engine_factory, prompt, params, message):
    engine = engine_factory(M04, tiny_checkpoint[0], max_num_seqs=2, kv_cache_tokens=2048)
    with pytest.raises(ValueError, match=message):
        engine.add_request(prompt, params)
    assert not engine.has_unfinished()


def test_reserved_memory_exceeds_used_when_requests_stop_early(tiny_checkpoint, engine_factory):
    engine = engine_factory(M04, tiny_checkpoint[0], max_num_seqs=4, kv_cache_tokens=4096)
    prompt = random_prompts(1, 10, 10, seed=2)[0]
    first = engine.generate([prompt], SamplingParams(max_tokens=6, ignore_eos=True), use_tqdm=False)[0]
    stop = first.token_ids[2]  # stop at the third token although max_tokens allows 200
    engine.generate([prompt] * 4, SamplingParams(max_tokens=200, stop_token_ids=[stop]), use_tqdm=False)
    stats = engine.stats
    assert stats.kv_reserved_peak_bytes == 4 * (10 + 200 - 1) * engine.kv_bytes_per_token
    assert stats.kv_used_peak_bytes < stats.kv_reserved_peak_bytes / 10


def test_seeded_sampling_matches_m02(tiny_checkpoint, engine_factory):
    directory = tiny_checkpoint[0]
    prompts = random_prompts(4, 3, 30, seed=9)
    params = [SamplingParams(max_tokens=10, temperature=0.9, top_p=0.9, seed=100 + i, ignore_eos=True) for i in range(4)]
    m04 = engine_factory(M04, directory, max_num_seqs=3, kv_cache_tokens=2048).generate(prompts, params, use_tqdm=False)
    m02 = engine_factory("m02_kv_cache", directory).generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in m04] == [o.token_ids for o in m02]


def test_kv_cache_tokens_must_be_positive():
    from milestones.m04_continuous_batching import EngineConfig

    with pytest.raises(ValueError, match="kv_cache_tokens"):
        EngineConfig(kv_cache_tokens=0)


def test_unwritten_pool_memory_is_never_read(tiny_checkpoint, engine_factory):
    # A fresh pool holds whatever memory held before. Poison it: any read of a slot nobody wrote (even one
    # masked out of attention: 0 * NaN = NaN) turns the tokens into garbage. Equal prompt lengths mean no
    # padding is ever written; unequal output lengths make decode rows of different lengths.
    directory, hf_model = tiny_checkpoint
    engine = engine_factory(M04, directory, max_num_seqs=3, kv_cache_tokens=512)
    engine.kv_pool.k.fill_(float("nan"))
    engine.kv_pool.v.fill_(float("nan"))
    prompts = random_prompts(6, 10, 10, seed=4)
    lengths = [3, 14, 6, 11, 2, 9]
    outputs = engine.generate(prompts, [SamplingParams(max_tokens=n, ignore_eos=True) for n in lengths],
                              use_tqdm=False)
    for prompt, n, out in zip(prompts, lengths, outputs):
        assert out.token_ids == hf_greedy(hf_model, prompt, n)


def test_step_on_an_idle_engine_returns_nothing(tiny_checkpoint, engine_factory):
    engine = engine_factory(M04, tiny_checkpoint[0], max_num_seqs=2, kv_cache_tokens=2048)
    assert not engine.has_unfinished()
    assert engine.step() == []


def test_generate_refuses_to_swallow_pending_step_requests(tiny_checkpoint, engine_factory):
    engine = engine_factory(M04, tiny_checkpoint[0], max_num_seqs=2, kv_cache_tokens=2048)
    pending = engine.add_request([5, 6, 7], SamplingParams(max_tokens=4, ignore_eos=True))
    with pytest.raises(ValueError, match="idle engine"):
        engine.generate([[8, 9]], SamplingParams(max_tokens=2), use_tqdm=False)
    outs = []
    while engine.has_unfinished():  # the pending request is intact and still finishes normally
        outs += engine.step()
    assert outs[-1].request_id == pending and len(outs[-1].token_ids) == 4
