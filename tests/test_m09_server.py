"""m09: a real uvicorn server on loopback, driven by the official ``openai`` client (and raw HTTP for bad input).

The model is a tiny random Qwen3 with the real 151,936-token vocabulary, so the real tokenizer and its chat
template work with it. The server's greedy tokens are checked against the same engine class run offline.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families
from transformers import Qwen3ForCausalLM

from conftest import end_with_this_process, env_with_checkout, random_prompts, tiny_hf_config
from milestones.m09_server import EngineConfig, LLMEngine, SamplingParams
from milestones.m09_server.app import build_app
from milestones.common.server_thread import ServerThread

MODEL_NAME = "tiny-chat"
MAX_MODEL_LEN = 256
IM_END = 151_645


def engine_kwargs(**overrides) -> dict:
    """Config for the engines here, keeping only the fields this milestone's EngineConfig has."""
    wanted = {"max_num_seqs": 64, "max_model_len": MAX_MODEL_LEN, **overrides}
    fields = {f.name for f in dataclasses.fields(EngineConfig)}
    return {k: v for k, v in wanted.items() if k in fields}


@pytest.fixture(scope="module")
def chat_checkpoint(tmp_path_factory):
    """A tiny random Qwen3 with the full vocabulary (so chat-template tokens exist) and wide weights (varied text)."""
    directory = tmp_path_factory.mktemp("m09-chat")
    config = tiny_hf_config(tie_word_embeddings=True)
    config.vocab_size, config.bos_token_id, config.eos_token_id = 151_936, 151_643, IM_END
    config.initializer_range = 0.3
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).eval().save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def engine(chat_checkpoint, tokenizer_cache):
    return LLMEngine(EngineConfig(model=str(chat_checkpoint), device="cpu", **engine_kwargs()))


@pytest.fixture(scope="module")
def offline(chat_checkpoint, tokenizer_cache):
    """The same engine class and weights, run offline with ``generate``: the reference."""
    return LLMEngine(EngineConfig(model=str(chat_checkpoint), device="cpu", **engine_kwargs()))


@pytest.fixture(scope="module")
def server(engine):
    with ServerThread(build_app(engine, served_model_name=MODEL_NAME)) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def greedy(offline, prompt, max_tokens: int, **kwargs):
    return offline.generate([prompt], SamplingParams(max_tokens=max_tokens, **kwargs), use_tqdm=False)[0]


def kv_in_use(engine) -> int:
    """K/V held by requests: blocks where the engine has a block manager (m05 on), else m04's reserved slots."""
    blocks = getattr(engine, "block_manager", None)
    if blocks is not None:
        free = blocks.num_free_blocks
        return blocks.num_blocks - (free() if callable(free) else free)
    return engine.scheduler.allocator.reserved_slots


def wait_until_idle(engine, timeout_s: float = 30.0) -> None:
    """Wait until the engine runs nothing and holds no K/V (aborts reach the engine thread between steps)."""
    deadline = time.monotonic() + timeout_s
    while engine.has_unfinished() or kv_in_use(engine):
        assert time.monotonic() < deadline, f"engine still busy: {engine.scheduler.running}, K/V {kv_in_use(engine)}"
        time.sleep(0.02)


def scrape_when_idle(server, timeout_s: float = 30.0) -> dict[str, float]:
    """/metrics once its engine gauges show nothing running or waiting and every K/V block free.

    The engine thread publishes the state /metrics reads after each step and each command (an abort, say), so a
    scrape taken the moment the engine is idle, or a client has its answer, may still show the step before.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        values = scrape(server)
        if (values["nanoserve_num_requests_running"] == values["nanoserve_num_requests_waiting"] == 0
                and values["nanoserve_kv_cache_blocks_free"] == values["nanoserve_kv_cache_blocks_total"]):
            return values
        assert time.monotonic() < deadline, f"/metrics never showed an idle engine: {values}"
        time.sleep(0.02)


def scrape(server) -> dict[str, float]:
    """/metrics parsed by prometheus_client's own parser: {"name{label=value}": value}."""
    text = httpx.get(f"{server.url}/metrics").text
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return values


