"""Tables for humans: what a call (or a ``benchmarks.run`` invocation) measured, as GitHub markdown.

* ``summary_table``: one row per run (median repeat for comparisons), plus per-group and per-length tables;
* ``comparison_table``: each comparison's ratios, ``median (min-max)`` over its interleaved repeat pairs;
* ``gate_table`` / ``gate_banner``: the float32 correctness gate, and a loud line when it failed;
* ``agreement_table``: in the measured dtype, the fraction of requests whose tokens equal the previous
  milestone's on the same workload in the same call (from the per-request token hashes);
* ``ratio_table``: fixed ratios between single runs, from this call or earlier files. Those are not
  interleaved and can move 15-40% between calls: the comparisons are the figures to quote.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from .compare import _lookup, pair_ratios, summarize_ratios
from .workloads import WORKLOADS, get_workload


def _ms(value) -> str:
    return "-" if value is None else f"{value * 1e3:.2f}"


def _mib(value) -> str:
    return "-" if value is None else f"{value / 2**20:.0f}"


def _num(value, fmt: str = ".1f") -> str:
    return "-" if value is None else format(value, fmt)


def summary_rows(results: Sequence[dict]) -> list[list]:
    rows = []
    for r in results:
        m = r.get("metrics") or {}
        wl = r.get("workload") or {}
        n = f"{wl.get('num_requests')}/{wl.get('num_requests_total')}" if wl.get("slice") else wl.get("num_requests")
        spread = (r.get("spread") or {}).get("metrics.output_tokens_per_s")
        tps = _num(m.get("output_tokens_per_s"))
        if spread and len(r.get("repeats") or []) > 1:
            tps += f" ({spread[0]:.1f}-{spread[1]:.1f})"
        runs = len(r.get("repeats") or []) or 1
        rows.append([r["name"], r["status"], n, runs, tps, _num(m.get("wall_time_s"), ".2f"),
                     _ms(m.get("ttft_p50_s")), _ms(m.get("itl_mean_s")), _ms(m.get("itl_p50_s")),
                     _ms(m.get("itl_p99_s")), _ms(m.get("itl_max_s")), _num(m.get("running_mean")),
                     _mib(m.get("kv_reserved_peak_bytes")), _mib(m.get("kv_used_peak_bytes")),
                     _mib(m.get("cuda_max_memory_allocated_bytes"))])
    return rows


SUMMARY_HEADERS = ["run", "status", "requests", "runs", "out tok/s", "wall s", "TTFT p50 ms", "ITL mean ms",
                   "ITL p50 ms", "ITL p99 ms", "ITL max ms", "running mean", "KV reserved MiB", "KV used MiB",
                   "GPU peak MiB"]


def summary_table(results: Sequence[dict]) -> str:
    """Runs table; ``out tok/s`` of a comparison member is its median run, with the min-max of its runs."""
    from tabulate import tabulate

    text = tabulate(summary_rows(results), headers=SUMMARY_HEADERS, tablefmt="github")
    extra = []
    for r in results:
        if r.get("sweep"):
            extra.append(f"\n{r['name']}: per-token latency vs prompt length")
            extra.append(tabulate([[s["prompt_len"], _ms(s["ttft_s"]), _ms(s["itl_mean_s"]), _ms(s["itl_max_s"])]
                                   for s in r["sweep"]],
                                  headers=["prompt", "TTFT ms", "ITL mean ms", "ITL max ms"], tablefmt="github"))
        if r.get("groups"):
            extra.append(f"\n{r['name']}: per group")
            extra.append(tabulate([[g, s["num_requests"], _ms(s["ttft_p50_s"]), _ms(s["itl_p50_s"]),
                                    _ms(s["itl_p99_s"]), _ms(s["itl_max_s"])] for g, s in r["groups"].items()],
                                  headers=["group", "requests", "TTFT p50 ms", "ITL p50 ms", "ITL p99 ms",
                                           "ITL max ms"], tablefmt="github"))
    return "\n".join([text, *extra])


# --------------------------------------------------------------------------- interleaved comparisons


def comparison_rows(results: Sequence[dict]) -> list[list]:
    """``[label, "median (min-max)", runs, comparison]`` for every member against its comparison's reference."""
    groups: dict[str, list[dict]] = {}
    for r in results:
        if r.get("comparison") and r.get("repeats"):
            groups.setdefault(r["comparison"]["id"], []).append(r)
    rows = []
    for cid, members in groups.items():
        info = members[0]["comparison"]
        by_label = {r["comparison"]["label"]: r for r in members}
        reference = by_label.get(info["reference"])
        if reference is None:
            continue
        for label in info["members"][1:]:
            member = by_label.get(label)
            if member is None:
                continue
            for metric in info.get("ratio_metrics") or ["metrics.output_tokens_per_s"]:
                s = summarize_ratios(pair_ratios(member, reference, metric))
                if s is None:
                    continue
                rows.append([f"{label} / {info['reference']}: {metric.split('.', 1)[1]}, {info['workload']}",
                             f"{s['median']:.2f}x ({s['min']:.2f}-{s['max']:.2f})", s["n"], info["residency"]])
    return rows


