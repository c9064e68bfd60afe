"""Tables for humans, as GitHub markdown: the runs (a comparison member's median run), each comparison's ratios
(``median (min-max)`` over its interleaved pairs), the float32 gate, and token agreement with the previous
milestone in the measured dtype. Ratios between single runs are ``python -m milestones``' job (``gains.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from tabulate import tabulate

from .compare import comparison_ratios
from .gate import gate_failed


def _num(value, fmt: str = ".1f", scale: float = 1.0) -> str:
    return "-" if value is None else format(value * scale, fmt)


_ms = partial(_num, fmt=".2f", scale=1e3)  # seconds, shown in milliseconds
_mib = partial(_num, fmt=".0f", scale=2**-20)  # bytes, shown in MiB


def _table(rows: list[list], headers: Sequence[str], empty: str | None = None) -> str:
    """A GitHub markdown table, or ``empty`` where there are no rows (if given)."""
    return tabulate(rows, headers=headers, tablefmt="github") if rows or empty is None else empty


def summary_rows(results: Sequence[dict]) -> list[list]:
    rows = []
    for r in results:
        m = r.get("metrics") or {}
        wl = r.get("workload") or {}
        n = f"{wl.get('num_requests')}/{wl.get('num_requests_total')}" if wl.get("slice") else wl.get("num_requests")
        runs = len(r.get("repeats") or []) or 1
        spread = (r.get("spread") or {}).get("metrics.output_tokens_per_s") if runs > 1 else None
        tps = _num(m.get("output_tokens_per_s")) + (f" ({spread[0]:.1f}-{spread[1]:.1f})" if spread else "")
        rows.append([r["name"], r["status"], n, runs, tps, _num(m.get("wall_time_s"), ".2f"),
                     *(_ms(m.get(f"{k}_s")) for k in ("ttft_p50", "itl_mean", "itl_p50", "itl_p99", "itl_max")),
                     _num(m.get("running_mean")),
                     *(_mib(m.get(k)) for k in ("kv_reserved_peak_bytes", "kv_used_peak_bytes",
                                                "cuda_max_memory_allocated_bytes"))])
    return rows


SUMMARY_HEADERS = ["run", "status", "requests", "runs", "out tok/s", "wall s", "TTFT p50 ms", "ITL mean ms",
                   "ITL p50 ms", "ITL p99 ms", "ITL max ms", "running mean", "KV reserved MiB", "KV used MiB",
                   "GPU peak MiB"]


def summary_table(results: Sequence[dict]) -> str:
    """Runs table; ``out tok/s`` of a comparison member is its median run, with the min-max of its runs."""
    parts = [_table(summary_rows(results), SUMMARY_HEADERS)]
    for r in results:
        if r.get("sweep"):
            parts += [f"\n{r['name']}: per-token latency vs prompt length",
                      _table([[s["prompt_len"], _ms(s["ttft_s"]), _ms(s["itl_mean_s"]), _ms(s["itl_max_s"])]
                              for s in r["sweep"]], ["prompt", "TTFT ms", "ITL mean ms", "ITL max ms"])]
        if r.get("groups"):
            parts += [f"\n{r['name']}: per group",
                      _table([[g, s["num_requests"], *(_ms(s[k]) for k in ("ttft_p50_s", "itl_p50_s", "itl_p99_s",
                                                                            "itl_max_s"))]
                              for g, s in r["groups"].items()],
                             ["group", "requests", "TTFT p50 ms", "ITL p50 ms", "ITL p99 ms", "ITL max ms"])]
    return "\n".join(parts)


def comparison_rows(results: Sequence[dict]) -> list[list]:
    """``[label, "median (min-max)", pairs, residency]`` for every member against its comparison's reference."""
    return [[f"{r['numerator']} / {r['denominator']}: {r['metric'].split('.', 1)[1]}, {c['workload']}",
             f"{r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})", r["n"], c["residency"]]
            for c in comparison_ratios(results) for r in c["ratios"]]