# --------------------------------------------------------------------------- the endpoints


def test_models_and_health(server, client, engine):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL_NAME]
    assert models[0].model_extra["max_model_len"] == MAX_MODEL_LEN
    health = httpx.get(f"{server.url}/health")
    assert health.status_code == 200 and health.json()["milestone"] == engine.milestone == "m09_server"


def test_completion_matches_offline_generate(client, offline):
    prompt = random_prompts(1, 12, 12, seed=3)[0]
    expected = greedy(offline, prompt, 10, ignore_eos=True)
    response = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=10, temperature=0,
                                         extra_body={"ignore_eos": True, "return_token_ids": True})
    choice = response.choices[0]
    assert choice.token_ids == expected.token_ids
    assert choice.text == expected.text and choice.finish_reason == "length"
    assert response.usage.prompt_tokens == 12 and response.usage.completion_tokens == 10
    assert response.usage.prompt_tokens_details.cached_tokens == 0
    assert response.id.startswith("cmpl-") and response.model == MODEL_NAME


def test_streamed_completion_is_the_same_text_in_pieces(client, offline):
    prompt = "The capital of France is"
    expected = greedy(offline, prompt, 12, ignore_eos=True)
    chunks = list(client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True, "return_token_ids": True}))
    *token_chunks, usage_chunk = chunks
    # One chunk per engine step while the server keeps up; a stream that lags (a busy machine) gets the tokens
    # waiting for it in one chunk. So the count of chunks is up to timing, and only this is fixed: every chunk
    # carries at least one token, and the chunks together are the offline text and tokens, in order.
    assert 1 <= len(token_chunks) <= 12
    assert all(len(c.choices[0].token_ids) >= 1 for c in token_chunks)
    assert "".join(c.choices[0].text for c in token_chunks) == expected.text
    assert [t for c in token_chunks for t in c.choices[0].token_ids] == expected.token_ids
    assert [c.choices[0].finish_reason for c in token_chunks] == [None] * (len(token_chunks) - 1) + ["length"]
    assert usage_chunk.choices == [] and usage_chunk.usage.completion_tokens == 12
    assert usage_chunk.usage.prompt_tokens == len(offline.tokenizer.encode(prompt, add_special_tokens=False))
    assert not any("\ufffd" in c.choices[0].text for c in token_chunks)


def cut_inside_a_character(offline) -> tuple[list[int], int]:
    """A prompt, and a max_tokens that ends its greedy output inside a character (its last token holds the first
    bytes of a character that needs more). About one token in a hundred of Qwen3's does, so some of 16 random
    prompts' first 16 tokens will."""
    prompts = random_prompts(16, 4, 12, seed=41)
    outputs = offline.generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True), use_tqdm=False)
    for prompt, output in zip(prompts, outputs):
        for cut in range(1, len(output.token_ids) + 1):
            if offline.tokenizer.decode(output.token_ids[:cut], skip_special_tokens=True).endswith("\ufffd"):
                return prompt, cut
    raise AssertionError("no greedy output of these prompts stops inside a character: try other prompts")


def test_a_completion_cut_inside_a_character_is_what_decode_gives(client, offline):
    """The detokenizer holds back a character's first bytes until its last arrive; when max_tokens ends the
    request first, the finished text must still carry them, exactly as ``tokenizer.decode`` of the ids does."""
    prompt, cut = cut_inside_a_character(offline)
    expected = greedy(offline, prompt, cut, ignore_eos=True)
    decoded = offline.tokenizer.decode(expected.token_ids, skip_special_tokens=True)
    assert decoded.endswith("\ufffd") and expected.text == decoded  # the cut is inside a character
    for stream in (False, True):
        response = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=cut, temperature=0,
                                             stream=stream, extra_body={"ignore_eos": True, "return_token_ids": True})
        pieces = [c.choices[0] for c in response] if stream else [response.choices[0]]
        assert [t for p in pieces for t in p.token_ids] == expected.token_ids
        assert "".join(p.text for p in pieces) == decoded, f"stream={stream}"
        assert pieces[-1].finish_reason == "length"


