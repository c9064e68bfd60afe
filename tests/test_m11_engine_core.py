"""m11: m09's server in front of an engine core in a process of its own.

The server's black-box checks (the official ``openai`` client: completions, chat, streaming, stop strings,
seeds, bad input) are m09's own tests, imported and run here against an m11 server. Then what only a second
process brings: per-step messages, refusing bad requests before they cross, the core's life and death
(Ctrl-C, SIGTERM, SIGKILL of either process), a failing step, a disconnecting client.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
import zmq

from conftest import end_with_this_process, random_prompts
from milestones.m09_server.app import build_app
from milestones.common.server_thread import ServerThread
from milestones.m11_engine_core import EngineConfig, LLMEngine, SamplingParams
from milestones.m11_engine_core.async_llm import TokenIdsSoFar
from test_m09_server import (  # noqa: F401  (fixtures and tests, run again here against m11)
    BAD_CHATS, BAD_COMPLETIONS, MODEL_NAME, assert_openai_error, chat_checkpoint, engine_kwargs, greedy, scrape,
    test_bad_chat_requests_get_an_openai_error, test_bad_completion_requests_get_an_openai_error,
    test_chat_streaming_and_not, test_chat_without_max_tokens_stops_at_eos_or_the_context,
    test_completion_matches_offline_generate, test_malformed_json_and_a_body_that_is_not_an_object,
    test_sampling_with_a_seed_is_reproducible, test_sixty_four_concurrent_streams_match_offline,
    test_stop_strings_and_stop_token_ids, test_streamed_completion_is_the_same_text_in_pieces,
    test_the_openai_client_sees_a_bad_request_error)

REPO = Path(__file__).resolve().parent.parent
TIMEOUT_S = 120


def config(checkpoint, **overrides) -> EngineConfig:
    return EngineConfig(model=str(checkpoint), device="cpu", **engine_kwargs(**overrides))


@pytest.fixture(scope="module")
def offline(chat_checkpoint, tokenizer_cache):
    """m11's engine run offline, in this process: ``generate`` is m10's."""
    return LLMEngine(config(chat_checkpoint))


@pytest.fixture(scope="module")
def engine(offline):
    """What m09's imported tests read of "the engine": its tokenizer (the served engine is in another process)."""
    return offline


@pytest.fixture(scope="module")
def core_client(chat_checkpoint, tokenizer_cache):
    return LLMEngine.make_engine_client(config(chat_checkpoint))


@pytest.fixture(scope="module")
def server(core_client):
    with ServerThread(build_app(core_client, served_model_name=MODEL_NAME)) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=TIMEOUT_S)


def wait_for(condition, what: str, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.02)


def idle_and_all_blocks_free(server) -> bool:
    values = scrape(server)
    return (values["nanoserve_num_requests_running"] == values["nanoserve_num_requests_waiting"] == 0
            and values["nanoserve_kv_cache_blocks_free"] == values["nanoserve_kv_cache_blocks_total"])


# --------------------------------------------------------------------------- the split itself


def test_the_engine_runs_in_another_process_and_health_names_m11(server, core_client, client):
    assert core_client.core.process.is_alive() and core_client.core.process.pid != os.getpid()
    health = httpx.get(f"{server.url}/health")
    assert health.status_code == 200 and health.json()["milestone"] == "m11_engine_core"
    assert [m.id for m in client.models.list().data] == [MODEL_NAME]


def test_token_ids_so_far_is_a_prefix_that_does_not_grow():
    ids = [1, 2, 3]
    view = TokenIdsSoFar(ids, 2)
    ids.append(4)
    assert len(view) == 2 and list(view) == [1, 2] and view[1:] == [2] and view[-1] == 2 and view[5:] == []
    with pytest.raises(IndexError):
        view[2]


def test_bad_requests_are_refused_in_the_front_end_and_never_reach_the_core(server, core_client, monkeypatch):
    sent = []
    real_send = core_client.core.send
    monkeypatch.setattr(core_client.core, "send", lambda message: (sent.append(message), real_send(message)))
    limits = core_client.limits
    cases = [{"prompt": [5, limits.vocab_size]},  # a token id outside the vocabulary
             {"prompt": [5] * 8, "max_tokens": limits.max_model_len},  # past max_model_len
             {"prompt": [], "max_tokens": 3}, {"prompt": "hi", "max_tokens": 0}]
    for body in cases:
        assert_openai_error(httpx.post(f"{server.url}/v1/completions", json=body, timeout=TIMEOUT_S), 400, None)
    assert sent == []


