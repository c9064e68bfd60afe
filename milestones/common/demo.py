"""Helpers that every milestone's demo (``python -m milestones.mNN_...``) shares.

A demo parses a few flags, builds one engine per milestone it compares, runs the same prompts through each,
and prints a table. The pieces, in the order a demo uses them:

* ``demo_parser``: ``--model``, ``--device``, ``--dtype``, ``--seed``, ``--repeats``, ``--threads``; the demo
  adds its own knobs, typed with ``positive_int`` / ``positive_int_list``, and reads them with
  ``parse_args`` (then ``check_min_max``), so a bad flag is one argparse line, never a traceback.
* ``exit_on_bad_input``: around building the engines and ``check_cases``: a ``ValueError`` (an unreachable
  model, a prompt longer than the model takes) becomes one ``error:`` line and exit status 2.
* ``engine_config``: an ``EngineConfig`` (or a later milestone's subclass) from those flags plus knobs.
* ``random_prompts``: seeded prompts of random token ids, so every engine sees exactly the same work.
* ``Case``, ``check_cases``, ``measure``: one table row per case (an engine with its prompts), timed
  ``--repeats`` times in interleaved rounds after a warm-up; the timings shown are medians.
  ``interleaved_rounds`` does the rounds for a demo that runs its engines its own way (the step API).
* ``print_table``, ``print_speedup``, ``same_tokens``: show the rows, the ratios (with their spread over
  the rounds), and whether the engines agreed.

Why repeats and interleaving: one timed run on a shared CPU is noise (the same m02-vs-m01 demo printed 9.6x,
2.0x, 5.0x and 2.0x on four runs). Rounds run A, B, A, B, ... so that a slow spell of the machine hits every
case alike, and a ratio is taken within each round, then the median and the min-max over rounds are printed.

Keys of a row that start with ``_`` are not shown: ``_outputs`` holds the ``RequestOutput``s of the first
round, ``_stats`` the engine's ``EngineStats`` and ``_runs`` every round's row.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from tabulate import tabulate
from tqdm.auto import tqdm

from .latency import summarize

NUM_BPE_TOKENS = 151_643  # Qwen's ids above this are special tokens (EOS among them): keep prompts below it
MiB = 1024 * 1024
DEFAULT_REPEATS = 3
TTFT_NOTE = ("TTFT includes queueing: it counts from a request's arrival (the call to generate, or the client's "
             "send), so the time it waited for the requests ahead of it is in it, not only its own prefill.")

# --------------------------------------------------------------------------- flags


def positive_int(text: str) -> int:
    """argparse ``type=`` for counts and lengths: an integer >= 1, else a one-line usage error."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def positive_float(text: str) -> float:
    """argparse ``type=`` for sizes such as GiB: a finite number > 0."""
    return _positive_float(text, allow_inf=False)


def positive_rate(text: str) -> float:
    """argparse ``type=`` for a request rate: a number > 0, ``inf`` meaning all at once."""
    return _positive_float(text, allow_inf=True)