def test_usage_counts_the_whole_prompt_after_a_prefix_cache_hit(client, engine):
    """The same prompt twice: the second finds its full blocks cached. ``prompt_tokens`` is still the whole
    prompt (OpenAI's and vLLM's meaning); the cached part is reported beside it, in ``cached_tokens``."""
    block_size = engine.config.block_size
    prompt = random_prompts(1, 2 * block_size + 5, 2 * block_size + 5, seed=43)[0]  # two full blocks and a bit
    kwargs = dict(model=MODEL_NAME, prompt=prompt, max_tokens=3, temperature=0, extra_body={"ignore_eos": True})
    first = client.completions.create(**kwargs).usage
    again = client.completions.create(**kwargs).usage
    *_, last = client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
    assert first.prompt_tokens == len(prompt) and first.prompt_tokens_details.cached_tokens == 0
    for usage in (again, last.usage):
        assert usage.prompt_tokens == len(prompt) and usage.prompt_tokens_details.cached_tokens == 2 * block_size
        assert usage.completion_tokens == 3 and usage.total_tokens == len(prompt) + 3


def test_chat_streaming_and_not(client, offline, engine):
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi! 你好 🫠"}]
    prompt_ids = engine.tokenizer.encode(engine.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True), add_special_tokens=False)
    expected = greedy(offline, prompt_ids, 8, ignore_eos=True)
    response = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=8, temperature=0,
                                              extra_body={"ignore_eos": True})
    assert response.choices[0].message.role == "assistant"
    assert response.choices[0].message.content == expected.text
    assert response.usage.prompt_tokens == len(prompt_ids) and response.usage.completion_tokens == 8
    chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=8, temperature=0,
                                                 stream=True, extra_body={"ignore_eos": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected.text
    assert chunks[-1].choices[0].finish_reason == "length" and chunks[0].object == "chat.completion.chunk"


def test_chat_without_max_tokens_stops_at_eos_or_the_context(client, engine):
    response = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "Go on"}],
                                              temperature=0, extra_body={"stop_token_ids": [IM_END]})
    usage = response.usage
    assert response.choices[0].finish_reason in ("stop", "length")
    assert usage.prompt_tokens + usage.completion_tokens <= MAX_MODEL_LEN


def test_sixty_four_concurrent_streams_match_offline(server, offline):
    prompts = random_prompts(64, 2, 24, seed=5)
    lengths = [1 + (i * 7) % 12 for i in range(64)]
    expected = offline.generate(prompts, [SamplingParams(max_tokens=n, ignore_eos=True) for n in lengths],
                                use_tqdm=False)

    async def one(client, prompt, max_tokens):
        stream = await client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=max_tokens,
                                                 temperature=0, stream=True,
                                                 extra_body={"ignore_eos": True, "return_token_ids": True})
        return [t async for chunk in stream for t in chunk.choices[0].token_ids]

    async def all_at_once():
        async with openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as client:
            return await asyncio.gather(*(one(client, p, n) for p, n in zip(prompts, lengths)))

    assert asyncio.run(all_at_once()) == [o.token_ids for o in expected]


def test_stop_strings_and_stop_token_ids(client, offline):
    prompt = random_prompts(1, 10, 10, seed=9)[0]
    expected = greedy(offline, prompt, 24, ignore_eos=True)
    text = expected.text
    start = next(i for i in range(len(text) // 3, len(text) - 2) if text.find(text[i:i + 2]) == i)
    stop = text[start:start + 2]  # two characters from the middle, first occurring there
    for stream in (False, True):
        response = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=24, temperature=0,
                                             stop=[stop], stream=stream, extra_body={"ignore_eos": True})
        pieces = [c.choices[0] for c in response] if stream else [response.choices[0]]
        assert "".join(p.text for p in pieces) == text[:start]  # the stop string and its start never sent
        assert pieces[-1].finish_reason == "stop"
    stop_token = expected.token_ids[5]
    response = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=24, temperature=0,
                                         extra_body={"ignore_eos": True, "stop_token_ids": [stop_token]})
    assert response.choices[0].finish_reason == "stop"
    assert response.usage.completion_tokens == expected.token_ids.index(stop_token) + 1