def test_the_front_end_refuses_what_the_engine_refuses(core_client, offline):
    """The front end's checks and the engine's ``make_request`` agree, on good and bad requests alike."""
    limits = core_client.limits
    cases = [([5, 6], 4), ([5, limits.vocab_size], 4), ([5] * 8, limits.max_model_len - 8),
             ([5] * 8, limits.max_model_len - 7), ([], 1)]
    for prompt, max_tokens in cases:
        params = SamplingParams(max_tokens=max_tokens)
        errors = []
        for check in (lambda: core_client.check_request(prompt, params), lambda: offline.make_request(prompt, params)):
            try:
                check()
                errors.append(None)
            except ValueError as error:
                errors.append(error)
        assert (errors[0] is None) == (errors[1] is None), (prompt, max_tokens, errors)


def test_the_core_sends_one_message_per_step(chat_checkpoint, tokenizer_cache):
    """Every message the core sends carries the outputs of a whole step, each request at most once."""
    import asyncio

    async def run() -> list:
        client = LLMEngine.make_engine_client(config(chat_checkpoint))
        client.start()
        messages, real = [], client._dispatch
        client._dispatch = lambda message: (messages.append(message), real(message))
        try:
            streams = [await client.add_request(p, SamplingParams(max_tokens=6, ignore_eos=True))
                       for p in random_prompts(5, 3, 9, seed=2)]
            for stream in streams:
                async for _ in stream.batches():
                    pass
        finally:
            await client.shutdown()
        return messages

    messages = asyncio.run(asyncio.wait_for(run(), TIMEOUT_S))
    assert sum(len(o.new_token_ids) for m in messages for o in m.outputs) == 5 * 6
    for message in messages:
        ids = [o.request_id for o in message.outputs]
        assert len(ids) == len(set(ids)) and all(len(o.new_token_ids) == 1 for o in message.outputs)
    assert any(len(m.outputs) > 1 for m in messages)  # batched: five requests share steps


# --------------------------------------------------------------------------- failures inside the core


class FlakyEngine(LLMEngine):
    """Raises in any step that runs a request whose prompt starts with ``POISON``; slow steps on request."""

    POISON = 7777

    def step_outputs(self):
        running = self.scheduler.running
        if any(seq.prompt_token_ids[0] == self.POISON for seq in running):
            raise RuntimeError("poisoned step")
        if any(seq.prompt_token_ids[0] == self.POISON + 1 for seq in running):
            time.sleep(0.05)  # a slow request: a client can hang up long before it ends
        return super().step_outputs()


@pytest.fixture(scope="module")
def flaky_server(chat_checkpoint, tokenizer_cache):
    client = FlakyEngine.make_engine_client(config(chat_checkpoint))
    with ServerThread(build_app(client, served_model_name=MODEL_NAME)) as running:
        yield running


def test_a_failing_step_fails_its_requests_and_serving_goes_on(flaky_server):
    url = f"{flaky_server.url}/v1/completions"
    failed = httpx.post(url, json={"prompt": [FlakyEngine.POISON, 5], "max_tokens": 4}, timeout=TIMEOUT_S)
    assert failed.status_code == 500 and "poisoned step" in failed.json()["error"]["message"]
    wait_for(lambda: idle_and_all_blocks_free(flaky_server), "the failed request's blocks are back")
    ok = httpx.post(url, json={"prompt": [5, 6, 7], "max_tokens": 4, "ignore_eos": True}, timeout=TIMEOUT_S)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4
    assert httpx.get(f"{flaky_server.url}/health").status_code == 200


def test_a_client_that_disconnects_aborts_its_request_in_the_core(flaky_server):
    before = scrape(flaky_server)
    body = {"prompt": [FlakyEngine.POISON + 1, 5, 6], "max_tokens": 200, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{flaky_server.url}/v1/completions", json=body, timeout=TIMEOUT_S) as response:
        lines = response.iter_lines()  # kept: a dropped iterator closes the connection
        assert next(line for line in lines if line.startswith("data:"))  # a token arrived
        during = scrape(flaky_server)
        assert during["nanoserve_kv_cache_blocks_free"] < during["nanoserve_kv_cache_blocks_total"], (before, during)
    wait_for(lambda: idle_and_all_blocks_free(flaky_server), "the aborted request's blocks are back")
    after = scrape(flaky_server)
    assert after["nanoserve_requests_total{status=abort}"] == before.get("nanoserve_requests_total{status=abort}",
                                                                         0) + 1
    assert after["nanoserve_generation_tokens_total"] - before.get("nanoserve_generation_tokens_total", 0) < 200


def test_a_core_killed_mid_stream_ends_every_stream_and_health_fails(chat_checkpoint, tokenizer_cache):
    client = FlakyEngine.make_engine_client(config(chat_checkpoint))
    with ServerThread(build_app(client, served_model_name=MODEL_NAME)) as server:
        body = {"prompt": [FlakyEngine.POISON + 1, 5], "max_tokens": 200, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=TIMEOUT_S) as response:
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))
            os.kill(client.core.process.pid, signal.SIGKILL)
            rest = list(lines)  # the stream ends now, with an error event, not after a timeout
        events = [line for line in rest if line]
        assert any('"error"' in line for line in events) and events[-1] == "data: [DONE]"
        health = httpx.get(f"{server.url}/health")
        assert health.status_code == 503
        refused = httpx.post(f"{server.url}/v1/completions", json={"prompt": [5], "max_tokens": 2}, timeout=30)
        assert refused.status_code == 503 and "died" in refused.json()["error"]["message"]


