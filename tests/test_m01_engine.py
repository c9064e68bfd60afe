"""m01's engine end to end: greedy tokens equal transformers' ``generate``, stop conditions, string prompts,
output order, per-prompt params, timings and the work counters (CPU, tiny random checkpoints).
"""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import (EOS, GREEDY_MAX_TOKENS, PROMPT_LENGTHS, assert_reference_is_informative, hf_greedy,
                      mixed_length_prompts)

from milestones.m01_naive_loop import SamplingParams

GREEDY = SamplingParams(max_tokens=GREEDY_MAX_TOKENS, ignore_eos=True)


def test_prompt_lengths_cover_one_to_sixty():
    prompts = mixed_length_prompts()
    assert len(prompts) >= 8
    assert [len(p) for p in prompts] == list(PROMPT_LENGTHS)
    assert min(PROMPT_LENGTHS) == 1 and max(PROMPT_LENGTHS) >= 60


def test_greedy_matches_transformers(m01_engine, hf_reference):
    prompts = mixed_length_prompts()
    outputs = m01_engine.generate(prompts, GREEDY, use_tqdm=False)
    assert len(outputs) == len(prompts)
    for prompt, output, expected in zip(prompts, outputs, hf_reference):
        assert output.prompt_token_ids == prompt
        assert output.prompt is None
        assert output.token_ids == expected, f"prompt of {len(prompt)} tokens"
        assert output.finish_reason == "length"
        assert output.text == m01_engine.tokenizer.decode(expected, skip_special_tokens=True)


def test_reference_is_informative(tiny_checkpoint, hf_reference):
    """The fixture already refused a degenerate reference; here, in plain sight, what it guarantees."""
    prompts = mixed_length_prompts()
    assert len({tuple(tokens) for tokens in hf_reference}) == len(hf_reference)
    assert len({t for tokens in hf_reference for t in tokens}) > 40
    assert all(tokens.count(prompt[-1]) <= 1 for prompt, tokens in zip(prompts, hf_reference))


def test_degenerate_references_are_refused():
    """The guard can fail: what transformers' std-0.02 init gave the tied model (the last prompt token forever)."""
    prompts = mixed_length_prompts()
    repeats_last = [[p[-1]] * GREEDY_MAX_TOKENS for p in prompts]
    one_token = [[7, 8] + [9] * (GREEDY_MAX_TOKENS - 2) for _ in prompts]
    varied = [[(7 * i + 3 * j) % 500 + 4 for j in range(GREEDY_MAX_TOKENS)] for i in range(len(prompts))]
    for outputs in (repeats_last, one_token, [varied[0]] + varied[:-1]):
        with pytest.raises(AssertionError, match="degenerate"):
            assert_reference_is_informative(prompts, outputs, gaps=[1.0])
    with pytest.raises(AssertionError, match="near-tie"):
        assert_reference_is_informative(prompts, varied, gaps=[1.0, 1e-6])
    assert_reference_is_informative(prompts, varied, gaps=[1.0])  # and a varied one passes


def test_greedy_matches_transformers_second_tied_model(wide_tied_checkpoint, wide_tied_reference, engine_factory):
    outputs = engine_factory("m01_naive_loop", wide_tied_checkpoint[0]).generate(
        mixed_length_prompts(), GREEDY, use_tqdm=False)
    assert [o.token_ids for o in outputs] == wide_tied_reference


def test_outputs_follow_prompt_order(m01_engine, hf_reference):
    prompts = mixed_length_prompts()[::-1]
    outputs = m01_engine.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.prompt_token_ids for o in outputs] == prompts
    assert [o.token_ids for o in outputs] == hf_reference[::-1]
    assert len({o.request_id for o in outputs}) == len(prompts)


def test_one_sampling_params_per_prompt(m01_engine, hf_reference):
    prompts = mixed_length_prompts()
    lengths = [1 + (3 * i) % GREEDY_MAX_TOKENS for i in range(len(prompts))]
    assert len(set(lengths)) > 3
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in lengths]
    outputs = m01_engine.generate(prompts, params, use_tqdm=False)
    for output, n, expected in zip(outputs, lengths, hf_reference):
        assert output.token_ids == expected[:n]  # greedy: a shorter run is a prefix of the longer one
        assert output.finish_reason == "length"


def test_stop_token_ends_request_with_token_included(m01_engine):
    prompt = mixed_length_prompts()[4]
    full = m01_engine.generate([prompt], GREEDY, use_tqdm=False)[0].token_ids
    stop = full[GREEDY_MAX_TOKENS - 4]
    end = next(i for i, t in enumerate(full) if t in (stop, EOS)) + 1  # EOS is not ignored below
    assert end < GREEDY_MAX_TOKENS, "the stop must come before max_tokens for this test to mean anything"
    params = SamplingParams(max_tokens=GREEDY_MAX_TOKENS, stop_token_ids=[stop])
    output = m01_engine.generate([prompt], params, use_tqdm=False)[0]
    assert output.token_ids == full[:end]
    assert output.token_ids[-1] in (stop, EOS)
    assert output.finish_reason == "stop"
    assert len(output.metrics.token_times) == end