def test_sampling_with_a_seed_is_reproducible(client):
    kwargs = dict(model=MODEL_NAME, prompt="Once upon a time", max_tokens=8, temperature=1.0, top_p=0.9, seed=7,
                  extra_body={"top_k": 50, "ignore_eos": True, "return_token_ids": True})
    first = client.completions.create(**kwargs).choices[0].token_ids
    assert client.completions.create(**kwargs).choices[0].token_ids == first


# --------------------------------------------------------------------------- clients that leave


@pytest.fixture
def held_until_abort(server, engine, monkeypatch) -> list[str]:
    """Once a request has a token, the engine takes no further step until the server asks it to abort one (its
    client left), so the request cannot finish first however slow the machine; every ``engine.abort`` call is
    recorded: [request_id]. (The hold waits a minute at most: a server that never aborts fails the test, not
    the session.)"""
    wait_until_idle(engine)
    async_engine = server.app.state.async_engine
    real_step, real_abort, real_ask = engine.step, engine.abort, async_engine.abort
    abort_asked, aborted = threading.Event(), []

    def held_step():
        if any(request.output_token_ids for request in engine.scheduler.running):
            abort_asked.wait(timeout=60)
        return real_step()

    def recorded_abort(request_id):
        aborted.append(request_id)
        return real_abort(request_id)

    def ask_abort(stream):
        real_ask(stream)  # the abort is queued for the engine thread before that thread is let go
        abort_asked.set()

    monkeypatch.setattr(engine, "step", held_step)
    monkeypatch.setattr(engine, "abort", recorded_abort)
    monkeypatch.setattr(async_engine, "abort", ask_abort)
    yield aborted
    abort_asked.set()  # never leave the engine thread waiting


def test_disconnect_mid_stream_aborts_and_frees_the_blocks(server, engine, held_until_abort):
    before = scrape(server)
    body = {"prompt": [5, 6, 7, 8], "max_tokens": 200, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))  # the first token arrived...
        (running,) = engine.scheduler.running
        assert kv_in_use(engine) > 0
    # ... then the client hung up; the server aborts the request and its K/V comes back.
    wait_until_idle(engine)
    # Held after its first token, the request made at most one more step before the abort took effect.
    assert held_until_abort == [running.request_id] and len(running.output_token_ids) <= 2
    after = scrape_when_idle(server)
    assert after["nanoserve_requests_total{status=abort}"] == before["nanoserve_requests_total{status=abort}"] + 1


def test_disconnect_while_waiting_for_a_non_streamed_answer_aborts(server, engine, held_until_abort):
    body = json.dumps({"prompt": [5, 6, 7], "max_tokens": 200, "ignore_eos": True}).encode()
    with socket.create_connection((server.host, server.port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        deadline = time.monotonic() + 30
        while not engine.scheduler.running:  # the engine is working on it: hang up
            assert time.monotonic() < deadline
            time.sleep(0.01)
        (running,) = engine.scheduler.running
    wait_until_idle(engine)
    assert held_until_abort == [running.request_id] and len(running.output_token_ids) <= 2


# --------------------------------------------------------------------------- /metrics


def test_metrics_count_the_requests_sent(server, client, engine):
    wait_until_idle(engine)
    before = scrape(server)
    prompts = random_prompts(3, 4, 9, seed=13)
    for prompt in prompts:
        client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=5, temperature=0,
                                  extra_body={"ignore_eos": True})
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL_NAME, prompt=prompts[0], max_tokens=0)
    after = scrape_when_idle(server)  # the per-request counters are final before each answer is sent

    def grew(name: str) -> float:
        return after[name] - before.get(name, 0.0)

    assert grew("nanoserve_requests_total{status=length}") == 3
    assert grew("nanoserve_requests_total{status=rejected}") == 1
    assert grew("nanoserve_prompt_tokens_total") == sum(len(p) for p in prompts)
    assert grew("nanoserve_generation_tokens_total") == 15
    assert grew("nanoserve_time_to_first_token_seconds_count") == 3
    assert grew("nanoserve_inter_token_latency_seconds_count") == 3 * 4
    assert grew("nanoserve_e2e_request_latency_seconds_count") == 3
    assert after["nanoserve_num_requests_running"] == after["nanoserve_num_requests_waiting"] == 0
    assert after["nanoserve_kv_cache_usage_ratio"] == 0.0