def comparison_table(results: Sequence[dict]) -> str:
    from tabulate import tabulate

    rows = comparison_rows(results)
    if not rows:
        return "(no interleaved comparison in this call)"
    return tabulate(rows, headers=["ratio (interleaved repeats)", "median (min-max)", "pairs", "engines"],
                    tablefmt="github")


# --------------------------------------------------------------------------- the gate and token agreement


def gate_banner(records: Sequence[dict]) -> str | None:
    failed = [r for r in records if r.get("status") in ("fail", "error")]
    if not failed:
        return None
    parts = []
    for r in failed:
        diverged = [q for q in r.get("requests") or [] if q.get("verdict") == "diverged"]
        if diverged:
            q = diverged[0]
            gap = q.get("logit_gap_ours")
            parts.append(f"{r['label']}: request {q['index']} diverges at token {q.get('first_divergence')}"
                         + (f" (logit gap {gap:.3g})" if gap is not None else f" ({q.get('note')})"))
        else:
            parts.append(f"{r['label']}: {r.get('error')}")
    return "**GATE FAILED (float32 tokens differ from transformers): " + "; ".join(parts) + "**"


def gate_table(records: Sequence[dict]) -> str:
    from tabulate import tabulate

    if not records:
        return "(no gate in this call)"
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
    return tabulate(rows, headers=["engine:workload", "gate", "identical", "driven by", "note"], tablefmt="github")


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


def agreement_table(results: Sequence[dict]) -> str:
    from tabulate import tabulate

    rows = agreement_rows(results)
    if not rows:
        return "(no milestone ran beside its predecessor on the same requests)"
    return tabulate(rows, headers=["milestones", "workload", "dtype", "same tokens", "fraction"], tablefmt="github")


# --------------------------------------------------------------------------- fixed ratios between single runs

# (label, numerator run, denominator run, metric). Metrics: "metrics.<key>", "sweep.<prompt_len>.<key>",
# "groups.<group>.<key>". Results of this call are used first, then earlier files in <out>/<gpu-slug>/.
RATIOS = [
    ("m01 / m02 ITL mean, single (512 prompt)", "m01_single", "m02_single", "metrics.itl_mean_s"),
    ("m01 / m02 ITL mean, sweep at 64", "m01_single-sweep", "m02_single-sweep", "sweep.64.itl_mean_s"),
    ("m01 / m02 ITL mean, sweep at 2048", "m01_single-sweep", "m02_single-sweep", "sweep.2048.itl_mean_s"),
    ("m02 / m01 out tok/s, offline (slices)", "m02_offline", "m01_offline", "metrics.output_tokens_per_s"),
    ("m03 / m02 out tok/s, offline (m02 on a slice)", "m03_offline", "m02_offline", "metrics.output_tokens_per_s"),
    ("m04 / m03 out tok/s, offline", "m04_offline", "m03_offline", "metrics.output_tokens_per_s"),
    ("m04 / m03 out tok/s, nanovllm", "m04_nanovllm", "m03_nanovllm", "metrics.output_tokens_per_s"),
    ("m03 useful token fraction, offline", "m03_offline", None, "metrics.useful_token_fraction"),
    ("m04 useful token fraction, offline", "m04_offline", None, "metrics.useful_token_fraction"),
    ("m03 / hf-static out tok/s, offline", "m03_offline", "hf-static_offline", "metrics.output_tokens_per_s"),
    ("m04 / hf-cb out tok/s, offline", "m04_offline", "hf-cb_offline", "metrics.output_tokens_per_s"),
    ("m04 / hf-cb out tok/s, nanovllm", "m04_nanovllm", "hf-cb_nanovllm", "metrics.output_tokens_per_s"),
    ("hf-cb / hf-static out tok/s, nanovllm", "hf-cb_nanovllm", "hf-static_nanovllm", "metrics.output_tokens_per_s"),
    ("m03 / m04 decoder ITL p99, chunked", "m03_chunked", "m04_chunked", "groups.decoder.itl_p99_s"),
    ("m04 / m03 TTFT p50, prefix", "m04_prefix", "m03_prefix", "metrics.ttft_p50_s"),
]


