"""Is the int4 GEMV limited by its access pattern? The px GEMV on row-major weights against the same kernel on
weights stored tile-major ([N/16, K/128, 16, 64]: each step of a program reads contiguous KiBs). One GPU call."""
import argparse, json, statistics, sys, time
import torch, triton
from milestones.common.demo import cuda_median_ms
from milestones.m13_quantization.matmul_kernels import quantized_matmul, quantized_matmul_reference
from benchmarks.env import environment
import scratch.px as px

LAYER = (("qkv_proj", 6144, 4096), ("o_proj", 4096, 4096), ("gate_up_proj", 24576, 4096), ("down_proj", 4096, 12288))
HEAD = ("lm_head", 151936, 4096)
CONFIGS = [(8, 2, 1, 4), (16, 2, 1, 4), (16, 4, 1, 3), (16, 2, 1, 6), (32, 2, 1, 3), (32, 2, 2, 4), (64, 2, 2, 3),
           (64, 1, 1, 4), (16, 8, 1, 3), (32, 4, 2, 3), (16, 2, 2, 4)]


def name(c):
    return "n%d-g%d-w%d-s%d" % c


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", default="px_tiled_bench.json")
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
        data[s] = (x, w, sc, torch.empty(k, device=dev), torch.empty(k // 8, device=dev), px.to_tiled(w))
    res = {"name": "px_tiled_bench", "env": environment("cuda"), "configs": [name(c) for c in CONFIGS], "check": {},
           "us": {}, "best": {}}
    for s, n, k in shapes:
        x, w, sc, xp, xs, wt = data[s]
        ref = quantized_matmul_reference(x.float(), w, sc, "int4")
        for c in CONFIGS:
            out = px.gemv_px(x.float(), w, sc, *c, tiled=wt)
            err = ((out - ref).abs().max() / ref.abs().max()).item()
            res["check"][f"{s} {name(c)}"] = err
            assert err < 1e-4, (s, c, err)
    print("check ok", flush=True)
    bench = lambda fn: triton.testing.do_bench_cudagraph(fn, rep=20, return_mode="median") * 1e3
    for s, n, k in shapes:
        x, w, sc, xp, xs, wt = data[s]
        px.gemv_px(x, w, sc, xp=xp, xs=xs)  # xp, xs prepared from x
        t = {"table": bench(lambda: quantized_matmul(x, w, sc, "int4"))}
        for c in CONFIGS:
            t["row " + name(c)] = bench(lambda: px.gemv_px(x, w, sc, *c, xp=xp, xs=xs, prep=False))
            t["tiled " + name(c)] = bench(lambda: px.gemv_px(x, w, sc, *c, xp=xp, xs=xs, prep=False, tiled=wt))
        best = min(CONFIGS, key=lambda c: t["tiled " + name(c)])
        t["tiled prep+best"] = bench(lambda: px.gemv_px(x, w, sc, *best, xp=xp, xs=xs, tiled=wt))
        res["us"][s], res["best"][s] = t, name(best)
        nbytes = n * k // 2 + n * k // 128 * 4
        print(s, " ".join(f"{a} {b:.2f}" for a, b in t.items()), flush=True)
        print(f"   best tiled {name(best)} {t['tiled ' + name(best)]:.2f} us {nbytes / t['tiled ' + name(best)] / 1e6:.2f}"
              f" TB/s; table {t['table']:.2f} us {nbytes / t['table'] / 1e6:.2f} TB/s", flush=True)
    seq = [s for _ in range(36) for s in LAYER] + [HEAD]
    best = {s: next(c for c in CONFIGS if name(c) == res["best"][s]) for s, _, _ in shapes}

    def chain(kind):
        def run():
            y = data["qkv_proj"][0]
            for s, n, k in seq:
                x, w, sc, xp, xs, wt = data[s]
                xx = y[:, :k] if y.shape[1] >= k else x
                if kind == "table":
                    y = quantized_matmul(xx, w, sc, "int4")
                else:
                    y = px.gemv_px(xx, w, sc, *best[s], xp=xp, xs=xs, prep=kind == "tiled", tiled=wt)
        return run

    graphs = {}
    for kind in ("table", "tiled", "tiled-noprep"):
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
