"""Does an int4 GEMV with x prepared once (prescaled floats in nibble order) stream faster? (one GPU call)

Per shape of Qwen3-8B at batch 1: m13's table launch, the prepare kernel alone, the px GEMV alone (x prepared
already) for a few launches, and prepare + GEMV. Then the step's 145 matmuls chained in one CUDA graph, in
interleaved rounds: m13's table, px (prepare + GEMV, the best launch per shape), px without the prepare (the
limit if the producer of x wrote it prepared).
"""
import argparse, json, statistics, sys, time
import torch, triton
from milestones.common.demo import cuda_median_ms
from milestones.m13_quantization.matmul_kernels import quantized_matmul, quantized_matmul_reference
from benchmarks.env import environment
import scratch.px as px

LAYER = (("qkv_proj", 6144, 4096), ("o_proj", 4096, 4096), ("gate_up_proj", 24576, 4096), ("down_proj", 4096, 12288))
HEAD = ("lm_head", 151936, 4096)
CONFIGS = [(8, 2, 1, 4), (16, 2, 1, 4), (16, 1, 1, 4), (32, 2, 1, 3), (32, 1, 1, 4), (64, 1, 1, 4), (64, 1, 1, 3),
           (32, 2, 2, 4), (64, 2, 2, 3), (128, 1, 2, 3), (16, 4, 1, 3)]


def name(c):
    return "n%d-g%d-w%d-s%d" % c


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", default="px_bench.json")
    args = ap.parse_args(argv)
    began = time.perf_counter()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    shapes = list(LAYER) + [HEAD]
    data = {}
    for s, n, k in shapes:
        w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=dev)
        sc = torch.rand(n, k // 128, device=dev) * 0.01 + 0.001
        x = torch.randn(1, k, dtype=torch.bfloat16, device=dev)
        xp = torch.empty(k, dtype=torch.float32, device=dev)
        xs = torch.empty(k // 8, dtype=torch.float32, device=dev)
        data[s] = (x, w, sc, xp, xs)
    res = {"name": "px_bench", "env": environment("cuda"), "configs": [name(c) for c in CONFIGS], "check": {},
           "us": {}, "best": {}}
    # correctness first: every launch against the float reference
    for s, n, k in shapes:
        x, w, sc, xp, xs = data[s]
        ref = quantized_matmul_reference(x.float(), w, sc, "int4")
        scale = ref.abs().max().item()
        res["check"][s] = {}
        for c in CONFIGS:
            for top in (False, True):
                out = px.gemv_px(x.float(), w, sc, *c, top=top)
                err = (out.float() - ref).abs().max().item() / scale
                res["check"][s][name(c) + ("-top" if top else "")] = err
                assert err < 1e-4, (s, c, top, err)
        out = px.gemv_px(x, w, sc, *CONFIGS[1])
        res["check"][s]["bf16 vs table"] = ((out.float() - quantized_matmul(x, w, sc, "int4").float()).abs().max()
                                            / scale).item()
    print("check ok", flush=True)
    bench = lambda fn: triton.testing.do_bench_cudagraph(fn, rep=20, return_mode="median") * 1e3
    for s, n, k in shapes:
        x, w, sc, xp, xs = data[s]
        t = {"table": bench(lambda: quantized_matmul(x, w, sc, "int4")),
             "prep": bench(lambda: px.prep_x_kernel[(k // 128,)](x, xp, xs, TOP=True, num_warps=1))}
        for c in CONFIGS:
            t[name(c)] = bench(lambda: px.gemv_px(x, w, sc, *c, xp=xp, xs=xs, prep=False))
        t["top-off " + name(CONFIGS[1])] = bench(lambda: px.gemv_px(x, w, sc, *CONFIGS[1], top=False, xp=xp, xs=xs,
                                                                      prep=False))
        best = min(CONFIGS, key=lambda c: t[name(c)])
        t["prep+best"] = bench(lambda: px.gemv_px(x, w, sc, *best, xp=xp, xs=xs))
        res["us"][s], res["best"][s] = t, name(best)
        nbytes = n * k // 2 + n * k // 128 * 4
        print(s, " ".join(f"{a} {b:.2f}" for a, b in t.items()), "| best", name(best),
              f"{nbytes / t[name(best)] / 1e6:.2f} TB/s", flush=True)
    # the chain of 145
    seq = [s for _ in range(36) for s in LAYER] + [HEAD]
    best = {s: next(c for c in CONFIGS if name(c) == res["best"][s]) for s, _, _ in shapes}
    xin = {s: data[s][0] for s, _, _ in shapes}

    def chain(kind):
        def run():
            y = xin["qkv_proj"]
            for s, n, k in seq:
                x, w, sc, xp, xs = data[s]
                xx = y[:, :k] if y.shape[1] >= k else xin[s]
                if kind == "table":
                    y = quantized_matmul(xx, w, sc, "int4")
                elif kind == "px":
                    y = px.gemv_px(xx, w, sc, *best[s], xp=xp, xs=xs)
                else:
                    y = px.gemv_px(xx, w, sc, *best[s], xp=xp, xs=xs, prep=False)
        return run

    graphs = {}
    for kind in ("table", "px", "px-noprep"):
        fn = chain(kind)
        fn(); torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        graphs[kind] = g
    times = {k: [] for k in graphs}
    for r in range(args.rounds):
        for k, g in graphs.items():
            times[k].append(cuda_median_ms(g.replay, args.repeats))
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in times.items()), flush=True)
    res["chain_ms"] = times
    res["chain_median_ms"] = {k: statistics.median(v) for k, v in times.items()}
    print("chain medians", res["chain_median_ms"], flush=True)
    res["total_s"] = time.perf_counter() - began
    json.dump(res, open(args.out, "w"), indent=1, default=str)
    print("->", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