def test_a_bad_config_is_one_line_from_the_core(tokenizer_cache):
    with pytest.raises(ValueError, match="kv_cache_memory_bytes"):
        LLMEngine.make_engine_client(EngineConfig(model="tiny", device="cpu", kv_cache_memory_bytes=1024))


def test_a_core_that_cannot_be_started_leaves_its_sockets_closed(monkeypatch):
    """Left to the garbage collector, a context with open sockets can block zmq_ctx_term forever (a hang at some
    later, unrelated moment): a failed start closes its own."""
    from milestones.m11_engine_core import core_client as module

    made = []

    class RecordedContext(zmq.Context):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    def cannot_start(process):
        raise OSError("no more processes")

    monkeypatch.setattr(module.zmq, "Context", RecordedContext)
    monkeypatch.setattr(multiprocessing.get_context("spawn").Process, "start", cannot_start)
    with pytest.raises(OSError, match="no more processes"):
        module.EngineCoreProcess(LLMEngine, EngineConfig(model="tiny", device="cpu"))
    assert len(made) == 1 and made[0].closed


# --------------------------------------------------------------------------- the server's process and the core's


def live_processes(field: int, value: int) -> list[int]:
    """Live processes whose /proc stat field ``field`` (after the name: 1 parent, 3 session) is ``value`` (Linux)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[field]) == value and fields[0] != "Z":
                found.append(int(entry.name))
    return found


def children_of(pid: int) -> list[int]:
    return live_processes(1, pid)


def session_members(session: int) -> list[int]:
    """Live processes of a session, wherever they were reparented."""
    return live_processes(3, session)


def is_gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(port: int) -> subprocess.Popen:
    """``python -m milestones.m11_engine_core serve`` in a session of its own (so a Ctrl-C can reach its group)."""
    command = [sys.executable, "-m", "milestones.m11_engine_core", "serve", "--model", "tiny", "--device", "cpu",
               "--max-model-len", "128", "--port", str(port), "--log-level", "warning"]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True, preexec_fn=end_with_this_process)
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        assert process.poll() is None, f"the server exited with {process.returncode}"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                return process
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["ctrl-c", "sigterm", "sigkill"])
def test_stopping_the_server_leaves_no_core_and_no_port(how, tokenizer_cache):
    port = free_port()
    server = start_server(port)
    children = children_of(server.pid)  # the engine core (and multiprocessing's helper, if it started one)
    assert children
    if how == signal.SIGINT:
        os.killpg(server.pid, how)  # Ctrl-C in a terminal reaches every process of the group
    else:
        server.send_signal(how)
    server.wait(timeout=TIMEOUT_S)
    wait_for(lambda: all(map(is_gone, children)), "every process the server started is gone", timeout_s=60)
    with socket.socket() as sock:  # the port is free again
        sock.bind(("127.0.0.1", port))


def _default_sigint_and_end_with_this_process() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a test runner's worker may ignore SIGINT, and a child inherits that
    end_with_this_process()


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_stops_the_online_benchmark_in_one_line_and_leaves_no_process(tokenizer_cache):
    """Ctrl-C reaches the benchmark's whole process group (a terminal's): it stops with exit code 130 and one line
    on stderr, no traceback from it or its workers, and its engine core and clients' worker are gone."""
    command = [sys.executable, "-m", "benchmarks.online", "--milestone", "m11", "--model", "tiny", "--device", "cpu",
               "--workload", "offline", "--max-requests", "16", "--rates", "0.5", "--no-save", "--no-progress"]
    bench = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True, preexec_fn=_default_sigint_and_end_with_this_process)
    try:
        # The offline engine is built; the clients' worker runs; the server's engine core may be starting: Ctrl-C
        # may come at any point from here on (the stream of 16 requests at 0.5/s lasts half a minute).
        assert "m11_engine_core" in bench.stdout.readline()
        os.killpg(bench.pid, signal.SIGINT)
        _, stderr = bench.communicate(timeout=TIMEOUT_S)
        assert bench.returncode == 130, stderr
        assert "Traceback" not in stderr and "interrupted: 0 of 1 targets finished" in stderr, stderr
        wait_for(lambda: not session_members(bench.pid), "every process the benchmark started is gone", timeout_s=60)
    finally:
        if bench.poll() is None:
            os.killpg(bench.pid, signal.SIGKILL)
            bench.wait()