# --------------------------------------------------------------------------- bad input

BAD_COMPLETIONS = {
    "wrong type": ({"prompt": "hi", "max_tokens": "many"}, 400, "max_tokens"),
    "missing prompt": ({"max_tokens": 4}, 400, "prompt"),
    "max_tokens 0": ({"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    "max_tokens negative": ({"prompt": "hi", "max_tokens": -3}, 400, "max_tokens"),
    "max_tokens past the context": ({"prompt": "hi", "max_tokens": MAX_MODEL_LEN}, 400, "max_tokens"),
    "empty prompt": ({"prompt": ""}, 400, "prompt"),
    "empty token list": ({"prompt": []}, 400, "prompt"),
    "prompt longer than max_model_len": ({"prompt": [5] * (MAX_MODEL_LEN + 1)}, 400, "prompt"),
    "unknown model": ({"model": "gpt-9", "prompt": "hi"}, 404, "model"),
    "negative temperature": ({"prompt": "hi", "temperature": -0.5}, 400, "temperature"),
    "top_p zero": ({"prompt": "hi", "top_p": 0}, 400, "top_p"),
    "top_p above one": ({"prompt": "hi", "top_p": 1.5}, 400, "top_p"),
    "n=2": ({"prompt": "hi", "n": 2}, 400, "n"),
    "token id outside the vocabulary": ({"prompt": [5, 10**9]}, 400, None),
    "empty stop string": ({"prompt": "hi", "stop": [""]}, 400, "stop"),
    "echo": ({"prompt": "hi", "echo": True}, 400, None),
    "seed past 64 bits": ({"prompt": "hi", "seed": 2**64}, 400, "seed"),
}
BAD_CHATS = {
    "empty messages": ({"messages": []}, 400, "messages"),
    "missing messages": ({"max_tokens": 3}, 400, "messages"),
    "unknown role": ({"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages.0.role"),
    "unknown model": ({"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}, 404, "model"),
}


def assert_openai_error(response: httpx.Response, status: int, param: str | None) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param, error


@pytest.mark.parametrize("case", list(BAD_COMPLETIONS))
def test_bad_completion_requests_get_an_openai_error(server, case):
    body, status, param = BAD_COMPLETIONS[case]
    assert_openai_error(httpx.post(f"{server.url}/v1/completions", json=body), status, param)


@pytest.mark.parametrize("case", list(BAD_CHATS))
def test_bad_chat_requests_get_an_openai_error(server, case):
    body, status, param = BAD_CHATS[case]
    assert_openai_error(httpx.post(f"{server.url}/v1/chat/completions", json=body), status, param)


def test_every_problem_of_a_request_is_named_in_its_message(server):
    response = httpx.post(f"{server.url}/v1/completions", json={"prompt": "hi", "max_tokens": 0, "temperature": -1})
    assert_openai_error(response, 400, None)
    message = response.json()["error"]["message"]
    assert "max_tokens: " in message and "temperature: " in message and "more problem" not in message


def test_malformed_json_and_a_body_that_is_not_an_object(server, client):
    for content in (b'{"prompt": "hi", ', b'["prompt"]'):
        response = httpx.post(f"{server.url}/v1/completions", content=content,
                              headers={"Content-Type": "application/json"})
        assert_openai_error(response, 400, None)
    assert response.json()["error"]["type"] == "invalid_request_error"
    # ... and the server keeps serving.
    assert client.completions.create(model=MODEL_NAME, prompt="still there?", max_tokens=2).usage.completion_tokens >= 1


def test_the_openai_client_sees_a_bad_request_error(client):
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model=MODEL_NAME, prompt="hi", temperature=-1)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "hi"}])


# --------------------------------------------------------------------------- an engine that fails


def test_engine_exception_fails_the_requests_it_touched_and_serving_goes_on(server, client, engine, monkeypatch):
    wait_until_idle(engine)
    real_step = engine.step
    failures = []

    def failing_step():
        outputs = real_step()  # the request is admitted and holds K/V ...
        if len(failures) < 2:
            failures.append(1)
            raise RuntimeError("injected failure")  # ... when the step blows up
        return outputs

    monkeypatch.setattr(engine, "step", failing_step)
    response = httpx.post(f"{server.url}/v1/completions", json={"prompt": [5, 6], "max_tokens": 50}, timeout=60)
    assert_openai_error(response, 500, None)
    assert "injected failure" in response.json()["error"]["message"]
    with pytest.raises(openai.APIError, match="injected failure"):
        list(client.completions.create(model=MODEL_NAME, prompt=[7, 8], max_tokens=50, stream=True))
    wait_until_idle(engine)  # both were aborted: their K/V is back
    assert client.completions.create(model=MODEL_NAME, prompt=[9, 10], max_tokens=3).usage.completion_tokens >= 1
    assert scrape(server)["nanoserve_requests_total{status=error}"] >= 2


# --------------------------------------------------------------------------- shutdown


def test_graceful_shutdown_finishes_short_requests_and_aborts_long_ones(chat_checkpoint, tokenizer_cache):
    engine = LLMEngine(EngineConfig(model=str(chat_checkpoint), device="cpu", **engine_kwargs(max_num_seqs=4)))
    short, long_ = 6, 200
    real_step = engine.step

    def step():
        # Full speed while the short request runs; otherwise each step takes 50 ms at least, so the long one
        # needs ~10 s, far past the grace period, however slow (or fast) the machine.
        if not any(request.params.max_tokens == short for request in engine.scheduler.running):
            time.sleep(0.05)
        return real_step()

    engine.step = step
    server = ServerThread(build_app(engine), graceful_shutdown_s=3.0).start()
    results, started = {}, threading.Barrier(3, timeout=60)

    def stream(name: str, max_tokens: int) -> None:
        """Count the tokens (not the chunks: a lagging stream gets several tokens in one) until [DONE] or a cut."""
        body = {"prompt": [5, 6, 7], "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
                "return_token_ids": True}
        tokens = 0
        try:
            with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as response:
                for line in response.iter_lines():
                    if line.startswith("data: {"):
                        first = tokens == 0
                        tokens += len(json.loads(line[6:])["choices"][0]["token_ids"])
                        if first:
                            started.wait()
                    if line == "data: [DONE]":
                        results[name] = ("done", tokens)
                        return
        except httpx.HTTPError:
            pass
        results[name] = ("cut", tokens)

    clients = [threading.Thread(target=stream, args=(name, n)) for name, n in (("short", short), ("long", long_))]
    try:
        for thread in clients:
            thread.start()
        started.wait()  # both are streaming
    finally:
        server.stop()
        for thread in clients:
            thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in clients)
    assert results["short"] == ("done", short)
    assert results["long"][0] == "cut" and 1 <= results["long"][1] < long_
    assert not engine.has_unfinished() and kv_in_use(engine) == 0
    assert not server.thread.is_alive()


