"""m09's doors: hostile clients against a live server (uvicorn on loopback, the tiny preset), one at a time.

Each hostile request gets a clear 4xx in OpenAI's error format, or a timeout the server enforces (408 for a body
that never comes, a closed socket for a connection that never sends a request). After each one, nothing has
leaked (no open connection, every K/V block free per /metrics, no thread beyond the server's own and its
tokenizer pool) and the server still serves a normal request. The server asks for an API key, so the hostile
clients here are ones that have it (a room's participant), and the key's own checks come last.

Nothing here asserts a duration: "the loop kept serving" is shown by order (a /health answer, a stream's next
token, received in the middle of the hostile upload or while a tokenization is held), and every wait has a
timeout. The server's timeouts are short (seconds), so the waits for them are short too.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import openai
import pytest
from pydantic import ValidationError

from milestones.common.http_guards import ServerGuards
from milestones.common.serve_cli import serve_parser, server_guards
from milestones.common.server_thread import ServerThread
from milestones.m09_server import EngineConfig, LLMEngine
from milestones.m09_server.app import build_app
from milestones.common.openai_protocol import MAX_STOP_STRINGS, CompletionRequest
from test_m09_server import assert_openai_error, scrape

KEY = "workshop-key-0123"
AUTH = {"Authorization": f"Bearer {KEY}"}
JSON = {**AUTH, "Content-Type": "application/json"}
MAX_MODEL_LEN = 256
BODY_TIMEOUT_S = KEEP_ALIVE_S = 2.0  # the server's; waits on them get TIMEOUT_S
TIMEOUT_S = 60.0
MiB = 2**20
TOKENIZER_THREADS = "nanoserve-tokenizer"


@pytest.fixture(scope="module")
def engine(tokenizer_cache):
    return LLMEngine(EngineConfig(model="tiny", device="cpu", max_model_len=MAX_MODEL_LEN, max_num_seqs=8))


@pytest.fixture(scope="module")
def server(engine):
    guards = ServerGuards(api_keys=(KEY,), request_body_timeout_s=BODY_TIMEOUT_S)
    with ServerThread(build_app(engine, served_model_name="tiny", guards=guards), timeout_keep_alive=KEEP_ALIVE_S) \
            as running:
        assert completion_tokens(running) == 3  # warm: the tokenizer pool has a thread, the engine has run
        yield running


def completion_tokens(server, prompt: str | list[int] = "Once upon a time", max_tokens: int = 3) -> int:
    """A normal request, through the official client with the key; the number of tokens it got."""
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=TIMEOUT_S) as client:
        response = client.completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens,
                                             extra_body={"ignore_eos": True})
    return response.usage.completion_tokens


def wait_for(condition, what: str, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.02)


def open_connections(server) -> int:
    return len(server.server.server_state.connections)


def threads() -> tuple[list[str], int]:
    """The names of this process's threads outside the tokenizer pool, and how many are in it."""
    names = [thread.name for thread in threading.enumerate()]
    return sorted(n for n in names if not n.startswith(TOKENIZER_THREADS)), sum(n.startswith(TOKENIZER_THREADS)
                                                                                 for n in names)


def idle_and_all_blocks_free(server) -> bool:
    values = scrape(server)
    return (values["nanoserve_num_requests_running"] == values["nanoserve_num_requests_waiting"] == 0
            and values["nanoserve_kv_cache_blocks_free"] == values["nanoserve_kv_cache_blocks_total"])


@pytest.fixture(autouse=True)
def nothing_leaks_and_the_server_still_serves(server):
    others_before, _ = threads()
    yield
    wait_for(lambda: idle_and_all_blocks_free(server), "/metrics shows every K/V block free")
    assert completion_tokens(server) == 3
    wait_for(lambda: open_connections(server) == 0, "every connection is closed")
    others_after, pool = threads()
    assert others_after == others_before and pool <= 4


def post(server, body: bytes | dict, path: str = "/v1/completions", headers: dict = JSON) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{server.url}{path}", content=content, headers=headers, timeout=TIMEOUT_S)


# --------------------------------------------------------------------------- a body too large, or never sent


class SteppedEngine:
    """Once the running request has a token, each engine step waits for ``release()`` (a minute at most)."""

    def __init__(self, engine) -> None:
        self.engine, self.real_step = engine, engine.step
        self.allowed, self.free = threading.Semaphore(0), False

    def step(self):
        if not self.free and any(request.output_token_ids for request in self.engine.scheduler.running):
            self.allowed.acquire(timeout=TIMEOUT_S)
        return self.real_step()

    def release(self) -> None:
        self.allowed.release()


@pytest.fixture
def stepped(engine, monkeypatch):
    stepper = SteppedEngine(engine)
    monkeypatch.setattr(engine, "step", stepper.step)
    yield stepper
    stepper.free = True  # never leave the engine thread waiting
    stepper.release()