def test_online_alternate_compares_each_burst_with_an_offline_run_just_before(tmp_path, tokenizer_cache,
                                                                             monkeypatch):
    from benchmarks import online as online_module
    from benchmarks.online import main as online

    variants = []  # every prompt variant a run sent: warm-up, offline runs, bursts
    requests_of = online_module.requests_of
    monkeypatch.setattr(online_module, "requests_of", lambda specs, k: variants.append(k) or requests_of(specs, k))
    (result,) = online(["--milestone", "m11", "--model", "tiny", "--device", "cpu", "--workload", "offline",
                        "--max-requests", "3", "--max-tokens", "3", "--rates", "inf", "--offline-reference",
                        "--alternate", "2", "--kv-cache-memory-bytes", "8M", "--max-num-seqs", "4",
                        "--out-dir", str(tmp_path), "--no-progress"])
    saved = json.loads((tmp_path / "cpu" / "online_m11_offline.json").read_text())
    assert len(saved["alternations"]) == 2
    for alternation in saved["alternations"]:
        assert alternation["offline_reference"]["output_tokens"] == 9
        (burst,) = alternation["runs"]
        assert burst["rate"] == "inf" and burst["summary"]["completed_full_length"] == 3
        assert burst["summary"]["cached_tokens"] == 0  # every run, offline or served, sent prompts of its own
        assert alternation["burst_vs_offline"] == pytest.approx(
            burst["summary"]["output_tokens_per_s"] / alternation["offline_reference"]["output_tokens_per_s"])
    assert saved["burst_vs_offline"] == pytest.approx(statistics.median(
        a["burst_vs_offline"] for a in saved["alternations"]))
    assert saved["runs"] == saved["alternations"][0]["runs"] and result["burst_vs_offline_of_medians"] > 0
    assert saved["offline_burst_correlation"] is None  # two pairs say nothing about it
    assert sorted(variants) == [-2, -1, 0, 1, 2]  # warm-up -1, offline 0 and -2, bursts 1 and 2: none sent twice
    # the offline engine ran in a process of its own, as the server's engine core does, not in the benchmark's
    assert saved["offline_engine"].startswith("a process of its own (pid ")
    assert f"(pid {os.getpid()})" not in saved["offline_engine"]


def pair(offline_tps: float, burst_tps: float | None, completed: int = 4) -> dict:
    summary = {"num_requests": 4, "completed_full_length": completed, "output_tokens_per_s": burst_tps}
    ratio = burst_tps / offline_tps if completed == 4 and burst_tps else None
    return {"offline_reference": {"output_tokens_per_s": offline_tps}, "runs": [{"summary": summary}],
            "burst_vs_offline": ratio}


def test_alternations_report_pairs_whose_burst_completed_and_refuse_when_none_did():
    from benchmarks.online import summarize_alternations

    figures = summarize_alternations([pair(100, 90), pair(200, 200), pair(100, 95), pair(100, 10, completed=3)])
    assert figures["burst_vs_offline"] == pytest.approx(0.95)  # the short burst's pair is left out
    assert figures["burst_vs_offline_of_medians"] == pytest.approx(95 / 100)
    assert figures["offline_burst_correlation"] == pytest.approx(statistics.correlation([100, 200, 100], [90, 200, 95]))
    with pytest.raises(RuntimeError, match="no burst completed every request"):
        summarize_alternations([pair(100, 10, completed=3), pair(100, None)])


ALTERNATE_FLAGS = ["--model", "tiny", "--offline-reference", "--alternate", "2", "--no-save"]


@pytest.mark.parametrize("flags, message", [
    (["--milestone", "m10", "--rates", "inf", "--kv-cache-memory-bytes", "8M"],
     "needs an engine core in a process of its own"),
    (["--milestone", "m11", "--rates", "inf"], "give both the same K/V cache with --kv-cache-memory-bytes"),
    (["--milestone", "m11", "--rates", "inf,8", "--kv-cache-memory-bytes", "8M"], "and --rates inf"),
    (["--milestone", "hf-static", "--rates", "inf", "--kv-cache-memory-bytes", "8M"], "'hf-static' is not one"),
])
def test_online_alternate_is_refused_in_one_line_where_it_cannot_compare_alike(flags, message, capsys):
    from benchmarks.online import main as online

    with pytest.raises(SystemExit) as exited:
        online([*flags, *ALTERNATE_FLAGS])
    assert exited.value.code == 2 and message in capsys.readouterr().err
