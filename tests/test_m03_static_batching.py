"""m03: a padded static batch gives every request exactly the tokens it gets alone (and from transformers)."""

from __future__ import annotations

import pytest
import torch

from conftest import GREEDY_MAX_TOKENS, hf_greedy, mixed_length_prompts, random_prompts, recorded_model_inputs
from milestones.m01_naive_loop import SamplingParams
from milestones.m03_static_batching.padded_batch import padded_causal_mask

GREEDY = SamplingParams(max_tokens=GREEDY_MAX_TOKENS, ignore_eos=True)


@pytest.mark.parametrize("batch_size", [1, 3, 9])
def test_greedy_matches_transformers_for_every_batch_size(tiny_checkpoint, engine_factory, hf_reference, batch_size):
    engine = engine_factory("m03_static_batching", tiny_checkpoint[0], max_num_seqs=batch_size)
    outputs = engine.generate(mixed_length_prompts(), GREEDY, use_tqdm=False)
    assert [o.token_ids for o in outputs] == hf_reference


def test_mixed_output_lengths_match_transformers_and_m02(tiny_checkpoint, engine_factory):
    directory, hf_model = tiny_checkpoint
    prompts = random_prompts(7, 1, 50, seed=3)
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (1, 9, 3, 17, 5, 12, 2)]
    m03 = engine_factory("m03_static_batching", directory, max_num_seqs=4).generate(prompts, params, use_tqdm=False)
    m02 = engine_factory("m02_kv_cache", directory).generate(prompts, params, use_tqdm=False)
    for prompt, p, a, b in zip(prompts, params, m03, m02):
        assert a.token_ids == b.token_ids == hf_greedy(hf_model, prompt, p.max_tokens)
        assert a.finish_reason == "length"


def test_every_token_gets_its_position_in_its_own_sequence(tiny_checkpoint, engine_factory):
    """Positions fed to the model, row by row: a padded row's prompt starts at 0, its decode steps continue from its
    own length. (A row whose positions are all off by one gives the same tokens: RoPE sees only distances.)"""
    engine = engine_factory("m03_static_batching", tiny_checkpoint[0], max_num_seqs=4)
    prompts = [random_prompts(1, n, n, seed=n)[0] for n in (5, 9, 1, 3)]  # row 1 is the longest: 4, 8, 6 pads
    lengths = [4, 2, 3, 1]
    with recorded_model_inputs(engine) as calls:
        outputs = engine.generate(prompts, [SamplingParams(max_tokens=n, ignore_eos=True) for n in lengths],
                                  use_tqdm=False)
    (ids, positions), decodes = calls[0], calls[1:]
    width = max(len(p) for p in prompts)
    assert ids.shape == (4, width)
    for row, prompt in enumerate(prompts):
        assert ids[row, width - len(prompt):].tolist() == prompt
        assert positions[row, width - len(prompt):].tolist() == list(range(len(prompt)))
    assert len(decodes) == max(lengths) - 1
    for step, (ids, positions) in enumerate(decodes, start=1):
        for row, (prompt, output) in enumerate(zip(prompts, outputs)):
            if step < lengths[row]:  # rows that already finished still run, but their tokens are never read
                assert ids[row].tolist() == [output.token_ids[step - 1]]
                assert positions[row].tolist() == [len(prompt) + step - 1]


def test_padding_and_finished_rows_are_counted_as_waste(tiny_checkpoint, engine_factory):
    engine = engine_factory("m03_static_batching", tiny_checkpoint[0], max_num_seqs=2)
    prompts = [[5] * 3, [6] * 7]  # row 0 gets 4 padding slots
    engine.generate(prompts, [SamplingParams(max_tokens=2, ignore_eos=True),
                              SamplingParams(max_tokens=6, ignore_eos=True)], use_tqdm=False)
    stats = engine.stats
    # prefill: 2 x 7 slots (4 of them padding); then 5 decode steps of 2 rows, row 0 finished after step 1.
    assert stats.steps == 6
    assert stats.tokens_computed == 14 + 5 * 2
    assert stats.padding_tokens == 4 + 4
    assert stats.useful_token_fraction == pytest.approx((24 - 8) / 24)
    assert stats.prompt_tokens_computed == 10


def test_padded_causal_mask():
    mask = padded_causal_mask(torch.tensor([2, 0]), 0, 4, 4)[:, 0]
    # row 0: slots 0, 1 are padding; a real query sees real keys up to itself; padding queries see themselves.
    assert mask[0].tolist() == [
        [True, False, False, False],
        [False, True, False, False],
        [False, False, True, False],
        [False, False, True, True],
    ]
    assert mask[1].tolist() == torch.ones(4, 4).tril().bool().tolist()
    decode = padded_causal_mask(torch.tensor([2, 0]), 4, 5, 5)[:, 0]
    assert decode.tolist() == [[[False, False, True, True, True]], [[True] * 5]]


def test_seeded_sampling_does_not_depend_on_batch_neighbours(tiny_checkpoint, engine_factory):
    engine = engine_factory("m03_static_batching", tiny_checkpoint[0], max_num_seqs=4)
    seeded = SamplingParams(max_tokens=8, temperature=1.0, top_k=50, seed=1234, ignore_eos=True)
    other = SamplingParams(max_tokens=8, temperature=0.8, ignore_eos=True)
    prompts = random_prompts(3, 4, 20, seed=5)
    alone = engine.generate([prompts[0]], seeded, use_tqdm=False)[0].token_ids
    crowded = engine.generate([prompts[1], prompts[0], prompts[2]], [other, seeded, other], use_tqdm=False)
    assert crowded[1].token_ids == alone


def test_max_num_seqs_must_be_positive():
    from milestones.m03_static_batching import EngineConfig

    with pytest.raises(ValueError, match="max_num_seqs"):
        EngineConfig(max_num_seqs=0)