def next_token_ids(lines) -> list[int]:
    line = next(line for line in lines if line.startswith("data: {"))
    return json.loads(line[6:])["choices"][0]["token_ids"]


@pytest.mark.parametrize("announced", [True, False], ids=["content-length", "chunked"])
def test_a_30_mb_body_gets_413_while_health_and_a_stream_go_on(server, stepped, announced):
    """30 MiB, sent 1 MiB at a time. Two MiB in (before the limit is even reached by counting), the uploading
    client itself asks /health and lets the engine take one step: both answers arrive while its upload goes on."""
    seen = []
    stream_body = {"prompt": [5, 6, 7, 8], "max_tokens": 100, "ignore_eos": True, "stream": True,
                   "return_token_ids": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=stream_body, headers=AUTH,
                      timeout=TIMEOUT_S) as stream:
        lines = stream.iter_lines()
        seen.append(len(next_token_ids(lines)))  # the first token: the engine now waits for a release

        def upload():
            for mib in range(30):
                if mib == 2:
                    seen.append(httpx.get(f"{server.url}/health", timeout=TIMEOUT_S).status_code)
                    stepped.release()
                    seen.append(len(next_token_ids(lines)))  # a token made (and delivered) mid-upload
                yield b"x" * MiB

        headers = {**JSON, "Content-Length": str(30 * MiB)} if announced else JSON
        response = httpx.post(f"{server.url}/v1/completions", content=upload(), headers=headers, timeout=TIMEOUT_S)
    assert seen == [1, 200, 1]
    assert_openai_error(response, 413, None)
    assert "--max-request-body-mb" in response.json()["error"]["message"]
    assert response.json()["error"]["code"] == "request_too_large"


def test_headers_then_no_body_gets_408_and_the_connection_is_closed(server):
    with socket.create_connection((server.host, server.port), timeout=TIMEOUT_S) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer " + KEY.encode()
                     + b"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n")
        assert httpx.get(f"{server.url}/health", timeout=TIMEOUT_S).status_code == 200  # the wait stalls nobody
        answer = b""
        while chunk := sock.recv(65536):  # until the server closes the connection
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 ") and b"connection: close" in head.lower()
    assert "did not arrive" in json.loads(body)["error"]["message"]


def test_two_hundred_idle_connections_are_closed_by_the_server(server):
    sockets = [socket.create_connection((server.host, server.port), timeout=TIMEOUT_S) for _ in range(200)]
    try:
        wait_for(lambda: open_connections(server) >= 200, "the server holds the 200 connections")
        assert httpx.get(f"{server.url}/health", timeout=TIMEOUT_S).status_code == 200
        assert completion_tokens(server) == 3  # served beside them
        for sock in sockets:  # then each is closed by the server, having sent nothing: recv sees the end
            assert sock.recv(1) == b""
    finally:
        for sock in sockets:
            sock.close()


# --------------------------------------------------------------------------- bodies that are not what they claim


def test_invalid_utf8_is_a_400_that_names_it(server):
    response = post(server, b'{"model": "tiny", "prompt": "caf\xe9 \xff\xfe"}')
    assert_openai_error(response, 400, None)
    assert "utf-8" in response.json()["error"]["message"]


def test_deeply_nested_json_is_a_400(server):
    response = post(server, b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    assert_openai_error(response, 400, None)
    assert "recursion" in response.json()["error"]["message"]


def test_ten_thousand_stop_strings_are_refused_before_they_are_read(server):
    response = post(server, {"prompt": "hi", "stop": [f"s{i}" for i in range(10_000)]})
    assert_openai_error(response, 400, "stop")
    assert f"at most {MAX_STOP_STRINGS}" in response.json()["error"]["message"]
    assert_openai_error(post(server, {"prompt": "hi", "stop": ["x" * 10_000]}), 400, "stop")  # one, too long


def test_a_million_bad_token_ids_are_one_problem_not_a_million():
    """pydantic stops at a list's first bad item (``fail_fast``), so the errors formatted on the event loop stay
    few however many items a body carries (a million, each reported, took seconds of the loop)."""
    with pytest.raises(ValidationError) as refused:
        CompletionRequest.model_validate({"prompt": [-1] * 1_000_000, "stop_token_ids": [-1] * 1000})
    assert refused.value.error_count() <= 3


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "hi", "max_tokens": 10**12}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**12}),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 1' + b"0" * 5000 + b"}"),  # past Python's int parsing limit
], ids=["completion", "chat", "5000 digits"])
def test_max_tokens_of_ten_to_the_twelve_is_a_clean_400(server, path, body):
    response = post(server, body, path)
    assert_openai_error(response, 400, None)
    assert response.json()["error"]["code"] in ("context_length_exceeded", 400)


# --------------------------------------------------------------------------- prompts that take long to tokenize


