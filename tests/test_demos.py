"""The demos (``python -m milestones.mNN_...``) run end to end on a CPU with tiny sizes and print their tables.

They also check two claims the docs make with exact counts: m01 computes ``N*P + N*(N-1)/2`` token positions
for one request (the whole sequence at every step), m02 computes ``P + N - 1`` (the prompt once, then one
token per step; the last token is never fed back). The shared helpers are checked for how they measure
(validation before the warm-up, interleaved rounds, ratios taken within a round), never for what a timing is.
"""

from __future__ import annotations

import pytest
import torch
from conftest import VOCAB

from milestones.common.demo import (TTFT_NOTE, Case, Ratio, demo_parser, interleaved_rounds, measure, parse_args,
                                    print_table, random_prompts, speedup)
from milestones.m01_naive_loop import SamplingParams
from milestones.m01_naive_loop.__main__ import main as m01_demo
from milestones.m02_kv_cache.__main__ import main as m02_demo
from milestones.m03_static_batching.__main__ import main as m03_demo
from milestones.m04_continuous_batching.__main__ import main as m04_demo
from milestones.m13_quantization.__main__ import main as m13_demo


@pytest.fixture(autouse=True)
def keep_torch_threads():
    """A demo sets torch's CPU thread count (``--threads``); give the rest of the session its own back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_threads_flag_sets_torchs_cpu_threads():
    parse_args(demo_parser("x"), ["--threads", "3"])
    assert torch.get_num_threads() == 3
    before = torch.get_num_threads()
    assert parse_args(demo_parser("x"), ["--threads", "0"]).threads == 0  # 0: leave torch's setting alone
    assert torch.get_num_threads() == before


def test_m01_demo_prints_text_and_latency_table(capsys):
    rows = m01_demo(["--device", "cpu", "--max-tokens", "4", "--prompt-lens", "8,32", "--repeats", "2"])
    out = capsys.readouterr().out
    assert "random weights" in out and "generated:" in out
    assert "ms/token (mean ITL)" in out and "prompt 32" in out
    assert "the median of 2 interleaved runs" in out and TTFT_NOTE in out
    assert "prompt 32: " in out and "the ms/token (mean ITL) of prompt 8" in out
    assert [r["prompt tokens"] for r in rows] == [8, 32]
    for row in rows:
        p, n = row["prompt tokens"], row["output tokens"]
        assert n == 4 and len(row["_runs"]) == 2
        assert row["tokens computed"] == n * p + n * (n - 1) // 2


def test_m02_demo_matches_m01_with_fewer_tokens_computed(capsys):
    rows = m02_demo(["--device", "cpu", "--num-prompts", "2", "--prompt-len", "16", "--max-tokens", "4",
                     "--repeats", "2"])
    out = capsys.readouterr().out
    assert "identical tokens (greedy): yes" in out
    assert "m02_kv_cache:" in out and "lower ms/token (mean ITL) than m01_naive_loop" in out
    assert TTFT_NOTE in out
    m01, m02 = rows
    assert m01["tokens computed"] == 2 * (4 * 16 + 4 * 3 // 2)
    assert m02["tokens computed"] == 2 * (16 + 4 - 1)
    assert m02["KV reserved peak (MiB)"] > 0


@pytest.fixture
def small_model(tied_checkpoint, tokenizer_cache) -> str:
    return str(tied_checkpoint[0])


def test_m03_demo_counts_the_padding_it_wastes(capsys, small_model):
    rows = m03_demo(["--model", small_model, "--device", "cpu", "--num-prompts", "5", "--max-num-seqs", "2",
                     "--min-prompt-len", "3", "--max-prompt-len", "9", "--min-tokens", "2", "--max-tokens", "6",
                     "--repeats", "1"])
    out = capsys.readouterr().out
    assert "identical tokens (greedy): yes" in out and TTFT_NOTE in out
    m02, m03 = rows
    assert m02["output tokens"] == m03["output tokens"]
    # m03 computes exactly m02's positions plus the waste it counts (left padding, finished rows).
    assert m03["tokens computed"] - m03["_stats"].padding_tokens == m02["tokens computed"]
    assert m03["_stats"].padding_tokens > 0


def test_m04_demo_runs_both_engines_on_the_skewed_workload(capsys, small_model):
    rows = m04_demo(["--model", small_model, "--device", "cpu", "--num-prompts", "6", "--max-num-seqs", "2",
                     "--prompt-len", "8", "--short-tokens", "2", "--long-tokens", "9", "--long-every", "3",
                     "--repeats", "1"])
    out = capsys.readouterr().out
    assert "identical tokens (greedy): yes" in out and TTFT_NOTE in out
    m03, m04 = rows
    assert m03["output tokens"] == m04["output tokens"] == 2 * 9 + 4 * 2
    assert m04["useful fraction"] == 1.0 > m03["useful fraction"]


def test_m13_demo_shows_bytes_and_the_logit_error_of_each_mode(capsys, small_model):
    rows = m13_demo(["--model", small_model, "--device", "cpu", "--modes", "int8,fp8-kv", "--num-prompts", "2",
                     "--prompt-len", "6", "--max-tokens", "3", "--step-tokens", "3", "--repeats", "1"])
    out = capsys.readouterr().out
    assert "K/V bytes per token" in out and "rel. RMS error" in out and "top-1 agreement" in out
    assert "greedy tokens identical to the unquantized engine's: int8" in out
    assert [row["label"] for row in rows][1:] == ["m13 int8", "m13 fp8-kv"] and rows[0]["label"].endswith("(float32)")
    assert all(float(row["rel. RMS error"]) > 0 for row in rows[1:])  # lossy: the logits moved, a little
    assert rows[0]["output tokens"] == rows[1]["output tokens"] == 3


def test_random_prompts_are_seeded_and_below_special_ids():
    a = random_prompts(200_000, 5, 3, 9, seed=1)
    assert a == random_prompts(200_000, 5, 3, 9, seed=1) != random_prompts(200_000, 5, 3, 9, seed=2)
    assert all(3 <= len(p) <= 9 for p in a)
    assert all(0 <= t < 151_643 for p in a for t in p)
    assert all(t < 100 for p in random_prompts(100, 5, 3, 9, seed=1) for t in p)


def test_print_table_hides_private_keys_and_speedup_ratios(capsys):
    rows = [{"label": "a", "tok/s": 10.0, "ms": 8.0, "_outputs": ["secret"]},
            {"label": "b", "tok/s": 40.0, "ms": 2.0, "_outputs": ["secret"]}]
    print_table(rows, "title")
    out = capsys.readouterr().out
    assert "title" in out and "tok/s" in out and "40.00" in out
    assert "secret" not in out and "_outputs" not in out
    assert "TTFT" not in out and "median" not in out  # notes only where they apply
    assert speedup(rows, "a", "tok/s") == {"b": Ratio(4.0, 4.0, 4.0)}
    assert speedup(rows, "a", "ms", lower_is_better=True) == {"b": Ratio(4.0, 4.0, 4.0)}
    assert str(Ratio(4.0, 4.0, 4.0)) == "4.0x"


def test_speedup_pairs_the_runs_of_each_round():
    """Round by round: 8/2, 10/5, 6/3 -> 4, 2, 2. The median of the rounds (2.0x) is not the ratio of the
    medians (8/3 = 2.7x): a slow round slows both rows and cancels out of its own ratio."""
    rows = [{"label": "a", "ms/token (mean ITL)": 8.0, "_runs": [{"ms/token (mean ITL)": v} for v in (8, 10, 6)]},
            {"label": "b", "ms/token (mean ITL)": 3.0, "_runs": [{"ms/token (mean ITL)": v} for v in (2, 5, 3)]}]
    ratio = speedup(rows, "a", "ms/token (mean ITL)", lower_is_better=True)["b"]
    assert ratio == Ratio(2.0, 2.0, 4.0)
    assert str(ratio) == "2.0x (runs: 2.0x-4.0x)"
    rows[1]["_runs"][0]["ms/token (mean ITL)"] = None  # e.g. max_tokens=1: no inter-token latency that round
    assert speedup(rows, "a", "ms/token (mean ITL)", lower_is_better=True)["b"] == Ratio(2.0, 2.0, 2.0)


def test_measure_validates_every_case_before_any_work(tied_checkpoint, engine_factory):
    engine = engine_factory("m02_kv_cache", tied_checkpoint[0])
    calls = []
    handle = engine.model.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        good = Case("good", engine, [[4, 5]], SamplingParams(max_tokens=2))
        bad = Case("bad", engine, [[4, 5], [6, VOCAB]], SamplingParams(max_tokens=2))
        with pytest.raises(ValueError, match=r"^bad: prompt 1: token ids \[512\]"):
            measure([good, bad], repeats=1)
        assert calls == []  # not even the warm-up ran
    finally:
        handle.remove()


def test_measure_warm_up_fits_whatever_the_first_prompt_fits(tied_checkpoint, engine_factory):
    """A first prompt one token short of max_model_len, with max_tokens=1: the warm-up must not ask for more
    (a warm-up of max_tokens=2 would fail, and its error would blame the user's prompt)."""
    engine = engine_factory("m02_kv_cache", tied_checkpoint[0])
    (row,) = measure([Case("edge", engine, [[7] * (engine.max_model_len - 1)], SamplingParams(max_tokens=1))],
                     repeats=1)
    assert row["output tokens"] == 1


def test_measure_interleaves_the_cases(tied_checkpoint, engine_factory):
    engines = {"A": engine_factory("m01_naive_loop", tied_checkpoint[0]),
               "B": engine_factory("m02_kv_cache", tied_checkpoint[0])}
    order = []
    handles = [e.model.register_forward_pre_hook(lambda module, args, label=label: order.append(label))
               for label, e in engines.items()]
    try:
        params = SamplingParams(max_tokens=2, ignore_eos=True)
        rows = measure([Case(label, e, [[4, 5, 6]], params) for label, e in engines.items()], repeats=3)
    finally:
        for handle in handles:
            handle.remove()
    runs = [label for i, label in enumerate(order) if i == 0 or order[i - 1] != label]
    assert runs == ["A", "B"] + ["A", "B"] * 3  # one warm-up each, then A, B in every round
    assert [len(r["_runs"]) for r in rows] == [3, 3]
    assert rows[0]["_outputs"][0].token_ids == rows[1]["_outputs"][0].token_ids


def test_measure_starts_every_round_with_an_empty_prefix_cache(tied_checkpoint, engine_factory):
    """Round 2 must not find round 1's prompts cached (nor the warm-up's): it computes what round 1 did."""
    import importlib.util

    if importlib.util.find_spec("milestones.m06_prefix_cache") is None:
        pytest.skip("no m06 yet")
    engine = engine_factory("m06_prefix_cache", tied_checkpoint[0], max_num_seqs=4, kv_cache_tokens=1024)
    shared = list(range(10, 58))  # three full blocks of 16 shared by every prompt
    prompts = [shared + [100 + i, 200 + i] for i in range(4)]
    (row,) = measure([Case("m06", engine, prompts, SamplingParams(max_tokens=2, ignore_eos=True))], repeats=2)
    first, second = (run["_stats"] for run in row["_runs"])
    assert first.prompt_tokens_computed == second.prompt_tokens_computed < sum(len(p) for p in prompts)
    assert first.prefix_cache_hit_rate == second.prefix_cache_hit_rate > 0  # prompts 1-3 hit prompt 0's blocks
    assert engine.reset_prefix_cache() is True and engine.block_manager.cached_blocks == {}


def test_interleaved_rounds_keeps_counters_and_takes_the_median_of_timings():
    calls = []

    def run(label, times):
        def one_round():
            calls.append(label)
            return {"label": label, "steps": 7, "wall s": times[len([c for c in calls if c == label]) - 1],
                    "note": "x", "_outputs": [label]}
        return one_round

    a, b = interleaved_rounds([run("a", [3.0, 1.0, 2.0]), run("b", [5.0, 5.0, 9.0])], repeats=3)
    assert calls == ["a", "b"] * 3
    assert (a["wall s"], b["wall s"]) == (2.0, 5.0)
    assert a["steps"] == 7 and type(a["steps"]) is int and a["note"] == "x" and a["_outputs"] == ["a"]
    assert [r["wall s"] for r in b["_runs"]] == [5.0, 5.0, 9.0]


@pytest.mark.parametrize("name, argv", [
    ("m05_paged_blocks", ["--num-prompts", "4", "--prompt-len", "6", "--max-tokens", "8", "--median-tokens", "2",
                          "--block-size", "4"]),
    ("m07_chunked_prefill", ["--num-decoders", "2", "--decoder-tokens", "4", "--num-long", "1", "--long-len", "24",
                             "--every", "2", "--budgets", "8"]),
])
def test_captured_output_has_no_cursor_movements(tied_checkpoint, tokenizer_cache, capsys, name, argv):
    """Piped or in a notebook, a demo's output is plain text: one progress bar at a time, never nested bars
    that move the cursor up (the ``ESC[A`` codes tqdm writes for them)."""
    import importlib

    demo = importlib.import_module(f"milestones.{name}.__main__")
    demo.main(["--model", str(tied_checkpoint[0]), "--device", "cpu", "--repeats", "1", *argv])
    out, err = capsys.readouterr()
    assert "\x1b[A" not in out + err and "identical tokens (greedy): yes" in out


def test_m11_demo_serves_the_same_burst_from_both_servers(capsys, small_model):
    """Two servers (m10's engine thread, m11's engine core process): same text, every token counted."""
    from milestones.m11_engine_core.__main__ import main as m11_demo

    rows = m11_demo(["--model", small_model, "--device", "cpu", "--num-requests", "3", "--prompt-len", "5",
                     "--max-tokens", "4", "--max-num-seqs", "4", "--repeats", "1"])
    out = capsys.readouterr().out
    assert "engine core: process" in out and "same text from both servers (greedy): yes" in out
    assert [row["label"] for row in rows] == ["m10 server (engine thread)", "m11 server (engine core process)"]
    assert all(row["requests"] == 3 and row["output tokens"] == 3 * 4 for row in rows)


def test_m12_demo_times_a_step_with_and_without_overlap_and_agrees(capsys, small_model):
    from milestones.m12_async_scheduling.__main__ import main as m12_demo

    rows = m12_demo(["--model", small_model, "--device", "cpu", "--num-requests", "3", "--prompt-len", "5",
                     "--max-tokens", "5", "--timeline-steps", "2", "--repeats", "1"])
    out = capsys.readouterr().out
    assert "same tokens: yes" in out and "nothing can overlap" in out  # on a CPU the demo says why both cost the same
    timeline, e2e = rows[:2], rows[2:]
    assert [row["running"] for row in timeline] == [3, 3]
    assert all(row["waiting for the GPU (ms/step)"] is None for row in timeline)  # a CPU waits for nothing
    assert [row["output tokens"] for row in e2e] == [15, 15]


def test_m12_demo_refuses_a_timeline_longer_than_the_answers(capsys):
    from milestones.m12_async_scheduling.__main__ import main as m12_demo

    with pytest.raises(SystemExit) as exit_info:
        m12_demo(["--device", "cpu", "--max-tokens", "4", "--timeline-steps", "4"])
    assert exit_info.value.code == 2
    assert "--timeline-steps (4) must be below --max-tokens (4)" in capsys.readouterr().err


def test_m14_demo_shows_the_shards_the_all_reduces_and_both_splits(tied_checkpoint, tokenizer_cache, capsys):
    """Two gloo ranks on the CPU: each rank's half of a layer, exactly two all-reduces per layer per step (from the
    profiler), and TP=2's tokens equal TP=1's."""
    from milestones.m14_tensor_parallel.__main__ import main as m14_demo

    rows = m14_demo(["--model", str(tied_checkpoint[0]), "--device", "cpu", "--num-prompts", "2", "--prompt-len", "6",
                     "--max-tokens", "4", "--repeats", "1"])
    out = capsys.readouterr().out
    assert "same tokens: yes" in out and "all-reduces (2 per layer" in out
    shards = [r for r in rows if "q/k/v (packed)" in r]
    assert [r["rank"] for r in shards] == ["TP=1", 0, 1]
    assert shards[1]["q/k/v (packed)"] == shards[2]["q/k/v (packed)"] == "64x64"  # half of TP=1's 128x64
    assert shards[0]["q/k/v (packed)"] == "128x64" and shards[2]["LM head"] == "none"
    all_reduce = next(r for r in rows if r.get("collective (rank 0)") == "all-reduce")
    assert all_reduce["calls per step"] == 2 * 2  # 2 layers