def current_shape(result: dict) -> bool:
    """Whether an earlier file measured today's workload (same parameters), not an older shape of it."""
    wl = result.get("workload") or {}
    if wl.get("name") not in WORKLOADS:
        return False
    return wl.get("params") == json.loads(json.dumps(get_workload(wl["name"], wl.get("params", {}).get("seed", 0))
                                                    .describe()["params"]))


def ratio_rows(results: Sequence[dict], results_dir: Path | None) -> list[list]:
    """The fixed ``RATIOS`` between single runs. Members of a comparison are left out of two-run ratios (their
    ratio is the comparison's, pair by pair), and so are earlier files of an older workload shape."""
    by_name = {r["name"]: r for r in results if r.get("status") == "ok"}

    def get(name: str, single_only: bool) -> tuple[dict | None, str]:
        found, source = by_name.get(name), "this call"
        if found is None and results_dir is not None and (path := results_dir / f"{name}.json").is_file():
            try:
                found, source = json.loads(path.read_text()), "earlier file"
            except (OSError, ValueError):
                return None, ""
            if found.get("status") != "ok" or not current_shape(found):
                return None, ""
        if found is None or single_only and found.get("repeats"):
            return None, ""
        return found, source

    rows = []
    for label, num_name, den_name, metric in RATIOS:
        num, src_n = get(num_name, single_only=den_name is not None)
        num_v = _lookup(num, metric) if num else None
        if den_name is None:
            if num_v is not None:
                rows.append([label, f"{num_v:.3f}", src_n])
            continue
        den, src_d = get(den_name, single_only=True)
        den_v = _lookup(den, metric) if den else None
        if num_v is None or not den_v:
            continue
        sources = src_n if src_n == src_d else f"{src_n} / {src_d}"
        rows.append([label, f"{num_v / den_v:.2f}x", sources])
    return rows


def ratio_table(results: Sequence[dict], results_dir: Path | None) -> str:
    from tabulate import tabulate

    rows = ratio_rows(results, results_dir)
    if not rows:
        return "(no ratio has both of its runs yet)"
    return tabulate(rows, headers=["ratio (single runs, not interleaved)", "value", "from"], tablefmt="github")


def report(results: Sequence[dict], gate: Sequence[dict] = (), slug_dir: Path | None = None) -> str:
    """The whole markdown summary of a call: gate, runs, comparisons, token agreement, skipped, single ratios."""
    ran = [r for r in results if r.get("status") != "skipped"]
    skipped = [r for r in results if r.get("status") == "skipped"]
    parts = []
    if (banner := gate_banner(gate)) is not None:
        parts += [banner, ""]
    parts += ["## Correctness gate (float32, against transformers)", "", gate_table(gate), ""]
    parts += ["## Runs", "", summary_table(ran) if ran else "(none ran)", ""]
    parts += ["## Interleaved comparisons", "", comparison_table(results), ""]
    parts += ["## Same tokens as the previous milestone", "", agreement_table(results), ""]
    gate_skipped = [g for g in gate if g.get("status") == "skipped"]
    if skipped or gate_skipped:
        parts += ["## Skipped", ""] + [f"- {r['name']}: {r['error']}" for r in skipped]
        parts += [f"- gate {g['label']}: {g['error']}" for g in gate_skipped] + [""]
    parts += ["## Ratios between single runs (not interleaved: may move 15-40% between calls)", "",
              ratio_table(results, slug_dir), ""]
    return "\n".join(parts)