def _positive_float(text: str, allow_inf: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not value > 0 or (value == math.inf and not allow_inf):  # "not >" also refuses NaN
        raise argparse.ArgumentTypeError(f"expected a {'' if allow_inf else 'finite '}number > 0, got {text!r}")
    return value


BYTE_SUFFIXES = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def byte_size(text: str) -> int:
    """argparse ``type=`` for a memory size in bytes, written as vLLM's ``--kv-cache-memory-bytes`` takes it:
    ``1073741824``, ``1G`` (GiB: binary, upper case) or ``1.5g`` (10**9: decimal, lower case)."""
    text = text.strip()
    number, scale = (text[:-1], BYTE_SUFFIXES[text[-1]]) if text[-1:] in BYTE_SUFFIXES else (text, 1)
    try:  # a binary suffix (or none) takes a whole number, as vLLM's does; a decimal one a fraction too
        value = int(number) * scale if scale % 1024 == 0 or scale == 1 else int(float(number) * scale)
    except (ValueError, OverflowError):
        value = None
    if value is None or value < 1:
        raise argparse.ArgumentTypeError(f"expected a number of bytes such as 2147483648, 2G (GiB) or 2g (10**9), "
                                         f"got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    """argparse ``type=`` for seeds: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def positive_int_list(text: str) -> list[int]:
    """argparse ``type=`` for ``"32,256,1024"``: comma-separated integers >= 1."""
    parts = [p.strip() for p in text.split(",")]
    try:
        return [positive_int(p) for p in parts]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated positive integers such as 32,256,1024, got {text!r}") from None


def name_list(text: str, names: Collection[str]) -> list[str]:
    """argparse ``type=`` (bound with ``functools.partial``) for comma-separated names, each one of ``names``."""
    values = [v.strip() for v in text.split(",") if v.strip()]
    if not values or any(v not in names for v in values):
        raise argparse.ArgumentTypeError(f"expected values from {sorted(names)}, got {text!r}")
    return values


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` shows each flag's default after its text, unless the text already says it (``"(default: room
    for 6 requests)"``: what None means) or the default is None, which would say nothing."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if "(default:" in (action.help or "") or action.default is None:
            return action.help
        return super()._get_help_string(action)


def demo_parser(description: str, prog: str | None = None) -> argparse.ArgumentParser:
    """An ``ArgumentParser`` with the flags every demo takes; add the milestone's knobs to it.

    ``prog`` is the name ``--help`` shows, e.g. ``"python -m milestones.m02_kv_cache"``. Give every flag a
    ``help`` text; one whose default is None says what None means, ending ``(default: ...)`` (``HelpFormatter``).
    """
    parser = argparse.ArgumentParser(prog=prog, description=description, formatter_class=HelpFormatter)
    parser.add_argument("--model", default="tiny",
                        help="a preset (tiny, qwen3-0.6b-random), a checkpoint directory, or a hub id "
                             "such as Qwen/Qwen3-0.6B")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16")
    parser.add_argument("--seed", type=non_negative_int, default=0, help="seeds random weights and random prompts")
    parser.add_argument("--repeats", type=positive_int, default=DEFAULT_REPEATS,
                        help="timed runs per row, after a warm-up; the table shows their median")
    parser.add_argument("--threads", type=non_negative_int, default=1,
                        help="torch's CPU threads; one keeps CPU timings steady on a busy machine (two threads "
                             "spinning against another process can be 10x slower); 0: torch's default")
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``parser.parse_args(argv)``, then apply the one process-wide flag, ``--threads``, and make a Ctrl-C that
    ends the demo print one line instead of a traceback (``quiet_ctrl_c``)."""
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    quiet_ctrl_c(parser.prog)
    return args


def quiet_ctrl_c(prog: str) -> None:
    """An uncaught ``KeyboardInterrupt`` prints ``<prog>: interrupted`` instead of a traceback; every other
    exception still reaches the hook before. It acts only when the interrupt leaves the program, after every
    ``finally`` and ``with`` on the way has cleaned up (engines, worker processes), and Python still exits as
    killed by SIGINT (status 130 in a shell)."""
    previous = sys.excepthook
    if getattr(previous, "quiet_ctrl_c", False):
        return

    def hook(kind, value, traceback) -> None:
        if issubclass(kind, KeyboardInterrupt):
            print(f"{prog}: interrupted", file=sys.stderr)
        else:
            previous(kind, value, traceback)

    hook.quiet_ctrl_c = True
    sys.excepthook = hook


def check_min_max(parser: argparse.ArgumentParser, args: argparse.Namespace, low: str, high: str) -> None:
    """``parser.error`` unless ``args.<low> <= args.<high>`` (attribute names, e.g. "min_tokens")."""
    if getattr(args, low) > getattr(args, high):
        flag = lambda name: "--" + name.replace("_", "-")  # noqa: E731
        parser.error(f"{flag(low)} ({getattr(args, low)}) is above {flag(high)} ({getattr(args, high)})")


@contextmanager
def exit_on_bad_input(parser: argparse.ArgumentParser) -> Iterator[None]:
    """Turn a ``ValueError`` into one line on stderr and exit status 2, as argparse does for a bad flag.

    Wrap only what refuses bad input: building the engines (an unknown or unreachable model, a bad device)
    and ``check_cases`` (a prompt the engine will not take). A ``ValueError`` from deeper in a run would be
    a bug, and should keep its traceback.
    """
    try:
        yield
    except ValueError as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None


def engine_config(config_cls, args: argparse.Namespace, **knobs):
    """``config_cls`` built from the common flags in ``args`` plus a milestone's own ``knobs``."""
    return config_cls(model=args.model, device=args.device, dtype=args.dtype, seed=args.seed, **knobs)


def random_prompts(vocab_size: int, num: int, min_len: int, max_len: int, seed: int) -> list[list[int]]:
    """``num`` prompts of random token ids, lengths uniform in ``[min_len, max_len]``; the same for a seed."""
    rng = random.Random(seed)
    top = min(vocab_size, NUM_BPE_TOKENS)
    return [[rng.randrange(top) for _ in range(rng.randint(min_len, max_len))] for _ in range(num)]


# --------------------------------------------------------------------------- measuring


@dataclass
class Case:
    """One row of a demo's table: ``engine.generate(prompts, params)``, labelled ``label``."""

    label: str
    engine: Any
    prompts: Sequence
    params: Any  # the engine's SamplingParams, one for all prompts or one per prompt


def check_cases(cases: Sequence[Case]) -> None:
    """Validate every case's prompts with its engine, doing no work. A ``ValueError`` names the case and the
    bad prompt's index in it, e.g. "m02_kv_cache: prompt 3: ..." (never the warm-up, which runs after this)."""
    for case in cases:
        try:
            case.engine.make_requests(case.prompts, case.params)
        except ValueError as error:
            raise ValueError(f"{case.label}: {error}") from None


def _sync(engine) -> None:
    """Wait for the GPU: its kernels run asynchronously, so a clock read without this measures too little."""
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _warm_up(case: Case) -> None:
    """A short untimed request, so one-off costs (the first CUDA kernel launches, allocator growth) are not
    charged to the first timed run. Built from the case's first request, so it is valid whenever that is:
    at most 16 of its prompt tokens and at most its ``max_tokens`` (2 when it allows that)."""
    first = case.engine.make_requests(case.prompts, case.params)[0]
    params = type(first.params)(max_tokens=min(2, first.params.max_tokens), ignore_eos=True)
    case.engine.generate([first.prompt_token_ids[:16]], params, use_tqdm=False)


def timed_row(case: Case) -> dict:
    """One timed ``generate`` of ``case`` as a table row (a dict whose keys are the column names).

    An engine with a prefix cache (m06 on) has it emptied first, untimed: otherwise a repeat would find its
    prompts cached by the warm-up or the round before, and measure something else than the first run did.
    """
    reset_prefix_cache = getattr(case.engine, "reset_prefix_cache", None)
    if reset_prefix_cache is not None:
        reset_prefix_cache()
    _sync(case.engine)
    start = time.perf_counter()
    outputs = case.engine.generate(case.prompts, case.params, use_tqdm=False)
    _sync(case.engine)
    summary = summarize(outputs, time.perf_counter() - start)
    stats = case.engine.stats
    row = {
        "label": case.label,
        "requests": summary["num_requests"],
        "prompt tokens": summary["prompt_tokens"],
        "output tokens": summary["output_tokens"],
        "wall s": summary["wall_time_s"],
        "output tok/s": summary["output_tokens_per_s"],
        "TTFT p50 (ms)": _ms(summary["ttft_p50_s"]),
        "TTFT p99 (ms)": _ms(summary["ttft_p99_s"]),
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


def interleaved_rounds(runs: Sequence[Callable[[], dict]], repeats: int = DEFAULT_REPEATS) -> list[dict]:
    """Call every run once per round, ``repeats`` rounds (A, B, C, A, B, C, ...); each call returns a row.

    Returns one row per run: a number that differs between rounds (a timing) becomes its median, one that does
    not (a counter) stays as it is, anything else comes from the first round, and ``row["_runs"]`` keeps every
    round's row, so ``speedup`` can take a ratio within each round. Demos with a runner of their own (the step
    API, client aborts) use this directly; ``measure`` uses it for ``generate``.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    rounds: list[list[dict]] = [[] for _ in runs]
    with tqdm(total=repeats * len(runs), desc="measuring", unit="run") as bar:
        for _ in range(repeats):
            for i, run in enumerate(runs):
                rounds[i].append(run())
                bar.update(1)
    return [merge_rounds(rows) for rows in rounds]


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def merge_rounds(rows: list[dict]) -> dict:
    """One row from a run's rounds (see ``interleaved_rounds``)."""
    merged = {}
    for key, first in rows[0].items():
        values = [row.get(key) for row in rows]
        is_timing = (not key.startswith("_") and any(v != first for v in values)
                     and all(v is None or _is_number(v) for v in values))
        present = [v for v in values if v is not None]
        merged[key] = (statistics.median(present) if present else None) if is_timing else first
    merged["_runs"] = rows
    return merged


def measure(cases: Sequence[Case], repeats: int = DEFAULT_REPEATS, warmup: bool = True) -> list[dict]:
    """Time every case ``repeats`` times and return one table row per case (see ``timed_row``).

    First every case is validated (``check_cases``), then each engine gets one short warm-up, then the
    cases run in interleaved rounds (``interleaved_rounds``): the timing columns hold the median over the
    rounds; counters (tokens computed, K/V) are the same in every round.
    """
    check_cases(cases)
    if warmup:
        warmed: set[int] = set()
        for case in cases:
            if id(case.engine) not in warmed:
                _warm_up(case)
                warmed.add(id(case.engine))
    return interleaved_rounds([partial(timed_row, case) for case in cases], repeats)


# --------------------------------------------------------------------------- showing


def print_table(rows: list[dict], title: str, columns: Sequence[str] | None = None) -> None:
    """Print ``rows`` under ``title``; columns are every public key in first-seen order unless given.

    Below the table, a note on how the timings were taken (for rows from ``measure``) and on what TTFT
    includes (wherever a TTFT column is shown).
    """
    if columns is None:
        columns = list(dict.fromkeys(k for row in rows for k in row if not k.startswith("_")))
    body = [[_cell(row.get(c)) for c in columns] for row in rows]
    print(f"\n{title}")
    print(tabulate(body, headers=columns, disable_numparse=True, colalign=["left"] + ["right"] * (len(columns) - 1)))
    rounds = {len(row["_runs"]) for row in rows if "_runs" in row}
    if rounds:
        once = [str(row.get("label")) for row in rows if "_runs" not in row]
        print(f"Timings: the median of {max(rounds)} interleaved runs per row, after a warm-up"
              + (f" ({', '.join(once)}: one run)." if once else "."))
    if any(c.startswith("TTFT") for c in columns):
        print(TTFT_NOTE)


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


@dataclass(frozen=True)
class Ratio:
    """A ratio taken in each round: its median and its range over the rounds."""

    median: float
    low: float
    high: float

    def __str__(self) -> str:
        if f"{self.low:.1f}" == f"{self.high:.1f}":
            return f"{self.median:.1f}x"
        return f"{self.median:.1f}x (runs: {self.low:.1f}x-{self.high:.1f}x)"


def _per_round(row: dict, metric: str) -> list:
    """``metric`` in every round (rows from ``interleaved_rounds``), else the row's single value (also for a
    column a demo added to the merged row)."""
    if "_runs" in row and all(metric in run for run in row["_runs"]):
        return [run[metric] for run in row["_runs"]]
    return [row.get(metric)]


def speedup(rows: list[dict], base_label: str, metric: str, lower_is_better: bool = False) -> dict[str, Ratio]:
    """How many times better than the ``base_label`` row every other row is on ``metric``: {label: Ratio}.

    For a timing, the ratio is taken within each round (both rows ran back to back), then summarised.
    Rounds where either value is missing or zero (e.g. no inter-token latency with ``max_tokens=1``) are
    left out, and so is a row with no usable round.
    """
    base = _per_round(next(row for row in rows if row["label"] == base_label), metric)
    ratios = {}
    for row in rows:
        if row["label"] == base_label:
            continue
        pairs = [(b, v) for b, v in zip(base, _per_round(row, metric)) if b and v]
        values = [(b / v if lower_is_better else v / b) for b, v in pairs]
        if values:
            ratios[row["label"]] = Ratio(statistics.median(values), min(values), max(values))
    return ratios


def print_speedup(rows: list[dict], base_label: str, metric: str, lower_is_better: bool = False) -> dict[str, Ratio]:
    """Print one line per row, e.g. ``m02_kv_cache: 7.9x (runs: 7.1x-8.4x) lower ms/token than m01``."""
    ratios = speedup(rows, base_label, metric, lower_is_better)
    for label, ratio in ratios.items():
        if lower_is_better:
            print(f"{label}: {ratio} lower {metric} than {base_label}")
        else:
            print(f"{label}: {ratio} the {metric} of {base_label}")
    return ratios


def same_tokens(rows: list[dict]) -> bool:
    """True when every row generated exactly the same token ids for every prompt."""
    first = [o.token_ids for o in rows[0]["_outputs"]]
    return all([o.token_ids for o in row["_outputs"]] == first for row in rows[1:])


def cuda_median_ms(fn, repeats: int, warmup: int = 2) -> float:
    """Median GPU milliseconds of ``fn()`` over ``repeats`` calls, each between two CUDA events, after
    ``warmup`` untimed calls (first launches compile kernels and allocate memory)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]
