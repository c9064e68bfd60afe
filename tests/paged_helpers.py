"""Helpers shared by the tests of the paged engines (m05 paged blocks, m06 prefix cache, m07 chunked prefill).

* ``make_engine``: a fresh engine per call. The paged engines keep state between ``generate`` calls that
  changes what a test sees (m06's prefix cache; the stats of step-API runs), so these tests do not share
  engines through ``engine_factory``. Building one is cheap once the tokenizer is cached (ask for the
  ``tokenizer_cache`` fixture, which keeps that cache out of the user's home).
* ``greedy``: fixed-length greedy ``SamplingParams``; ``reference``: transformers' greedy tokens, computed once per (model, prompt) for the session.
* ``SYSTEM``, ``CHATS``: prompts that share a system prompt (their references are cached across files).
* ``drain``, ``StepRecorder``, ``poison``, ``assert_blocks_all_free``: drive the step API, record what the
  scheduler chose each step, fill the K/V pool with NaN, and check that every block came back.
* ``generate_exactly``: all of it at once: poisoned K/V, a recorded ``generate``, every request's tokens equal
  to transformers' and every step fed what was scheduled.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from conftest import hf_greedy, random_prompts
from milestones.m01_naive_loop import SamplingParams

# Chat-shaped prompts for the prefix-cache tests (m06, m07): one 24-token system prompt (6 blocks of 4) plus a
# question of 1-8 tokens each.
SYSTEM = random_prompts(1, 24, 24, seed=31)[0]
CHATS = [SYSTEM + question for question in random_prompts(4, 1, 8, seed=32)]

_references: dict[tuple[int, tuple[int, ...]], list[int]] = {}


def greedy(n: int) -> SamplingParams:
    """Greedy decoding of exactly ``n`` tokens (EOS ignored)."""
    return SamplingParams(max_tokens=n, ignore_eos=True)


def make_engine(milestone: str, directory, **config):
    """A new ``milestones.<milestone>`` engine on the checkpoint in ``directory``, on the CPU."""
    module = importlib.import_module(f"milestones.{milestone}")
    return module.LLMEngine(module.EngineConfig(model=str(directory), device="cpu", **config))


def reference(model, prompt: list[int], max_tokens: int) -> list[int]:
    """transformers' greedy tokens (EOS ignored) for ``prompt``: cached, since greedy tokens for ``n`` are the
    first ``n`` of those for any longer run, and transformers' ``generate`` is the slow part of these tests."""
    key = (id(model), tuple(prompt))
    if len(_references.get(key, ())) < max_tokens:
        _references[key] = hf_greedy(model, prompt, max(max_tokens, 16))
    return _references[key][:max_tokens]


def drain(engine) -> dict:
    """Step until nothing is unfinished; the last output of every request id seen."""
    latest = {}
    while engine.has_unfinished():
        for out in engine.step():
            latest[out.request_id] = out
    return latest


@dataclass
class StepRecord:
    """What the scheduler chose in one step (recorded before the engine ran it)."""

    scheduled: list[tuple[str, int, int]]  # (request id, first position fed, tokens fed)
    admitted: list[str]
    preempted: list[str]
    running_after: list[str]
    input_ids: list[int] | None = None  # what the engine then fed the model (packed batch)
    positions: list[int] | None = None

    @property
    def num_batched_tokens(self) -> int:
        return sum(n for _, _, n in self.scheduled)


class StepRecorder:
    """Wraps ``engine.scheduler.schedule`` and ``engine.device_batch`` (instance attributes, removed by
    ``close``) to record what the scheduler chose every step and what the engine fed the model for it."""

    def __init__(self, engine) -> None:
        self.engine, self.scheduler = engine, engine.scheduler
        self.steps: list[StepRecord] = []
        original = self.scheduler.schedule
        original_device_batch = engine.device_batch

        def device_batch(host):
            batch = original_device_batch(host)
            self.steps[-1].input_ids = batch.input_ids.tolist()
            self.steps[-1].positions = batch.metadata.positions.tolist()
            return batch

        def schedule():
            out = original()
            self.steps.append(StepRecord(
                scheduled=[(s.seq.request_id, s.seq.num_computed_tokens, s.num_new_tokens) for s in out.scheduled],
                admitted=[s.request_id for s in out.admitted], preempted=[s.request_id for s in out.preempted],
                running_after=[s.request_id for s in self.scheduler.running]))
            return out

        self.scheduler.schedule = schedule
        engine.device_batch = device_batch

    def close(self) -> None:
        del self.scheduler.schedule
        del self.engine.device_batch

    def assert_fed_as_scheduled(self, tokens: dict[str, list[int]]) -> None:
        """Every step fed each scheduled request exactly its tokens ``[start, start + n)`` at those positions.
        ``tokens``: every request's prompt + output ids. Token equality alone misses some position bugs: RoPE
        sees only the distance between a query and a key, so positions all shifted alike give the same tokens."""
        for step in self.steps:
            if not step.scheduled or step.input_ids is None:  # m12: nothing planned while the last step is read
                continue                                            # back; or a decode graph (no device_batch)
            expected_ids, expected_positions = [], []
            for request_id, start, n in step.scheduled:
                expected_ids += tokens[request_id][start:start + n]
                expected_positions += range(start, start + n)
            assert step.input_ids == expected_ids and step.positions == expected_positions

    def __enter__(self) -> StepRecorder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def poison(engine) -> None:
    """Fill the whole K/V pool with NaN: any read of a slot no step wrote (even a masked one: 0 * NaN = NaN)
    turns the logits, and so the tokens, into garbage."""
    engine.kv_pool.k.fill_(float("nan"))
    engine.kv_pool.v.fill_(float("nan"))


def assert_blocks_all_free(engine) -> None:
    """Nothing unfinished, no block table left, every block back on the free list with no reference."""
    manager = engine.block_manager
    assert not engine.has_unfinished()
    assert manager.block_tables == {}
    assert manager.num_free_blocks == manager.num_blocks and manager.num_used_blocks == 0
    assert all(block.ref_count == 0 for block in manager.blocks)


def generate_exactly(engine, model, prompts: list[list[int]], max_tokens: int | list[int]):
    """``engine.generate`` on a NaN-poisoned pool, recorded step by step; asserts that every request's tokens are
    transformers' (``model``'s) and that each step fed the tokens it scheduled. Returns (outputs, recorder)."""
    lengths = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(prompts)
    poison(engine)  # freed blocks are handed out again: a stale or unwritten slot read would show
    with StepRecorder(engine) as recorder:
        outputs = engine.generate(prompts, [greedy(n) for n in lengths], use_tqdm=False)
    for prompt, n, out in zip(prompts, lengths, outputs):
        assert out.token_ids == reference(model, prompt, n)
    recorder.assert_fed_as_scheduled({o.request_id: o.prompt_token_ids + o.token_ids for o in outputs})
    return outputs, recorder