# --------------------------------------------------------------------------- the CLI and the demo


def test_cli_maps_vllm_flags_and_refuses_the_ones_the_engine_lacks(capsys):
    from milestones.common.serve_cli import engine_config, serve_parser

    @dataclasses.dataclass
    class SmallConfig:
        model: str = "tiny"
        max_num_seqs: int = 8
        enable_prefix_caching: bool = True

    parser = serve_parser("serve")
    args = parser.parse_args(["--model", "x", "--max-num-seqs", "3", "--no-enable-prefix-caching"])
    assert engine_config(SmallConfig, args, parser) == SmallConfig("x", 3, False)
    args = parser.parse_args(["--block-size", "16"])
    with pytest.raises(SystemExit):
        engine_config(SmallConfig, args, parser)
    assert "--block-size is not supported by this engine" in capsys.readouterr().err


def test_demo_serves_the_same_text_as_offline_and_prints_the_table(capsys):
    from milestones.m09_server.__main__ import main

    rows = main(["--device", "cpu", "--num-requests", "4", "--prompt-len", "8", "--max-tokens", "4",
                 "--max-model-len", "64"])
    out = capsys.readouterr().out
    assert "TTFT includes queueing" in out and "E2E p99 (ms)" in out
    assert "server text identical to offline generate (greedy): yes" in out
    assert "curl -N http://127.0.0.1:8000/v1/chat/completions" in out
    offline, online = rows
    assert offline["output tokens"] == online["output tokens"] == 16
    assert online["TTFT p50 (ms)"] > 0 and not math.isnan(online["output tok/s"])


