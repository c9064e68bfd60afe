"""The demos (``python -m milestones.mNN_...``) run end to end on a CPU with tiny sizes and print their tables.

They also check two claims the docs make with exact counts: m01 computes ``N*P + N*(N-1)/2`` token positions
for one request (the whole sequence at every step), m02 computes ``P + N - 1`` (the prompt once, then one
token per step; the last token is never fed back).
"""

from __future__ import annotations

from milestones.m01_naive_loop.__main__ import main as m01_demo
from milestones.m01_naive_loop.demo import print_table, random_prompts, speedup
from milestones.m02_kv_cache.__main__ import main as m02_demo


def test_m01_demo_prints_text_and_latency_table(capsys):
    rows = m01_demo(["--device", "cpu", "--max-tokens", "4", "--prompt-lens", "8,32"])
    out = capsys.readouterr().out
    assert "random weights" in out and "generated:" in out
    assert "ms/token (mean ITL)" in out and "prompt 32" in out
    assert [r["prompt tokens"] for r in rows] == [8, 32]
    for row in rows:
        p, n = row["prompt tokens"], row["output tokens"]
        assert n == 4
        assert row["tokens computed"] == n * p + n * (n - 1) // 2


def test_m02_demo_matches_m01_with_fewer_tokens_computed(capsys):
    rows = m02_demo(["--device", "cpu", "--num-prompts", "2", "--prompt-len", "16", "--max-tokens", "4"])
    out = capsys.readouterr().out
    assert "identical tokens (greedy): yes" in out
    assert "m02_kv_cache:" in out and "lower ms/token (mean ITL) than m01_naive_loop" in out
    m01, m02 = rows
    assert m01["tokens computed"] == 2 * (4 * 16 + 4 * 3 // 2)
    assert m02["tokens computed"] == 2 * (16 + 4 - 1)
    assert m02["KV reserved peak (MiB)"] > 0


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
    assert speedup(rows, "a", "tok/s") == {"b": 4.0}
    assert speedup(rows, "a", "ms", lower_is_better=True) == {"b": 4.0}
