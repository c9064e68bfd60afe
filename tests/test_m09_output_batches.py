"""m09: a request whose consumer fell behind gets its waiting outputs in one batch, and nothing changes but the
number of chunks: the same text, the same token ids, a stop string still ending at its exact token."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from milestones.m09_server.async_engine import EngineError, RequestStream
from milestones.m09_server.detokenizer import IncrementalDetokenizer
from milestones.m09_server.serving import Generation


def output(token_ids: list[int], finish: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(request_id="r", token_ids=list(token_ids), finish_reason=finish, num_cached_tokens=0)


async def batches_of(items: list, gap_after: set[int] = frozenset()) -> list[list]:
    """Queue ``items`` (pausing for the consumer after the indices in ``gap_after``) and collect the batches."""
    stream = RequestStream()
    seen: list[list] = []

    async def produce():
        for i, item in enumerate(items):
            stream.queue.put_nowait(item)
            if i in gap_after:
                await asyncio.sleep(0.01)

    async def consume():
        async for batch in stream.batches():
            seen.append(batch)

    await asyncio.gather(produce(), consume())
    return seen


def test_outputs_waiting_together_come_as_one_batch():
    items = [output([1]), output([1, 2]), output([1, 2, 3]), output([1, 2, 3, 4], "length")]
    seen = asyncio.run(batches_of(items, gap_after={0}))
    assert [len(b) for b in seen] == [1, 3]
    assert seen[-1][-1].finish_reason == "length"


def test_a_batch_never_reads_past_the_end_of_its_request():
    stream = RequestStream()
    for item in (output([1]), output([1, 2], "stop"), output([9])):  # the last one must stay queued
        stream.queue.put_nowait(item)

    async def drain():
        return [batch async for batch in stream.batches()]

    assert [len(b) for b in asyncio.run(drain())] == [2]
    assert stream.queue.qsize() == 1


def test_tokens_before_a_failure_go_out_before_the_error():
    stream = RequestStream()
    for item in (output([1]), output([1, 2]), EngineError("boom")):
        stream.queue.put_nowait(item)
    got = []

    async def drain():
        with pytest.raises(EngineError, match="boom"):
            async for batch in stream.batches():
                got.append(batch)

    asyncio.run(drain())
    assert [[o.token_ids for o in b] for b in got] == [[[1], [1, 2]]]


@pytest.fixture(scope="module")
def tokenizer(tokenizer_cache):
    from milestones.m01_naive_loop.tokenizer import load_tokenizer

    return load_tokenizer(None)


def run_generation(tokenizer, outputs: list, stop=()) -> tuple[list, Generation, list[str]]:
    """Feed ``outputs`` all at once (a consumer that fell behind) through ``Generation.deltas``."""
    aborted = []
    stream = RequestStream()
    stream.request_id = "r"
    engine = SimpleNamespace(abort=lambda s: aborted.append(s.request_id))
    generation = Generation(engine, stream, IncrementalDetokenizer(tokenizer, stop), None, prompt_tokens=3,
                            arrival=0.0)
    for item in outputs:
        stream.queue.put_nowait(item)

    async def collect():
        return [delta async for delta in generation.deltas()]

    return asyncio.run(collect()), generation, aborted


def test_a_late_consumer_gets_the_same_text_in_fewer_chunks(tokenizer):
    ids = tokenizer.encode("Hello world, and good morning to you", add_special_tokens=False)
    outputs = [output(ids[:n], "length" if n == len(ids) else None) for n in range(1, len(ids) + 1)]
    deltas, generation, _ = run_generation(tokenizer, outputs)
    assert len(deltas) == 1
    assert deltas[0].text == tokenizer.decode(ids) and deltas[0].token_ids == ids
    assert deltas[0].finish_reason == "length" and generation.completion_tokens == len(ids)


def test_a_stop_string_inside_a_batch_ends_at_its_token(tokenizer):
    ids = tokenizer.encode("one two three four five six", add_special_tokens=False)
    stop_at = len(tokenizer.encode("one two three", add_special_tokens=False))
    outputs = [output(ids[:n]) for n in range(1, len(ids) + 1)]
    deltas, generation, aborted = run_generation(tokenizer, outputs, stop=[" four"])
    assert "".join(d.text for d in deltas) == "one two three"
    assert deltas[-1].finish_reason == "stop" and aborted == ["r"]
    # the tokens counted are those up to the one that completed the stop string, not the whole batch
    assert generation.completion_tokens == stop_at + 1 < len(ids)
