"""How much of a forward pass is launch overhead? The forward passes the milestones run (m01's 544-token
sequence, m02's decode step against 544 cached tokens, m03's at 64 rows x 400), timed eagerly and replayed from a
CUDA graph (``triton.testing``): ``eager - graph`` is roughly the cost of launching from Python.

    python -m benchmarks.launch_overhead            # on a CUDA machine; writes results/<gpu>/launch_overhead.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import triton.testing

from milestones.m01_naive_loop.attention import CausalAttention
from milestones.m01_naive_loop.config import EngineConfig
from milestones.m01_naive_loop.loader import load_model
from milestones.m02_kv_cache.kv_cache import CachedAttention, KVCache
from milestones.m03_static_batching.attention import PaddedCachedAttention

from .env import environment, write_json


def eager_and_graph(forward) -> dict[str, float]:
    """``forward()`` timed eagerly (``triton.testing.do_bench``) and replayed from a CUDA graph
    (``do_bench_cudagraph``), medians in milliseconds."""
    eager = triton.testing.do_bench(forward, return_mode="median")
    replay = triton.testing.do_bench_cudagraph(forward, return_mode="median")
    return {"eager_ms": eager, "graph_ms": replay, "launch_overhead_ms": eager - replay}


@torch.inference_mode()
def measure(model_name: str) -> dict:
    config = EngineConfig(model=model_name, device="cuda", dtype="bfloat16")
    device, dtype = config.resolve_device(), config.resolve_dtype(torch.device("cuda"))
    loaded = load_model(model_name, device, dtype)
    model, model_config = loaded.model, loaded.config
    torch.backends.cuda.enable_cudnn_sdp(False)  # as the engines do
    length = 544

    ids = torch.randint(0, 151_643, (1, length), device=device)
    positions = torch.arange(length, device=device)[None, :]
    m01 = eager_and_graph(lambda: model(ids, positions, CausalAttention()))

    cache = KVCache.for_model(model_config, 1, length + 1, dtype, device)
    model(ids, positions, CachedAttention(cache, 0, length))  # fill the cache
    last, last_pos = ids[:, -1:], torch.tensor([[length]], device=device)
    m02 = eager_and_graph(lambda: model(last, last_pos, CachedAttention(cache, length, 1)))

    rows, context = 64, 400
    batch_cache = KVCache.for_model(model_config, rows, context + 1, dtype, device)
    batch_cache.k.normal_()
    batch_cache.v.normal_()
    pads = torch.zeros(rows, dtype=torch.long, device=device)
    batch_ids = torch.randint(0, 151_643, (rows, 1), device=device)
    batch_pos = torch.full((rows, 1), context, device=device)
    m03 = eager_and_graph(lambda: model(batch_ids, batch_pos, PaddedCachedAttention(batch_cache, context, 1, pads)))

    return {"name": "launch_overhead", "env": environment(), "model": {"name": model_name, "dtype": "bfloat16"},
            "forwards": {"m01_full_sequence_544": m01, "m02_decode_1x544": m02, "m03_decode_64x400": m03}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.launch_overhead", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen3-0.6b-random")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)
    result = measure(args.model)
    for name, row in result["forwards"].items():
        print(f"{name:24s} eager {row['eager_ms']:7.2f} ms   graph {row['graph_ms']:7.2f} ms   "
              f"launch overhead {row['launch_overhead_ms']:7.2f} ms")
    print(f"-> {write_json(result, Path(args.out) / result['env']['gpu_slug'] / 'launch_overhead.json')}")


if __name__ == "__main__":
    main()
