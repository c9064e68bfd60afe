"""m01's sampler: ``filtered_probs`` against a brute-force reference, draws stay in the kept set and follow
its distribution, temperature -> 0 is greedy, and seeds make draws reproducible whatever shares the batch.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import GREEDY_MAX_TOKENS, hf_greedy, mixed_length_prompts

from milestones.m01_naive_loop import SamplingParams
from milestones.m01_naive_loop.request import Request
from milestones.m01_naive_loop.sampler import Sampler, filtered_probs

V = 40


def distinct_logits(seed: int, vocab: int = V, scale: float = 3.0) -> torch.Tensor:
    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(seed)) * scale
    assert len(set(logits.tolist())) == vocab  # no ties: top-k and top-p are unambiguous
    return logits


def reference_probs(logits: list[float], temperature: float, top_k: int, top_p: float) -> list[float]:
    """Brute force in float64: scale, keep the k best, renormalise, keep the smallest nucleus >= top_p."""
    scaled = [x / temperature for x in logits]
    ranked = sorted(range(len(scaled)), key=lambda i: scaled[i], reverse=True)
    kept = ranked[:top_k] if top_k > 0 else ranked

    def softmax(indices):
        m = max(scaled[i] for i in indices)
        e = {i: math.exp(scaled[i] - m) for i in indices}
        total = sum(e.values())
        return {i: e[i] / total for i in indices}

    probs = softmax(kept)
    if top_p < 1.0:
        nucleus, mass = [], 0.0
        for i in kept:  # already best first
            nucleus.append(i)
            mass += probs[i]
            if mass >= top_p:
                break
        probs = softmax(nucleus)
    return [probs.get(i, 0.0) for i in range(len(scaled))]


SETTINGS = [  # (temperature, top_k, top_p)
    (1.0, -1, 1.0),
    (0.7, -1, 1.0),
    (2.5, 0, 1.0),
    (1.0, 5, 1.0),
    (1.0, 1, 1.0),
    (0.5, V, 1.0),
    (1.0, V + 10, 1.0),
    (1.0, -1, 0.9),
    (1.0, -1, 0.5),
    (1.0, -1, 0.01),
    (3.0, -1, 0.75),
    (0.8, 10, 0.8),
    (2.0, 3, 0.95),
    (1.3, 25, 0.3),
]


@pytest.mark.parametrize("temperature,top_k,top_p", SETTINGS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_filtered_probs_match_brute_force(temperature, top_k, top_p, seed):
    logits = distinct_logits(seed)
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    ours = filtered_probs(logits, params)
    expected = torch.tensor(reference_probs(logits.tolist(), temperature, top_k, top_p), dtype=torch.float32)
    assert ours.dtype == torch.float32 and ours.shape == (V,)
    assert torch.equal(ours > 0, expected > 0), "kept sets differ"
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-6)
    assert ours.sum().item() == pytest.approx(1.0, abs=1e-5)


def test_filters_actually_filter():
    """The settings above are not vacuous: the kept-set sizes are what the filters ask for."""
    logits = distinct_logits(0)
    kept = lambda **kw: int((filtered_probs(logits, SamplingParams(temperature=1.0, **kw)) > 0).sum())  # noqa: E731
    assert kept() == V
    assert kept(top_k=5) == 5 and kept(top_k=1) == 1
    assert 1 < kept(top_p=0.5) < kept(top_p=0.9) < V
    assert kept(top_p=0.01) == 1


def test_top_k_keeps_ties_with_the_kth():
    logits = torch.tensor([3.0, 2.0, 2.0, 1.0, 0.0])
    probs = filtered_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert (probs > 0).tolist() == [True, True, True, False, False]


def test_filtered_probs_accepts_half_precision_logits():
    logits = distinct_logits(3).to(torch.bfloat16)
    probs = filtered_probs(logits, SamplingParams(temperature=1.0, top_k=7))
    assert probs.dtype == torch.float32 and int((probs > 0).sum()) == 7


# --------------------------------------------------------------------------- the Sampler itself


def make_request(name: str, params: SamplingParams) -> Request:
    return Request(name, [1, 2, 3], params, eos_token_ids=frozenset())


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 4, 1.0), (1.0, -1, 0.6), (2.0, 8, 0.7), (5.0, 2, 1.0)])
def test_samples_stay_in_the_kept_set(temperature, top_k, top_p):
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=11)
    sampler = Sampler(seed=0)
    seen = set()
    for step in range(300):
        logits = distinct_logits(step % 5)
        kept = set(torch.nonzero(filtered_probs(logits, params)).flatten().tolist())
        rows = torch.stack([logits, logits.flip(0)])
        requests = [make_request("a", params), make_request("b", params)]
        tokens = sampler(rows, requests)
        assert tokens[0] in kept
        assert tokens[1] in {V - 1 - i for i in kept}
        seen.add((step % 5, tokens[0]))
    assert len(seen) > 5  # more than one token for some logits: it did sample, not take the argmax


def test_greedy_rows_take_the_argmax():
    logits = torch.stack([distinct_logits(s) for s in range(4)])
    requests = [make_request(str(i), SamplingParams(temperature=t)) for i, t in enumerate([0.0, 1e-6, 0.0, 9e-6])]
    assert Sampler(seed=5)(logits, requests) == logits.argmax(-1).tolist()


def test_tiny_temperature_is_argmax_through_the_sampling_path():
    """1e-4 is above the greedy cutoff (1e-5), so it is sampled; with logit gaps >> 1e-4 that is the argmax."""
    rows = torch.stack([distinct_logits(s) for s in range(6)])
    gaps = rows.sort(-1, descending=True).values
    assert ((gaps[:, 0] - gaps[:, 1]) > 0.01).all()
    params = SamplingParams(temperature=1e-4)
    assert not params.greedy
    requests = [make_request(str(i), params) for i in range(6)]
    assert Sampler(seed=1)(rows, requests) == rows.argmax(-1).tolist()


def run_steps(sampler: Sampler, schedule: list[list[tuple[Request, str]]]) -> dict[str, list[int]]:
    """Each step of ``schedule`` is a batch of (request, logits key); logits depend only on (key, step)."""
    tokens: dict[str, list[int]] = {}
    for step, batch in enumerate(schedule):
        rows = torch.stack([distinct_logits(1000 * step + sum(map(ord, key)), scale=0.5) for _, key in batch])
        for (request, key), token in zip(batch, sampler(rows, [r for r, _ in batch])):
            tokens.setdefault(key, []).append(token)
    return tokens


def test_seeded_row_is_independent_of_batch_position_and_company():
    seeded = SamplingParams(temperature=1.0, seed=1234)
    other_seeded = SamplingParams(temperature=1.0, top_k=10, seed=99)
    unseeded = SamplingParams(temperature=0.9)
    greedy = SamplingParams()
    steps = 8

    alone = run_steps(Sampler(seed=0), [[(make_request("x", seeded), "x")]] * steps)["x"]

    x, y, u, g = (make_request(n, p) for n, p in [("x2", seeded), ("y", other_seeded), ("u", unseeded), ("g", greedy)])
    crowd = [(u, "u"), (y, "y"), (g, "g"), (x, "x")]
    rotated = [crowd[i % 4:] + crowd[:i % 4] for i in range(steps)]  # x sits at every position over the run
    together = run_steps(Sampler(seed=42), rotated)

    y_alone = run_steps(Sampler(seed=7), [[(make_request("y2", other_seeded), "y")]] * steps)["y"]
    assert together["x"] == alone
    assert together["y"] == y_alone
    assert len(set(alone)) > 3  # flat-ish logits: genuinely random draws


def test_unseeded_rows_use_the_engine_seed():
    params = SamplingParams(temperature=1.0)
    schedule = lambda: [[(make_request("a", params), "k"), (make_request("b", params), "k2")]] * 6  # noqa: E731
    first, again, other = run_steps(Sampler(seed=3), schedule()), run_steps(Sampler(seed=3), schedule()), \
        run_steps(Sampler(seed=4), schedule())
    assert first == again
    assert first != other


def test_release_forgets_the_generator():
    sampler = Sampler()
    request = make_request("r", SamplingParams(temperature=1.0, seed=5))
    sampler(distinct_logits(0)[None], [request])
    sampler.release(request)
    assert sampler(distinct_logits(0)[None], [request]) == Sampler()(distinct_logits(0)[None], [request])


def test_empirical_frequencies_follow_filtered_probs():
    # Top three tokens at 0.6 / 0.3 / 0.1 after top-k renormalisation, the rest far from zero before it.
    # (A wrong race such as argmax(probs * E) gives about 0.63 / 0.31 / 0.06: chi2 ~ 70 at 4000 draws.)
    logits = torch.tensor([math.log(6), math.log(3), math.log(1)] + [-0.5 - 0.01 * i for i in range(V - 3)])
    logits = logits[torch.randperm(V, generator=torch.Generator().manual_seed(0))]
    params = SamplingParams(temperature=1.0, top_k=3, seed=2024)
    probs = filtered_probs(logits, params)
    top3 = torch.nonzero(probs).flatten().tolist()
    assert len(top3) == 3
    torch.testing.assert_close(sorted(probs[top3].tolist()), [0.1, 0.3, 0.6])

    draws = 4000
    sampler, request = Sampler(), make_request("freq", params)
    counts = torch.zeros(V)
    batch = logits[None]
    for _ in range(draws):
        counts[sampler(batch, [request])[0]] += 1
    assert counts.sum() == draws and set(torch.nonzero(counts).flatten().tolist()) == set(top3)
    expected = probs[top3] * draws
    chi2 = (((counts[top3] - expected) ** 2) / expected).sum().item()
    assert chi2 < 13.8  # chi-square with 2 degrees of freedom, p = 0.001


# --------------------------------------------------------------------------- through the engine


@pytest.fixture(scope="module")
def engine(tied_checkpoint, engine_factory):
    return engine_factory("m01_naive_loop", tied_checkpoint[0])


@pytest.mark.parametrize("temperature", [0.0, 1e-6])
def test_zero_temperature_is_greedy(engine, tied_checkpoint, temperature):
    prompts = mixed_length_prompts()[:4]
    params = SamplingParams(max_tokens=GREEDY_MAX_TOKENS, temperature=temperature, ignore_eos=True, seed=3)
    outputs = engine.generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in outputs] == [hf_greedy(tied_checkpoint[1], p, GREEDY_MAX_TOKENS) for p in prompts]


def sampled(seed, max_tokens=8, **kw):
    return SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed, ignore_eos=True, **kw)


def test_same_seed_same_tokens_across_calls(engine):
    prompt = mixed_length_prompts()[3]
    first = engine.generate([prompt], sampled(1234), use_tqdm=False)[0].token_ids
    second = engine.generate([prompt], sampled(1234), use_tqdm=False)[0].token_ids
    assert first == second
    assert len(set(first)) > 3  # the tiny model's distribution is flat-ish: these are real samples


def test_seeded_request_ignores_other_requests(engine):
    prompts = mixed_length_prompts()
    target = prompts[3]
    alone = engine.generate([target], sampled(1234), use_tqdm=False)[0].token_ids
    crowd = engine.generate(
        [prompts[0], target, prompts[5], prompts[1]],
        [sampled(None), sampled(1234), sampled(77), SamplingParams(max_tokens=3)],
        use_tqdm=False,
    )
    assert crowd[1].token_ids == alone
    reordered = engine.generate([prompts[5], prompts[0], target], [sampled(77), sampled(None), sampled(1234)],
                                use_tqdm=False)
    assert reordered[2].token_ids == alone
    assert reordered[0].token_ids == crowd[2].token_ids  # the other seeded one too


def test_different_seeds_give_different_samples(engine):
    prompt = mixed_length_prompts()[3]
    outputs = engine.generate([prompt] * 4, [sampled(s) for s in (1, 2, 3, 4)], use_tqdm=False)
    assert len({tuple(o.token_ids) for o in outputs}) == 4


def test_unseeded_requests_differ_from_each_other(engine):
    prompt = mixed_length_prompts()[3]
    outputs = engine.generate([prompt] * 3, sampled(None), use_tqdm=False)
    assert len({tuple(o.token_ids) for o in outputs}) == 3


def test_sampled_engine_tokens_respect_top_k(engine):
    """top_k=1 through the engine is greedy, whatever the temperature and seed."""
    prompt = mixed_length_prompts()[2]
    output = engine.generate([prompt], sampled(5, top_k=1, max_tokens=6), use_tqdm=False)[0]
    assert output.token_ids == engine.generate([prompt], SamplingParams(max_tokens=6, ignore_eos=True),
                                               use_tqdm=False)[0].token_ids
