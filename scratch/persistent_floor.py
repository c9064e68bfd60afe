"""One GPU call: what a persistent kernel could gain on int4's batch-1 step, measured by streaming its bytes.

The step's 145 batch-1 matmuls of qwen3-8b-random (int4 bytes: packed nibbles + float32 scales), chained in one
CUDA graph, five ways (interleaved rounds, median of replays per round):

    cublas-bf16        cuBLAS on the bf16 weights, a launch per matmul
    m13-int4           m13's int4 GEMVs, a launch per matmul (the table at this commit)
    stream-each        a kernel that only streams each matmul's int4 bytes, a launch per matmul (call 27)
    stream-one         the same bytes streamed by one kernel, no synchronisation (call 27)
    persistent-145     one kernel, all its programs resident, that waits at a grid-wide barrier after each matmul
                       (an atomic arrival, then spinning on the count): the order a decode step needs, in one launch
    persistent-181     the same with one more barrier per layer (attention's place): 5 a layer, as a whole-step
                       persistent kernel would have (norm + q/k/v | attention | o_proj | norm + gate_up + SiLU | down)
    flat-...           (call 51) one loop over every tile of every matmul, each program's loads issued 2 or 3 tiles
                       ahead into registers, so that the next matmul's first tiles are in flight while it waits at
                       the barrier (only x depends on the barrier, not the weights); the arrival a release (what a
                       kernel that stored its outputs needs) or relaxed; and with no barrier (the loop's own rate)
    (call 49 asked L2 for the next matmul's first 4, 16 or 64 KiB before each barrier, `cp.async.bulk.prefetch`:
    4.4-5.8 us a barrier, slower than none; and ran one 16-warp program an SM: 9 us. At 2a029c7.)

    python3 scratch/persistent_floor.py OUT.json
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch
import triton
import triton.language as tl

from benchmarks.env import environment
from milestones.common.demo import cuda_median_ms
from milestones.m13_quantization.matmul_kernels import quantized_matmul
from milestones.m13_quantization.quantize import tile_int4

LAYER = ((6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288))
HEAD = (151936, 4096)
BLOCK = 1024  # int32 words a program reads per loop step (4 KiB)
PROGRAMS_PER_SM, WARPS, STAGES = 4, 4, 3  # call 27's best stream launch


def int4_words(n: int, k: int) -> int:
    return n * k // 8 + n * (k // 128)


@triton.jit
def _stream_kernel(w_ptr, x_ptr, out_ptr, n_words, iters, STAGES: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    base = pid * iters * BLOCK
    for i in tl.range(0, iters, num_stages=STAGES):
        idx = base + i * BLOCK + offs
        w = tl.load(w_ptr + idx, mask=idx < n_words, other=0)
        acc += w.to(tl.float32, bitcast=True) * tl.load(x_ptr + offs).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc))


@triton.jit
def _persistent_kernel(w_ptr, x_ptr, out_ptr, bounds_ptr, count_ptr, segments, STAGES: tl.constexpr,
                       BLOCK: tl.constexpr, PREFETCH: tl.constexpr = 0, LANES: tl.constexpr = 128):
    """Segment after segment (a matmul's words, or none: a barrier only), each program its contiguous share,
    then a grid-wide barrier: every program counts itself arrived and spins until all have."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for s in range(segments):
        start = tl.load(bounds_ptr + s)
        end = tl.load(bounds_ptr + s + 1)
        iters = tl.cdiv(end - start, programs * BLOCK)
        base = start + pid * iters * BLOCK
        for i in tl.range(0, iters, num_stages=STAGES):
            idx = base + i * BLOCK + offs
            w = tl.load(w_ptr + idx, mask=idx < end, other=0)
            acc += w.to(tl.float32, bitcast=True) * tl.load(x_ptr + offs).to(tl.float32)
        if PREFETCH > 0:  # the next segment's first PREFETCH bytes of this program's share, asked of L2 now
            nxt_start = tl.load(bounds_ptr + s + 1)
            nxt_end = tl.load(bounds_ptr + tl.minimum(s + 2, segments))
            nxt_iters = tl.cdiv(nxt_end - nxt_start, programs * BLOCK)
            nxt_base = nxt_start + pid * nxt_iters * BLOCK
            words = tl.minimum(tl.minimum(PREFETCH // 4, nxt_iters * BLOCK), tl.maximum(nxt_end - nxt_base, 0))
            chunk = (words // LANES) // 4 * 4  # int32 words per thread, whole 16 bytes
            if chunk > 0:
                lane = tl.arange(0, LANES)
                tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2;\n mov.u32 $0, 0;", "=r,l,r",
                                          [w_ptr + nxt_base + lane * chunk, (chunk * 4 + tl.zeros_like(lane))],
                                          dtype=tl.int32, is_pure=False, pack=1)
        tl.debug_barrier()
        tl.atomic_add(count_ptr, 1, sem="release")
        target = (s + 1) * programs
        arrived = tl.atomic_add(count_ptr, 0, sem="acquire")
        spins = 0
        while (arrived < target) & (spins < 4194304):  # a bound, so that a launch whose programs are not all
            arrived = tl.atomic_add(count_ptr, 0, sem="acquire")  # resident ends (timed wrong) instead of hanging
            spins += 1
        tl.debug_barrier()
    tl.store(out_ptr + pid, tl.sum(acc))


@triton.jit
def _tile(bounds_ptr, s, i, segments, pid, programs, BLOCK: tl.constexpr):
    """Where tile ``i`` of this program's share of segment ``s`` starts, the segment's end (a mask) and how many
    tiles the share has (at least one, so that an empty segment still marks its barrier). Past the last segment:
    an empty tile."""
    sc = tl.minimum(s, segments - 1)
    start = tl.load(bounds_ptr + sc)
    end = tl.where(s < segments, tl.load(bounds_ptr + sc + 1), 0)
    iters = tl.maximum(tl.cdiv(end - start, programs * BLOCK), 1).to(tl.int32)
    return start + (pid * iters + i) * BLOCK, end, iters


@triton.jit
def _next(s, i, iters, bounds_ptr, segments, pid, programs, BLOCK: tl.constexpr):
    i += 1
    if i == iters:
        s += 1
        i = 0
    return s, i


@triton.jit
def _flat_kernel(w_ptr, x_ptr, out_ptr, bounds_ptr, count_ptr, segments, BLOCK: tl.constexpr,
                 DEPTH: tl.constexpr, RELEASE: tl.constexpr, BARRIERS: tl.constexpr):
    """(call 51) Every tile of every segment in one loop, loads issued ``DEPTH`` tiles ahead into registers (no
    software pipeliner: the loop holds a barrier), so the next segment's first tiles are in flight while the
    program waits at the barrier before using them. ``RELEASE``: the arrival is a release (as a kernel that
    stored its outputs needs: it may wait for the loads in flight), else relaxed."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs).to(tl.float32)
    acc = tl.zeros([BLOCK], tl.float32)
    total = 0
    for s in range(segments):
        _, _, iters = _tile(bounds_ptr, s, 0, segments, pid, programs, BLOCK)
        total += iters
    ls = 0  # the load cursor: segment, tile
    li = 0
    base, end, iters = _tile(bounds_ptr, ls, li, segments, pid, programs, BLOCK)
    w0 = tl.load(w_ptr + base + offs, mask=base + offs < end, other=0)
    ls, li = _next(ls, li, iters, bounds_ptr, segments, pid, programs, BLOCK)
    base, end, iters = _tile(bounds_ptr, ls, li, segments, pid, programs, BLOCK)
    w1 = tl.load(w_ptr + base + offs, mask=base + offs < end, other=0)
    ls, li = _next(ls, li, iters, bounds_ptr, segments, pid, programs, BLOCK)
    w2 = w1
    if DEPTH == 3:
        base, end, iters = _tile(bounds_ptr, ls, li, segments, pid, programs, BLOCK)
        w2 = tl.load(w_ptr + base + offs, mask=base + offs < end, other=0)
        ls, li = _next(ls, li, iters, bounds_ptr, segments, pid, programs, BLOCK)
    cs = 0  # the compute cursor
    ci = 0
    _, _, c_iters = _tile(bounds_ptr, cs, ci, segments, pid, programs, BLOCK)
    for step in tl.range(0, total, num_stages=1):
        base, end, iters = _tile(bounds_ptr, ls, li, segments, pid, programs, BLOCK)
        wn = tl.load(w_ptr + base + offs, mask=base + offs < end, other=0)
        ls, li = _next(ls, li, iters, bounds_ptr, segments, pid, programs, BLOCK)
        if BARRIERS:
            if (ci == 0) & (cs > 0):  # segment cs - 1 must be done by every program before cs uses its output
                tl.debug_barrier()
                if RELEASE:
                    tl.atomic_add(count_ptr, 1, sem="release")
                else:
                    tl.atomic_add(count_ptr, 1, sem="relaxed")
                target = cs * programs
                arrived = tl.atomic_add(count_ptr, 0, sem="acquire")
                spins = 0
                while (arrived < target) & (spins < 4194304):
                    arrived = tl.atomic_add(count_ptr, 0, sem="acquire")
                    spins += 1
                tl.debug_barrier()
        acc += w0.to(tl.float32, bitcast=True) * x
        w0 = w1
        if DEPTH == 3:
            w1 = w2
            w2 = wn
        else:
            w1 = wn
        cs, ci = _next(cs, ci, c_iters, bounds_ptr, segments, pid, programs, BLOCK)
        _, _, c_iters = _tile(bounds_ptr, cs, ci, segments, pid, programs, BLOCK)
    tl.store(out_ptr + pid, tl.sum(acc))


def graphed(fn):
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def main(out: str) -> None:
    began = time.perf_counter()
    dev = torch.device("cuda")
    shapes = [s for _ in range(36) for s in LAYER] + [HEAD]
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    programs = sms * PROGRAMS_PER_SM
    counts = [int4_words(n, k) for n, k in shapes]
    flat = torch.randint(0, 2**20, (sum(counts),), dtype=torch.int32, device=dev)
    views = list(torch.split(flat, counts))
    x_words = torch.randn(BLOCK, device=dev)
    sink = torch.zeros(programs, device=dev)
    bf16 = [torch.empty(n, k, dtype=torch.bfloat16, device=dev).normal_(0, 0.02) for n, k in shapes]
    int4 = [(tile_int4(torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=dev)),
             torch.rand(n, k // 128, device=dev) * 0.01) for n, k in shapes]
    x = torch.randn(1, 4096, dtype=torch.bfloat16, device=dev)
    offsets = [0]
    for c in counts:
        offsets.append(offsets[-1] + c)
    bounds145 = torch.tensor(offsets, dtype=torch.int64, device=dev)
    with181 = [0]
    for layer in range(36):
        for j in range(4):
            with181.append(offsets[4 * layer + j + 1])
            if j == 0:
                with181.append(with181[-1])  # attention's barrier: no bytes
    with181.append(offsets[-1])
    bounds181 = torch.tensor(with181, dtype=torch.int64, device=dev)
    counter = torch.zeros(1, dtype=torch.int32, device=dev)

    def matmuls(weights, fn):
        h = x
        for (n, k), w in zip(shapes, weights):
            h = fn(h[:, :k], w)  # every matmul's output is at least as wide as the next one's input

    def stream_each():
        for words in views:
            iters = triton.cdiv(words.numel(), programs * BLOCK)
            _stream_kernel[(triton.cdiv(words.numel(), iters * BLOCK),)](words, x_words, sink, words.numel(), iters,
                                                                        STAGES=STAGES, BLOCK=BLOCK, num_warps=WARPS)

    def stream_one():
        iters = triton.cdiv(flat.numel(), programs * BLOCK)
        _stream_kernel[(triton.cdiv(flat.numel(), iters * BLOCK),)](flat, x_words, sink, flat.numel(), iters,
                                                                   STAGES=STAGES, BLOCK=BLOCK, num_warps=WARPS)

    def persistent(bounds, prefetch=0, per_sm=PROGRAMS_PER_SM, warps=WARPS):
        def run():
            counter.zero_()
            _persistent_kernel[(sms * per_sm,)](flat, x_words, sink, bounds, counter, bounds.numel() - 1,
                                                STAGES=STAGES, BLOCK=BLOCK, PREFETCH=prefetch, LANES=32 * warps,
                                                num_warps=warps)
        return run

    fns = {"cublas-bf16": lambda: matmuls(bf16, lambda h, w: torch.nn.functional.linear(h, w)),
           "m13-int4": lambda: matmuls(int4, lambda h, w: quantized_matmul(h, w[0], w[1], "int4")),
           "stream-each": stream_each, "stream-one": stream_one,
           "persistent-145": persistent(bounds145), "persistent-181": persistent(bounds181)}

    def flat_loop(bounds, depth, release, barriers=True):
        def run():
            counter.zero_()
            _flat_kernel[(programs,)](flat, x_words, sink, bounds, counter, bounds.numel() - 1, BLOCK=BLOCK,
                                      DEPTH=depth, RELEASE=release, BARRIERS=barriers, num_warps=WARPS)
        return run

    # call 51: one loop over every tile, loads in registers 2 or 3 tiles ahead, across the barriers
    for depth in (2, 3):
        fns[f"flat-nobarrier-d{depth}"] = flat_loop(bounds181, depth, True, False)
        fns[f"flat-181-d{depth}-release"] = flat_loop(bounds181, depth, True)
        fns[f"flat-181-d{depth}-relaxed"] = flat_loop(bounds181, depth, False)
    fns["flat-145-d3-relaxed"] = flat_loop(bounds145, 3, False)
    result = {"name": "persistent_floor", "env": environment("cuda"), "matmuls": len(shapes), "programs": programs,
              "launch": f"{PROGRAMS_PER_SM} programs/SM x {WARPS} warps x {STAGES} stages",
              "bytes": {"bf16": sum(2 * n * k for n, k in shapes), "int4": 4 * sum(counts)}, "errors": {}}
    graphs = {}
    for name, fn in fns.items():
        try:
            graphs[name] = graphed(fn)
            torch.cuda.synchronize()
        except Exception as error:
            result["errors"][name] = f"{type(error).__name__}: {error}"
            print(f"{name}: {result['errors'][name]}", flush=True)
    times = {name: [] for name in graphs}
    for round_ in range(5):
        for name, graph in graphs.items():
            times[name].append(cuda_median_ms(graph.replay, 20))
        print(f"round {round_ + 1}: " + ", ".join(f"{n} {t[-1]:.3f}" for n, t in times.items()), flush=True)
    result["ms"] = times
    result["summary"] = {}
    one = statistics.median(times["stream-one"])
    for name, values in times.items():
        median = statistics.median(values)
        nbytes = result["bytes"]["bf16" if name.startswith("cublas") else "int4"]
        barriers = 145 if "-145" in name else 181 if "-181" in name else None
        result["summary"][name] = {"median_ms": median, "min_ms": min(values), "max_ms": max(values),
                                   "tb_per_s": nbytes / median / 1e9,
                                   "us_per_barrier": (median - one) / barriers * 1e3 if barriers else None}
        print(f"{name}: {median:.3f} ms ({min(values):.3f}-{max(values):.3f}), {nbytes / median / 1e9:.2f} TB/s"
              + (f", {(median - one) / barriers * 1e3:.2f} us a barrier over stream-one" if barriers else ""),
              flush=True)
    result["total_s"] = time.perf_counter() - began
    with open(out, "w") as f:
        json.dump(result, f, indent=1, default=str)
    print(f"-> {out}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "persistent_floor.json")