# --------------------------------------------------------------------------- the online benchmark


def test_online_benchmark_serves_a_milestone_and_writes_json(tmp_path, tokenizer_cache):
    from benchmarks.online import main as online

    (result,) = online(["--milestone", "m09", "--model", "tiny", "--device", "cpu", "--workload", "offline",
                        "--max-requests", "4", "--max-tokens", "3", "--rates", "inf,50", "--offline-reference",
                        "--max-num-seqs", "4", "--out-dir", str(tmp_path), "--no-progress"])
    saved = json.loads((tmp_path / "cpu" / "online_m09_offline.json").read_text())
    assert saved["milestone"] == "m09_server" and saved["engine_config"]["max_num_seqs"] == 4
    assert saved["workload"]["slice"]["num_requests_run"] == 4 and saved["env"]["source_sha256"]
    assert [run["rate"] for run in saved["runs"]] == ["inf", 50.0]
    for run in saved["runs"]:
        summary = run["summary"]
        assert summary["completed_full_length"] == 4 and summary["output_tokens"] == 12 and summary["errors"] == 0
        assert summary["cached_tokens"] == 0  # the warm-up's prompts were a variant of their own
        assert 0 < summary["ttft_p50_s"] <= summary["ttft_p99_s"]
        # Gaps between chunks; a stream that lagged got its tokens in fewer chunks (maybe one: no gap at all).
        assert summary["itl_p50_s"] is None or summary["itl_p50_s"] > 0
        assert run["server_after"]["kv_cache_blocks_free"] == run["server_after"]["kv_cache_blocks_total"]
    assert saved["offline_reference"]["output_tokens"] == 12 and saved["burst_vs_offline"] > 0
    assert saved["clients"] == "a worker process of their own"
    assert saved["warmup_requests"] == 4  # the workload's first 32, of which the slice holds 4
    best = saved["throughput_at_ttft_p99_target"]
    assert set(best) == {"0.25", "0.5", "1", "2"}
    for met in filter(None, best.values()):
        assert met["ttft_p99_s"] <= 2 and met["output_tokens_per_s"] > 0
    assert result["runs"][0]["summary"] == saved["runs"][0]["summary"]


def test_online_benchmark_refuses_a_negative_warm_up_in_one_line(capsys):
    from benchmarks.online import main as online

    with pytest.raises(SystemExit) as exited:
        online(["--milestone", "m09", "--model", "tiny", "--warmup-requests", "-1", "--no-save"])
    assert exited.value.code == 2 and "--warmup-requests: expected an integer >= 0, got -1" in capsys.readouterr().err


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_online_benchmarks_client_process_ends_with_the_benchmark_however_it_ends(tmp_path):
    """The clients run in a worker process of their own; a benchmark killed outright (SIGKILL: no ``finally``, no
    atexit) must not leave it behind."""
    script = tmp_path / "pool.py"
    script.write_text("import os, time\nfrom benchmarks.online import spawned_pool\n"
                      "if __name__ == '__main__':\n"  # a spawned worker imports this script again
                      "    print(spawned_pool().submit(os.getpid).result(), flush=True)\n    time.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              env=env_with_checkout(), preexec_fn=end_with_this_process)
    worker = None
    try:
        worker = int(parent.stdout.readline())
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 60
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(worker), "the clients' worker outlived the benchmark"
    finally:
        parent.kill()
        if worker is not None and _alive(worker):
            os.kill(worker, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False
