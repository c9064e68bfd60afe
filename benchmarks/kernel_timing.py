"""Timing a GPU code path three ways: its GPU time, eager back to back, and the CPU's cost to issue it.

A path is a list of callables, one per *copy* of its inputs; calls cycle through the copies, so that when all
copies together are several times larger than the L2 cache, every call reads its data from DRAM (as a layer of a
real step does: the other layers' weights and K/V went through L2 since it last ran).

* ``gpu_ms``: ``n`` calls captured in one CUDA graph; a replay's time over ``n``, median of ``replays`` replays.
  A graph issues its kernels back to back with no Python in between, so this is the GPU's own time for the
  path (each kernel's ramp-up and drain included, as in a replayed decode step), free of launch costs.
* ``eager_ms``: the same ``n`` calls issued from Python: per call, ``wall`` is whichever was slower, the GPU or
  the CPU launching (what an eager engine step pays), and ``host`` the CPU's time to issue the call.

Why not CUDA events around one call after an L2 flush: the events time from when the GPU *finished the flush*;
if the CPU was still issuing the call then (Python wrapper, Triton's launcher: tens of microseconds), the GPU
waited inside the timed window, so small kernels measured the launch, not the kernel, and did so at random,
depending on whether the flush outlasted the launch (benchmarks/KERNEL_NOTES.md, section 9).

Without CUDA (Triton's interpreter on a CPU) every figure is wall time: only a smoke test.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

DEFAULT_L2_BYTES = 64 * 2**20  # if this torch cannot say (recent versions report it)
SPIN_CYCLES = 1_000_000  # ~0.5 ms of GPU clock: longer than the CPU takes to queue an event and a graph replay


def l2_bytes(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    return getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or DEFAULT_L2_BYTES


@dataclass
class EagerTimes:
    wall_ms: float  # per call, issued back to back: max(GPU, CPU issuing)
    host_ms: float  # per call, the CPU's time to issue it


class Timing:
    """``gpu_ms`` and ``eager_ms`` of paths on ``device``; ``min_calls`` calls at least per measurement."""

    def __init__(self, device: torch.device, replays: int = 7, min_calls: int = 20, loops: int = 3) -> None:
        self.device, self.replays, self.min_calls, self.loops = device, replays, min_calls, loops
        self.cuda = device.type == "cuda"

    def calls(self, copies: int) -> int:
        return max(copies, self.min_calls) if self.cuda else copies

    def gpu_ms(self, path: list[Callable[[], object]]) -> float:
        """Milliseconds of GPU time per call (CUDA-graph replay); median wall time per call on a CPU."""
        n = self.calls(len(path))
        if not self.cuda:
            path[0]()  # warm-up (first touch of fresh buffers)
            return statistics.median(self._wall_ms(fn) for fn in path)
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):  # warm-up outside the capture: compiles kernels, sets up libraries
            for fn in path:
                fn()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(n):
                path[i % len(path)]()
        graph.replay()  # the first replay uploads the graph
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(self.replays)]
        for start, end in events:
            # The GPU spins while the CPU queues the start event and the replay, so the timed window holds the
            # graph's execution only, not the CPU's time to launch it.
            torch.cuda._sleep(SPIN_CYCLES)
            start.record()
            graph.replay()
            end.record()
        torch.cuda.synchronize(self.device)
        ms = statistics.median(start.elapsed_time(end) for start, end in events) / n
        del graph
        return ms

    def eager_ms(self, path: list[Callable[[], object]]) -> EagerTimes:
        """Per call when issued back to back from Python (``n`` calls, median of ``loops`` loops)."""
        n = self.calls(len(path))
        walls, hosts = [], []
        for _ in range(self.loops):
            if self.cuda:
                torch.cuda.synchronize(self.device)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            begin = time.perf_counter()
            for i in range(n):
                path[i % len(path)]()
            hosts.append((time.perf_counter() - begin) * 1e3 / n)
            if self.cuda:
                end.record()
                end.synchronize()
                walls.append(start.elapsed_time(end) / n)
            else:
                walls.append(hosts[-1])
        return EagerTimes(statistics.median(walls), statistics.median(hosts))

    @staticmethod
    def _wall_ms(fn: Callable[[], object]) -> float:
        begin = time.perf_counter()
        fn()
        return (time.perf_counter() - begin) * 1e3
