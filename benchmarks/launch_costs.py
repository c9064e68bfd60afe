"""Where the host time of one eager kernel launch goes: Python, PyTorch's dispatcher, Triton's launcher, the driver.

    python -m benchmarks.launch_costs                 # on a CUDA machine; writes results/<gpu>/launch_costs.json
    python -m benchmarks.launch_costs --device cpu    # the Python and dispatcher parts only (a smoke test)

An eager decode step of Qwen3-0.6B launches some 540-760 kernels from Python (counted in docs/m10-cuda-graphs.md)
and costs 10-28 ms on the H200 hosts measured, 14-40 us of host time per launch. This takes one launch apart,
each part timed alone as the median of ``--rounds`` rounds of ``--iterations`` back-to-back calls:

* ``python_call_us``: calling an ``nn.Module`` whose ``forward`` returns its input (Python and the module's
  ``__call__``, no tensor work);
* ``raw_launch_us``: ``torch.cuda._sleep(0)``, one kernel launched from a C++ binding with no dispatcher in the
  way (the driver's launch plus a thin binding);
* ``torch_op_us``: ``torch.add(a, b, out=c)`` on 16-element tensors (the dispatcher, the elementwise setup, the
  launch);
* ``module_op_us``: a 16 x 16 ``nn.Linear`` called as a module (Python, the dispatcher, a cuBLAS launch);
* ``triton_launch_us``: a one-program Triton kernel launched from Python (Triton's launcher, then the launch);
* ``graph_kernel_us``: the GPU time of one ``torch.add`` kernel inside a replayed CUDA graph of many of them
  (``triton.testing.do_bench_cudagraph``: what a kernel costs once nothing is launched from Python).

Host times are wall time of the calling thread (the GPU runs these tiny kernels faster than the host issues
them, so the queue never fills and nothing waits for the GPU). A diagnostic for the docs, not a milestone.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from .env import environment, write_json


def host_us_per_call(call: Callable[[], object], iterations: int, rounds: int, sync: Callable[[], None]) -> float:
    """Median over ``rounds`` of the host microseconds per call of ``iterations`` back-to-back ``call()``s."""
    for _ in range(max(1, iterations // 10)):  # warm-up: first calls compile, allocate, fill caches
        call()
    sync()
    per_round = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(iterations):
            call()
        per_round.append((time.perf_counter() - start) / iterations * 1e6)
        sync()
    return statistics.median(per_round)


def graph_kernel_us(device: torch.device) -> float:
    """GPU microseconds per ``torch.add`` kernel replayed from a CUDA graph of many of them (``do_bench_cudagraph``:
    the median over its replays)."""
    import triton.testing

    a, b, c = (torch.ones(16, device=device) for _ in range(3))
    with torch.cuda.device(device):
        return triton.testing.do_bench_cudagraph(lambda: torch.add(a, b, out=c), return_mode="median") * 1e3


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
    identity = nn.Identity()
    x = torch.ones(16, device=device)
    a, b, c = (torch.ones(16, device=device) for _ in range(3))
    linear = nn.Linear(16, 16, device=device).requires_grad_(False)
    parts: dict[str, float | None] = {}
    with torch.inference_mode():
        parts["python_call_us"] = host_us_per_call(lambda: identity(x), iterations, rounds, sync)
        parts["torch_op_us"] = host_us_per_call(lambda: torch.add(a, b, out=c), iterations, rounds, sync)
        parts["module_op_us"] = host_us_per_call(lambda: linear(x), iterations, rounds, sync)
    parts["raw_launch_us"] = host_us_per_call(lambda: torch.cuda._sleep(0), iterations, rounds, sync) if cuda else None
    launch = triton_launcher(device)
    parts["triton_launch_us"] = host_us_per_call(launch, iterations, rounds, sync) if launch else None
    parts["graph_kernel_us"] = graph_kernel_us(device) if cuda else None
    return {
        "name": "launch_costs",
        "env": environment(device),
        "iterations": iterations,
        "rounds": rounds,
        "parts": parts,
        "not_measured": {k: "needs a CUDA GPU (and Triton for triton_launch_us)" for k, v in parts.items()
                         if v is None},
    }


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