@pytest.fixture
def recorded_tokenizer(engine, monkeypatch):
    """Records the thread of every tokenizer call; ``hold`` (set by the test) makes a call in a tokenizer thread
    wait until released (one on the event loop is not held: it would stall the test, not fail it)."""
    calls, hold, release = [], threading.Event(), threading.Event()
    real_encode, real_template = engine.tokenizer.encode, engine.tokenizer.apply_chat_template

    def encode(text, *args, **kwargs):
        calls.append(("encode", threading.current_thread().name, len(text)))
        if hold.is_set() and threading.current_thread().name.startswith(TOKENIZER_THREADS):  # never the event loop
            release.wait(timeout=TIMEOUT_S)
        return real_encode(text, *args, **kwargs)

    def apply_chat_template(*args, **kwargs):
        calls.append(("chat template", threading.current_thread().name, None))
        return real_template(*args, **kwargs)

    monkeypatch.setattr(engine.tokenizer, "encode", encode)
    monkeypatch.setattr(engine.tokenizer, "apply_chat_template", apply_chat_template)
    yield calls, hold, release
    release.set()


def test_a_prompt_too_long_in_characters_is_refused_untokenized(server, recorded_tokenizer):
    calls, _, _ = recorded_tokenizer
    for path, body, param in [("/v1/completions", {"prompt": "a" * (MAX_MODEL_LEN * 512)}, "prompt"),
                              ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a" * 200_000}]},
                               "messages")]:
        response = post(server, body, path)
        assert_openai_error(response, 400, param)
        assert "characters" in response.json()["error"]["message"]
    assert [call[0] for call in calls] == ["chat template"]  # rendered (a template may drop text), never encoded


def test_the_densest_prompt_that_fits_is_not_refused(server, recorded_tokenizer):
    """Qwen3's longest token is 128 spaces: 255 of them are 32,640 characters and fit a 256-token context."""
    assert completion_tokens(server, prompt=" " * (128 * (MAX_MODEL_LEN - 1)), max_tokens=1) == 1


def test_a_prompt_being_tokenized_delays_only_itself(server, recorded_tokenizer):
    """While one prompt's tokenization is held, /health, a token-id prompt and a chat (tokenized beside it, in
    another thread of the pool) are all answered; then the held one finishes too."""
    calls, hold, release = recorded_tokenizer
    hold.set()
    held = threading.Thread(target=lambda: results.append(completion_tokens(server, prompt="held " * 100)))
    results: list[int] = []
    held.start()
    wait_for(lambda: calls, "the held prompt reaches the tokenizer")
    hold.clear()
    assert httpx.get(f"{server.url}/health", timeout=TIMEOUT_S).status_code == 200
    assert completion_tokens(server, prompt=[5, 6, 7]) == 3
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=TIMEOUT_S) as client:
        chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                              max_tokens=2, extra_body={"ignore_eos": True})
    assert chat.usage.completion_tokens == 2 and results == []  # all of that while the first is still held
    release.set()
    held.join(timeout=TIMEOUT_S)
    assert results == [3]
    assert {name.split("_")[0] for _, name, _ in calls} == {TOKENIZER_THREADS}  # never on the event loop


# --------------------------------------------------------------------------- the key


def test_without_the_key_v1_is_401_and_health_and_metrics_stay_open(server):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"},
                    {"Authorization": KEY}):
        response = httpx.post(f"{server.url}/v1/completions", json={"prompt": "hi"}, headers=headers)
        assert_openai_error(response, 401, None)
        assert response.json()["error"]["code"] == "invalid_api_key"
        assert response.headers["www-authenticate"] == "Bearer"
    assert httpx.get(f"{server.url}/v1/models").status_code == 401
    assert httpx.get(f"{server.url}/health").status_code == 200
    assert "nanoserve_requests_total" in httpx.get(f"{server.url}/metrics").text


def test_the_openai_client_passes_the_key_or_sees_an_authentication_error(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="not-the-key", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError, match="API key"):
            client.models.list()
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0) as client:
        assert [model.id for model in client.models.list().data] == ["tiny"]


def test_an_unauthenticated_30_mb_body_is_refused_before_it_is_read(server):
    response = httpx.post(f"{server.url}/v1/completions", content=b"x" * 30 * MiB, timeout=TIMEOUT_S,
                          headers={"Content-Type": "application/json"})
    assert_openai_error(response, 401, None)


def test_the_key_comes_from_the_flag_or_else_from_vllm_api_key():
    parser = serve_parser("serve")
    assert server_guards(parser.parse_args([]), environ={}).api_keys == ()
    assert server_guards(parser.parse_args([]), environ={"VLLM_API_KEY": "from-env"}).api_keys == ("from-env",)
    flagged = parser.parse_args(["--api-key", "a", "b", "--max-request-body-mb", "0.5"])
    guards = server_guards(flagged, environ={"VLLM_API_KEY": "from-env"})
    assert guards.api_keys == ("a", "b") and guards.max_request_body_bytes == MiB // 2
