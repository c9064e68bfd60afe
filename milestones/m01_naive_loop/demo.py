"""Helpers that every milestone's demo (``python -m milestones.mNN_...``) shares.

A demo parses a few flags, builds one engine per milestone it compares, runs the same prompts through each,
and prints a table. The pieces, in the order a demo uses them:

* ``demo_parser``: ``--model``, ``--device``, ``--dtype``, ``--seed``; the demo adds its own knobs.
* ``engine_config``: an ``EngineConfig`` (or a later milestone's subclass) from those flags plus knobs.
* ``random_prompts``: seeded prompts of random token ids, so every engine sees exactly the same work.
* ``measure``: one timed ``generate`` call -> one table row (a dict whose keys are the column names).
* ``print_table``, ``print_speedup``, ``same_tokens``: show the rows, the ratios, and whether the engines agreed.

Keys of a row that start with ``_`` are not shown: ``_outputs`` holds the ``RequestOutput``s and ``_stats``
the engine's ``EngineStats``, for checks rather than for reading.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence

import torch
from tabulate import tabulate

from .metrics import summarize
from .sampling_params import SamplingParams

NUM_BPE_TOKENS = 151_643  # Qwen's ids above this are special tokens (EOS among them): keep prompts below it
MiB = 1024 * 1024


def demo_parser(description: str, prog: str | None = None) -> argparse.ArgumentParser:
    """An ``ArgumentParser`` with the flags every demo takes; add the milestone's knobs to it.

    ``prog`` is the name ``--help`` shows, e.g. ``"python -m milestones.m02_kv_cache"``.
    """
    parser = argparse.ArgumentParser(prog=prog, description=description,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", default="tiny",
                        help="a preset (tiny, qwen3-0.6b-random), a checkpoint directory, or a hub id "
                             "such as Qwen/Qwen3-0.6B")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16")
    parser.add_argument("--seed", type=int, default=0, help="seeds random weights and random prompts")
    return parser


def engine_config(config_cls, args: argparse.Namespace, **knobs):
    """``config_cls`` built from the common flags in ``args`` plus a milestone's own ``knobs``."""
    return config_cls(model=args.model, device=args.device, dtype=args.dtype, seed=args.seed, **knobs)


def random_prompts(vocab_size: int, num: int, min_len: int, max_len: int, seed: int) -> list[list[int]]:
    """``num`` prompts of random token ids, lengths uniform in ``[min_len, max_len]``; the same for a seed."""
    rng = random.Random(seed)
    top = min(vocab_size, NUM_BPE_TOKENS)
    return [[rng.randrange(top) for _ in range(rng.randint(min_len, max_len))] for _ in range(num)]


def _sync(engine) -> None:
    """Wait for the GPU: its kernels run asynchronously, so a clock read without this measures too little."""
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def measure(engine, prompts: Sequence, params: SamplingParams, label: str, warmup: bool = True) -> dict:
    """Run ``engine.generate(prompts, params)`` once, timed, and return one table row.

    With ``warmup`` a two-token request runs first (no progress bar), so one-off costs such as the first
    CUDA kernel launches are not charged to the measured run.
    """
    if warmup:
        engine.generate([prompts[0]], SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)
    _sync(engine)
    start = time.perf_counter()
    outputs = engine.generate(prompts, params)
    _sync(engine)
    summary = summarize(outputs, time.perf_counter() - start)
    stats = engine.stats
    row = {
        "label": label,
        "requests": summary["num_requests"],
        "prompt tokens": summary["prompt_tokens"],
        "output tokens": summary["output_tokens"],
        "wall s": summary["wall_time_s"],
        "output tok/s": summary["output_tokens_per_s"],
        "TTFT p50 (ms)": _ms(summary["ttft_p50_s"]),
        "ms/token (mean ITL)": _ms(summary["itl_mean_s"]),
        "tokens computed": stats.tokens_computed,
        "useful fraction": stats.useful_token_fraction,
    }
    if stats.kv_reserved_peak_bytes:
        row["KV reserved peak (MiB)"] = stats.kv_reserved_peak_bytes / MiB
        row["KV used peak (MiB)"] = stats.kv_used_peak_bytes / MiB
    row["_outputs"] = outputs
    row["_stats"] = stats
    return row


def print_table(rows: list[dict], title: str, columns: Sequence[str] | None = None) -> None:
    """Print ``rows`` under ``title``; columns are every public key in first-seen order unless given."""
    if columns is None:
        columns = list(dict.fromkeys(k for row in rows for k in row if not k.startswith("_")))
    body = [[_cell(row.get(c)) for c in columns] for row in rows]
    print(f"\n{title}")
    print(tabulate(body, headers=columns, disable_numparse=True, colalign=["left"] + ["right"] * (len(columns) - 1)))


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def speedup(rows: list[dict], base_label: str, metric: str, lower_is_better: bool = False) -> dict[str, float]:
    """How many times better than the ``base_label`` row every other row is on ``metric``: {label: ratio}.

    Rows where either value is missing or zero (e.g. no inter-token latency with ``max_tokens=1``) are left out.
    """
    base = next(row for row in rows if row["label"] == base_label).get(metric)
    return {row["label"]: (base / row[metric] if lower_is_better else row[metric] / base)
            for row in rows if row["label"] != base_label and base and row.get(metric)}


def print_speedup(rows: list[dict], base_label: str, metric: str, lower_is_better: bool = False) -> dict[str, float]:
    """Print one line per row, e.g. ``m02_kv_cache: 7.9x lower ms/token than m01_naive_loop``; return the ratios."""
    ratios = speedup(rows, base_label, metric, lower_is_better)
    for label, ratio in ratios.items():
        if lower_is_better:
            print(f"{label}: {ratio:.1f}x lower {metric} than {base_label}")
        else:
            print(f"{label}: {ratio:.1f}x the {metric} of {base_label}")
    return ratios


def same_tokens(rows: list[dict]) -> bool:
    """True when every row generated exactly the same token ids for every prompt."""
    first = [o.token_ids for o in rows[0]["_outputs"]]
    return all([o.token_ids for o in row["_outputs"]] == first for row in rows[1:])