def gate_banner(records: Sequence[dict]) -> str | None:
    parts = []
    for r in gate_failed(records):
        diverged = [q for q in r.get("requests") or [] if q.get("verdict") == "diverged"]
        if diverged:
            q = diverged[0]
            gap = q.get("logit_gap_ours")
            parts.append(f"{r['label']}: request {q['index']} diverges at token {q.get('first_divergence')}"
                         + (f" (logit gap {gap:.3g})" if gap is not None else f" ({q.get('note')})"))
        else:
            parts.append(f"{r['label']}: {r.get('error')}")
    return "**GATE FAILED (float32 tokens differ from transformers): " + "; ".join(parts) + "**" if parts else None


def gate_rows(records: Sequence[dict]) -> list[list]:
    rows = []
    for r in records:
        requests = r.get("requests") or []
        ties = [q for q in requests if q.get("verdict") == "near-tie"]
        note = r.get("error") or "; ".join(f"request {q['index']}: near-tie at token {q['first_divergence']}, gap "
                                           f"{q['logit_gap_ours']:.2g} (top-2 gap {q['logit_gap_top2']:.2g})"
                                           for q in ties)
        matched = sum(q.get("verdict") == "match" for q in requests)
        rows.append([r["label"], r["status"], f"{matched}/{len(requests)}" if requests else "-",
                     r.get("mode") or "-", note or ""])
    return rows


def agreement_rows(results: Sequence[dict]) -> list[list]:
    """mNN against mNN-1 on the same requests in this call: the fraction of requests with identical tokens."""
    runs = {}
    for r in results:
        hashes = (r.get("tokens") or {}).get("per_request")
        if r.get("status") == "ok" and hashes and "+" not in r["name"] and r["milestone"][1:].isdigit():
            wl = r["workload"]
            runs[(int(r["milestone"][1:]), wl["name"], wl["num_requests"])] = r
    rows = []
    for (number, workload, n), r in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        previous = runs.get((number - 1, workload, n))
        if previous is None:
            continue
        a, b = r["tokens"]["per_request"], previous["tokens"]["per_request"]
        same = sum(x == y for x, y in zip(a, b))
        rows.append([f"{r['milestone']} vs {previous['milestone']}", workload, r["model"]["dtype"],
                     f"{same}/{len(a)}", f"{same / len(a):.0%}"])
    return rows


def report(results: Sequence[dict], gate: Sequence[dict] = ()) -> str:
    """The whole markdown summary of a call: gate, runs, comparisons, token agreement, skipped runs."""
    ran = [r for r in results if r.get("status") != "skipped"]
    skipped = [r for r in results if r.get("status") == "skipped"]
    banner = gate_banner(gate)
    parts = [banner, ""] if banner else []
    parts += ["## Correctness gate (float32, against transformers)", "",
              _table(gate_rows(gate), ["engine:workload", "gate", "identical", "driven by", "note"],
                     "(no gate in this call)"), ""]
    parts += ["## Runs", "", summary_table(ran) if ran else "(none ran)", ""]
    parts += ["## Interleaved comparisons", "",
              _table(comparison_rows(results), ["ratio (interleaved repeats)", "median (min-max)", "pairs", "engines"],
                     "(no interleaved comparison in this call)"), ""]
    parts += ["## Same tokens as the previous milestone", "",
              _table(agreement_rows(results), ["milestones", "workload", "dtype", "same tokens", "fraction"],
                     "(no milestone ran beside its predecessor on the same requests)"), ""]
    gate_skipped = [g for g in gate if g.get("status") == "skipped"]
    if skipped or gate_skipped:
        parts += ["## Skipped", ""] + [f"- {r['name']}: {r['error']}" for r in skipped]
        parts += [f"- gate {g['label']}: {g['error']}" for g in gate_skipped] + [""]
    return "\n".join(parts)
