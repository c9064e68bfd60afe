"""One GPU call: where m13's batch-1 int4 GEMV spends the 3-8 us a matmul it takes beyond a kernel that only streams.

Per shape of qwen3-8b-random's step, at m13's launch (the table's 32 rows, 1 warp, 3 stages, K in the table's
slices, the weights in tiles), a skeleton of the GEMV that adds its parts one at a time:

    stream        call 27's kernel over the same words: 4 programs of 4 warps an SM, 4 KiB a step
    load          m13's launch and loads, one multiply-add a word (no x, no scales), each slice's sums stored
    + finish      ... and the slices added by the program that counts itself done last (m13's split finish)
    + x, scales   ... and each group's x (16 inputs) and scales loaded and multiplied in (scales row by row, and
                  (call 56) group by group, ``quantize.group_major``)
    m13           the GEMV itself (quantized_matmul), and (call 56) with its scales group by group

    python3 scratch/gemv_anatomy.py OUT.json     (on a GPU; the repository root on PYTHONPATH)
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch
import triton
import triton.language as tl

from milestones.m13_quantization.matmul_kernels import _add_slices, _int4_rows, _split_counters

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288),
          "lm_head": (151936, 4096)}


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
def _skeleton_kernel(x_ptr, w_ptr, s_ptr, out_ptr, part_ptr, count_ptr, N, K, k_per_split, stride_sn, stride_sg,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr, X: tl.constexpr,
                     FINISH: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    j = tl.arange(0, 16)
    w_rows, group_stride = _int4_rows(w_ptr, cols, 0, K, True, 16, 128)
    k_start = pid_k * k_per_split
    acc = tl.zeros([BLOCK_N, 16], tl.float32)
    for k0 in tl.range(k_start, k_start + k_per_split, BLOCK_K, num_stages=STAGES):
        k0 = tl.multiple_of(k0, BLOCK_K)
        for t in tl.static_range(BLOCK_K // 128):
            kg = k0 + t * 128
            kb = tl.multiple_of((kg // 128) * group_stride, 16)
            f = tl.load(w_rows + (kb + j)[None, :]).to(tl.float32, bitcast=True)
            if X:  # the group's inputs (16 of its 128: one a word) and its scales
                xv = tl.load(x_ptr + kg + 8 * j).to(tl.float32)
                sc = tl.load(s_ptr + cols * stride_sn + (kg // 128) * stride_sg)
                f = f * xv[None, :] * sc[:, None]
            acc += f
    sums = tl.sum(acc, axis=1)
    num_slices = tl.num_programs(1)
    if num_slices > 1:
        tl.store(part_ptr + pid_k * N + cols, sums)
        if FINISH:
            tl.debug_barrier()
            done_before = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel")
            if done_before == num_slices - 1:
                _add_slices(part_ptr, out_ptr, cols, cols < N, num_slices, N)
                tl.atomic_xchg(count_ptr + pid_n, 0, sem="relaxed")
    else:
        tl.store(out_ptr + cols, sums.to(out_ptr.dtype.element_ty))


def graphed(fn):
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def median_ms(graph, replays=10):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main(path: str) -> None:
    from benchmarks.env import environment
    from milestones.m08_triton_kernel.launch_config import sm_count
    from milestones.m13_quantization.launch_config import choose_launch
    from milestones.m13_quantization.matmul_kernels import quantized_matmul
    from milestones.m13_quantization.quantize import group_major, tile_int4

    began = time.perf_counter()
    dev = torch.device("cuda")
    sms = sm_count(dev)
    result = {"name": "gemv_anatomy", "env": environment("cuda"), "shapes": {}}
    for name, (n, k) in SHAPES.items():
        config, split = choose_launch("int4", 1, n, k, sms)
        reps = max(2, min(20, int(2e9 // (n * k // 2))))
        weights = [(tile_int4(torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=dev)),
                    torch.rand(n, k // 128, device=dev) * 0.01) for _ in range(reps)]
        x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        outs = [torch.empty(1, n, dtype=torch.bfloat16, device=dev) for _ in weights]
        parts = [torch.empty(split, n, dtype=torch.float32, device=dev) for _ in weights]
        counters = _split_counters(dev, n // config.block_n)
        k_per_split = k // split
        sink = torch.zeros(4 * sms, device=dev)
        x_words = torch.randn(1024, device=dev)
        words = [w.view(torch.int32).reshape(-1) for w, _ in weights]

        def stream():
            for wd in words:
                iters = triton.cdiv(wd.numel(), sink.numel() * 1024)
                _stream_kernel[(triton.cdiv(wd.numel(), iters * 1024),)](wd, x_words, sink, wd.numel(), iters,
                                                                        STAGES=3, BLOCK=1024, num_warps=4)

        by_group = [(w, group_major(s)) for w, s in weights]

        def skeleton(x_on, finish, scales_by_group=False):
            def run():
                for (w, s), o, p in zip(by_group if scales_by_group else weights, outs, parts):
                    _skeleton_kernel[(n // config.block_n, split)](
                        x, w.view(torch.int32), s, o, p, counters, n, k, k_per_split, s.stride(0), s.stride(1),
                        BLOCK_N=config.block_n, BLOCK_K=config.block_k, STAGES=config.num_stages, X=x_on,
                        FINISH=finish, num_warps=config.num_warps)
            return run

        fns = {"stream": stream, "load": skeleton(False, False), "+ finish": skeleton(False, True),
               "+ x, scales": skeleton(True, True), "+ x, scales by group": skeleton(True, True, True),
               "m13": lambda: [quantized_matmul(x, w, s, "int4") for w, s in weights],
               "m13, scales by group": lambda: [quantized_matmul(x, w, s, "int4") for w, s in by_group]}
        graphs = {label: graphed(fn) for label, fn in fns.items()}
        times = {label: [] for label in graphs}
        for _ in range(5):
            for label, graph in graphs.items():
                times[label].append(median_ms(graph) / reps * 1e3)
        us = {label: statistics.median(v) for label, v in times.items()}
        result["shapes"][name] = {"n": n, "k": k, "split": split, "block_n": config.block_n, "reps": reps,
                                  "us_rounds": times, "us": us}
        print(f"{name} (split {split}): " + ", ".join(f"{label} {v:.1f}" for label, v in us.items()) + " us",
              flush=True)
        del graphs, weights, words
        torch.cuda.empty_cache()
    result["total_s"] = time.perf_counter() - began
    with open(path, "w") as f:
        json.dump(result, f, indent=1, default=str)
    print(f"-> {path}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "gemv_anatomy.json")