@pytest.mark.parametrize("source", ["config", "generation_config"])
def test_eos_from_checkpoint_stops_unless_ignored(source, tiny_checkpoint, engine_factory, tmp_path):
    """Make a token the model does emit the checkpoint's EOS; generation stops there (unless ignore_eos)."""
    directory, model = tiny_checkpoint
    prompt = mixed_length_prompts()[6]
    full = hf_greedy(model, prompt, GREEDY_MAX_TOKENS)
    eos = full[5]
    end = full.index(eos) + 1
    assert end < GREEDY_MAX_TOKENS and EOS not in full[:end]
    checkpoint = tmp_path / "ckpt"
    shutil.copytree(directory, checkpoint)
    if source == "config":
        edits = {"config.json": eos, "generation_config.json": eos}
    else:  # config.json keeps EOS; the generation config lists a second one (Qwen3 does this)
        edits = {"generation_config.json": [EOS, eos]}
    for name, value in edits.items():
        data = json.loads((checkpoint / name).read_text())
        data["eos_token_id"] = value
        (checkpoint / name).write_text(json.dumps(data))
    engine = engine_factory("m01_naive_loop", checkpoint)
    assert eos in engine.eos_token_ids
    stopped = engine.generate([prompt], SamplingParams(max_tokens=GREEDY_MAX_TOKENS), use_tqdm=False)[0]
    assert stopped.token_ids == full[:end]
    assert stopped.finish_reason == "stop"
    ignored = engine.generate([prompt], GREEDY, use_tqdm=False)[0]
    assert ignored.token_ids == full
    assert ignored.finish_reason == "length"


def test_string_prompts_go_through_the_tokenizer(m01_engine, tiny_checkpoint):
    _, model = tiny_checkpoint
    texts = ["a b c", "x", "1 2 3"]
    encoded = [m01_engine.tokenizer.encode(t, add_special_tokens=False) for t in texts]
    assert all(ids and max(ids) < model.config.vocab_size for ids in encoded)  # the tiny model's vocab is 512
    assert [len(ids) for ids in encoded] == [3, 1, 5]
    outputs = m01_engine.generate(texts, SamplingParams(max_tokens=6, ignore_eos=True), use_tqdm=False)
    for text, ids, output in zip(texts, encoded, outputs):
        assert output.prompt == text
        assert output.prompt_token_ids == ids
        assert output.token_ids == hf_greedy(model, ids, 6)
        assert output.text == m01_engine.tokenizer.decode(output.token_ids, skip_special_tokens=True)


def test_single_string_prompt_is_one_request(m01_engine):
    outputs = m01_engine.generate("a b c", SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)
    assert len(outputs) == 1 and outputs[0].prompt == "a b c" and len(outputs[0].token_ids) == 2


def test_timings(m01_engine):
    prompts = mixed_length_prompts()[:4]
    outputs = m01_engine.generate(prompts, GREEDY, use_tqdm=False)
    previous_finish = None
    for output in outputs:
        m = output.metrics
        assert len(m.token_times) == len(output.token_ids) == GREEDY_MAX_TOKENS
        assert m.first_token_time == m.token_times[0]
        assert m.arrival_time <= m.first_token_time
        assert all(a <= b for a, b in zip(m.token_times, m.token_times[1:]))
        assert m.finish_time == m.token_times[-1]
        assert m.ttft is not None and m.ttft >= 0
        assert m.ttft == pytest.approx(m.first_token_time - m.arrival_time)
        assert len(m.inter_token_latencies) == GREEDY_MAX_TOKENS - 1
        assert all(gap >= 0 for gap in m.inter_token_latencies)
        # m01 runs requests one after another: each one starts producing after the previous one finished.
        if previous_finish is not None:
            assert m.first_token_time >= previous_finish
        previous_finish = m.finish_time
    # Every request arrived (was validated) before any work started.
    assert max(o.metrics.arrival_time for o in outputs) <= min(o.metrics.first_token_time for o in outputs)


def test_stats_count_recomputed_tokens(m01_engine):
    prompts = mixed_length_prompts()[:5]
    lengths = [3, 1, 7, 4, 2]
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in lengths]
    m01_engine.generate(mixed_length_prompts()[5:], GREEDY, use_tqdm=False)  # stats must be reset by the next call
    m01_engine.generate(prompts, params, use_tqdm=False)
    stats = m01_engine.stats
    # Step i of a request runs the whole sequence: its P prompt tokens and the i tokens generated so far.
    assert stats.steps == sum(lengths)
    assert stats.tokens_computed == sum(len(p) + i for p, n in zip(prompts, lengths) for i in range(n))
    assert stats.prompt_tokens_computed == sum(len(p) * n for p, n in zip(prompts, lengths))
    assert stats.padding_tokens == 0
    assert stats.useful_token_fraction == 1.0
    assert stats.kv_reserved_peak_bytes == stats.kv_used_peak_bytes == 0
