"""Where the host time of one eager kernel launch goes: Python, PyTorch's dispatcher, Triton's launcher, the driver.

    python -m benchmarks.launch_costs                 # on a CUDA machine; writes results/<gpu>/launch_costs.json
    python -m benchmarks.launch_costs --device cpu    # the Python and dispatcher parts only (a smoke test)

Each part alone, the median of ``--rounds`` rounds of ``--iterations`` back-to-back calls: an ``nn.Module``
returning its input (``python_call_us``), ``torch.cuda._sleep(0)`` (``raw_launch_us``), ``torch.add`` on 16
elements (``torch_op_us``), a 16 x 16 ``nn.Linear`` (``module_op_us``), a one-program Triton kernel
(``triton_launch_us``), and one ``torch.add`` replayed in a CUDA graph (``graph_kernel_us``, GPU time).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import timeit
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from triton.testing import do_bench_cudagraph

from .env import environment, write_json


def host_us_per_call(call: Callable[[], object], iterations: int, rounds: int, sync: Callable[[], None]) -> float:
    """Median over ``rounds`` of the host microseconds per call of ``iterations`` back-to-back ``call()``s
    (``timeit``; the device is synced before each round, untimed)."""
    timeit.repeat(call, sync, number=max(1, iterations // 10), repeat=1)  # warm-up: compile, allocate, fill caches
    return statistics.median(timeit.repeat(call, sync, number=iterations, repeat=rounds)) / iterations * 1e6


def triton_launcher(device: torch.device) -> Callable[[], object] | None:
    """A call that launches a one-program Triton kernel, or None where Triton cannot launch on ``device``."""
    if device.type != "cuda":
        return None
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def _add_one(x_ptr):
        tl.store(x_ptr, tl.load(x_ptr) + 1.0)

    x = torch.zeros(1, device=device)
    return lambda: _add_one[(1,)](x)


def measure(device: torch.device, iterations: int, rounds: int) -> dict:
    cuda = device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    identity, linear = nn.Identity(), nn.Linear(16, 16, device=device).requires_grad_(False)
    x, a, b, c = (torch.ones(16, device=device) for _ in range(4))
    calls = {"python_call_us": lambda: identity(x), "torch_op_us": lambda: torch.add(a, b, out=c),
             "module_op_us": lambda: linear(x), "raw_launch_us": (lambda: torch.cuda._sleep(0)) if cuda else None,
             "triton_launch_us": triton_launcher(device)}
    with torch.inference_mode():
        parts = {name: host_us_per_call(call, iterations, rounds, sync) if call else None
                 for name, call in calls.items()}
    parts["graph_kernel_us"] = None
    if cuda:  # GPU microseconds per add replayed from a CUDA graph of many (do_bench_cudagraph: median replay)
        with torch.cuda.device(device):
            parts["graph_kernel_us"] = do_bench_cudagraph(lambda: torch.add(a, b, out=c), return_mode="median") * 1e3
    not_measured = {k: "needs a CUDA GPU (and Triton for triton_launch_us)" for k, v in parts.items() if v is None}
    return {"name": "launch_costs", "env": environment(device), "iterations": iterations, "rounds": rounds,
            "parts": parts, "not_measured": not_measured}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.launch_costs", description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (Python and dispatcher parts only)")
    parser.add_argument("--iterations", type=int, default=2000, help="back-to-back calls per round")
    parser.add_argument("--rounds", type=int, default=7, help="rounds; each part reports the median round")
    parser.add_argument("--out", default="benchmarks/results", help="folder; the file goes to <out>/<gpu>/")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda needs a CUDA GPU (use --device cpu for the Python and dispatcher parts)",
              file=sys.stderr)
        return 2
    if args.iterations < 1 or args.rounds < 1:
        print("error: --iterations and --rounds must be at least 1", file=sys.stderr)
        return 2
    result = measure(device, args.iterations, args.rounds)
    for name, value in result["parts"].items():
        print(f"{name:18s} {'not measured' if value is None else f'{value:8.2f} us'}")
    print(f"-> {write_json(result, Path(args.out) / result['env']['gpu_slug'] / 'launch_costs.json')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
