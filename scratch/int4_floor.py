"""How fast can a batch-1 int4 decode step of Qwen3-8B's shape be, one kernel per matmul? (one GPU call)

The step's 145 matmuls (36 layers x qkv, o, gate_up, down, and the LM head) are replayed from one CUDA graph, each
fed the output of the one before (so each waits for the previous kernel, as in a step), in five ways:

    cublas-bf16    torch's matmul on bf16 weights (what m13's bf16 step runs)
    m13-int4       m13's quantized_matmul on int4 weights (the launch table of the step)
    stream-int4    a kernel that only streams each matmul's int4 bytes (weights + float32 scales) and does one
                   multiply-add per 32-bit word: a GEMV's loads with an eighth of its arithmetic, the floor of
                   any one-kernel-per-matmul int4 design
    stream-int4-pdl  the same with programmatic dependent launch: each kernel is scheduled while the one before
                   it finishes, and waits (griddepcontrol.wait) before its first load
    stream-one     the same bytes streamed by one kernel: no launch between matmuls at all

Chains are timed in interleaved rounds (median of replays per round; the median of rounds and its spread
reported). The rest of the step (attention, norms, RoPE, sampling) is not here: quant_step measures the whole
step in the same call, and R = bf16 step - cublas-bf16 chain.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
import triton
import triton.language as tl

from milestones.common.demo import cuda_median_ms
from milestones.m13_quantization.matmul_kernels import quantized_matmul

from benchmarks.env import environment

LAYER = (("qkv_proj", 6144, 4096), ("o_proj", 4096, 4096), ("gate_up_proj", 24576, 4096), ("down_proj", 4096, 12288))
HEAD = ("lm_head", 151936, 4096)
BLOCK = 1024  # int32 words a program reads per loop step (4 KiB)


def shapes(layers: int) -> list[tuple[str, int, int]]:
    return [s for _ in range(layers) for s in LAYER] + [HEAD]


def int4_words(n: int, k: int) -> int:
    return n * k // 8 + n * (k // 128)  # packed nibbles + one float32 scale per 128 inputs


try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # an older Triton: the PDL chain reports itself missing
    gdc_launch_dependents = gdc_wait = None


@triton.jit
def _stream_kernel(w_ptr, x_ptr, out_ptr, n_words, iters, PDL: tl.constexpr, STAGES: tl.constexpr,
                   BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    if PDL:
        gdc_launch_dependents()  # the next kernel may be scheduled now...
        gdc_wait()  # ...and this one reads nothing before the kernel before it has finished
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    base = pid * iters * BLOCK
    for i in tl.range(0, iters, num_stages=STAGES):
        idx = base + i * BLOCK + offs
        w = tl.load(w_ptr + idx, mask=idx < n_words, other=0)
        x = tl.load(x_ptr + offs).to(tl.float32)
        acc += w.to(tl.float32, bitcast=True) * x
    tl.store(out_ptr + pid, tl.sum(acc))


def stream(words: torch.Tensor, x: torch.Tensor, out: torch.Tensor, programs: int, warps: int, stages: int,
           pdl: bool) -> None:
    iters = triton.cdiv(words.numel(), programs * BLOCK)
    grid = (triton.cdiv(words.numel(), iters * BLOCK),)
    extra = {"launch_pdl": True} if pdl else {}
    _stream_kernel[grid](words, x, out, words.numel(), iters, PDL=pdl, STAGES=stages, BLOCK=BLOCK,
                         num_warps=warps, **extra)


class Chains:
    def __init__(self, layers: int, programs_per_sm: int, warps: int, stages: int) -> None:
        dev = torch.device("cuda")
        self.shapes = shapes(layers)
        self.sms = torch.cuda.get_device_properties(dev).multi_processor_count
        self.programs, self.warps, self.stages = self.sms * programs_per_sm, warps, stages
        counts = [int4_words(n, k) for _, n, k in self.shapes]
        self.flat = torch.randint(0, 2**20, (sum(counts),), dtype=torch.int32, device=dev)  # small: finite floats
        self.views = list(torch.split(self.flat, counts))
        self.buffers = [torch.zeros(max(BLOCK, 8 * self.programs), dtype=torch.float32, device=dev) for _ in range(2)]
        self.bf16 = [torch.empty(n, k, dtype=torch.bfloat16, device=dev).normal_(0, 0.02) for _, n, k in self.shapes]
        self.int4 = [(torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=dev),
                      torch.rand(n, k // 128, device=dev) * 0.01) for _, n, k in self.shapes]
        self.x = torch.randn(1, 4096, dtype=torch.bfloat16, device=dev)
        self.bytes = {"bf16": sum(2 * n * k for _, n, k in self.shapes), "int4": 4 * sum(counts)}

    def matmuls(self, weights, fn) -> None:
        x = self.x
        for (_, _, k), w in zip(self.shapes, weights):
            x = fn(x[:, :k], w)

    def cublas(self) -> None:
        self.matmuls(self.bf16, lambda x, w: torch.nn.functional.linear(x, w))

    def m13(self) -> None:
        self.matmuls(self.int4, lambda x, w: quantized_matmul(x, w[0], w[1], "int4"))

    def streamed(self, pdl: bool) -> None:
        for i, words in enumerate(self.views):
            stream(words, self.buffers[i % 2], self.buffers[(i + 1) % 2], self.programs, self.warps, self.stages, pdl)

    def one(self) -> None:
        stream(self.flat, self.buffers[0], self.buffers[1], self.programs, self.warps, self.stages, False)


def graphed(fn):
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=36)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--configs", default="1x8x3,2x4x3,4x4x3", help="programs per SM x warps x stages")
    parser.add_argument("--out", default="int4_floor.json")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    configs = [tuple(int(v) for v in c.split("x")) for c in args.configs.split(",")]
    chains = Chains(args.layers, *configs[0])
    result = {"name": "int4_floor", "env": environment("cuda"), "layers": args.layers, "matmuls": len(chains.shapes),
              "bytes": chains.bytes, "rounds": args.rounds, "repeats": args.repeats, "configs": {}, "errors": {}}
    best = None
    for config in configs:  # the stream kernel's launch: the best of a few, on the whole chain
        chains.programs, chains.warps, chains.stages = chains.sms * config[0], config[1], config[2]
        ms = cuda_median_ms(graphed(lambda: chains.streamed(False)).replay, args.repeats)
        result["configs"]["x".join(map(str, config))] = ms
        print(f"stream config {config}: {ms:.3f} ms", flush=True)
        best = config if best is None or ms < result["configs"]["x".join(map(str, best))] else best
    chains.programs, chains.warps, chains.stages = chains.sms * best[0], best[1], best[2]
    result["config"] = "x".join(map(str, best))
    fns = {"cublas-bf16": chains.cublas, "m13-int4": chains.m13, "stream-int4": lambda: chains.streamed(False),
           "stream-int4-pdl": lambda: chains.streamed(True), "stream-one": chains.one}
    graphs = {}
    for name, fn in fns.items():
        try:
            graphs[name] = graphed(fn)
        except Exception as error:  # e.g. PDL not captured by this CUDA/Triton: say so, time the rest
            result["errors"][name] = f"{type(error).__name__}: {error}"
            print(f"{name}: {result['errors'][name]}", flush=True)
    times = {name: [] for name in graphs}
    for round_ in range(args.rounds):
        for name, graph in graphs.items():
            times[name].append(cuda_median_ms(graph.replay, args.repeats))
        print(f"round {round_ + 1}: " + ", ".join(f"{n} {t[-1]:.3f}" for n, t in times.items()), flush=True)
    result["ms"] = times
    result["summary"] = {}
    for name, values in times.items():
        median = statistics.median(values)
        nbytes = chains.bytes["bf16" if name.startswith("cublas") else "int4"]
        result["summary"][name] = {"median_ms": median, "min_ms": min(values), "max_ms": max(values),
                                   "tb_per_s": nbytes / median / 1e9,
                                   "us_per_matmul_over_bytes_at_one": None}
        print(f"{name}: {median:.3f} ms ({min(values):.3f}-{max(values):.3f}), {nbytes / median / 1e9:.2f} TB/s",
              flush=True)
    if "stream-one" in times:
        one = statistics.median(times["stream-one"])
        for name in times:
            if name.startswith("stream-int4") or name == "m13-int4":
                per = (statistics.median(times[name]) - one) / len(chains.shapes) * 1e3
                result["summary"][name]["us_per_matmul_over_bytes_at_one"] = per
                print(f"{name}: {per:.2f} us a matmul over one kernel's time for the same bytes", flush=True)
    result["total_s"] = time.perf_counter() - began
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1, default=str)
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
