"""What a tensor-parallel decode step pays to talk: NCCL all-reduce latency at the sizes m14 sends (two
``[B, hidden]`` all-reduces per layer), one process per GPU: eagerly, one call at a time, and replayed from a
CUDA graph holding a step's ``2 x layers`` of them, as m14's decode graphs do. NVLS stays off.

    python -m benchmarks.allreduce_bench --gpus 2 --hidden 1024,4096 --layers 28,36 --out-dir $OUT
"""

from __future__ import annotations

import argparse
import os
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.elastic.utils.distributed import get_free_port

from milestones.common.demo import cuda_median_ms

from .env import REPO_ROOT, environment, gpu_slug, write_json

ROWS = (1, 8, 32, 64, 128, 256)


def measure(rank: int, world_size: int, port: int, hiddens: list[int], layers: list[int], iters: int,
            out: str) -> None:
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=300), device_id=device)
    rows = []
    for hidden, num_layers in zip(hiddens, layers):
        calls = 2 * num_layers
        for batch in ROWS:
            tensor = torch.ones(batch, hidden, dtype=torch.bfloat16, device=device)
            eager = cuda_median_ms(lambda: dist.all_reduce(tensor), iters) * 1e3
            graph = torch.cuda.CUDAGraph()
            dist.all_reduce(tensor)  # the communicator is warm before capturing
            torch.cuda.synchronize()
            with torch.cuda.graph(graph):
                for _ in range(calls):
                    dist.all_reduce(tensor)
            step = cuda_median_ms(graph.replay, iters) * 1e3
            rows.append({"hidden": hidden, "layers": num_layers, "rows": batch, "bytes": batch * hidden * 2,
                         "eager_us": eager, "graph_us_per_call": step / calls, "graph_step_us": step,
                         "all_reduces_per_step": calls})
            if rank == 0:
                print(f"hidden {hidden} x {batch:>3} rows ({batch * hidden * 2:>9,} bytes): eager {eager:7.1f} us, "
                      f"in a graph {step / calls:6.1f} us per call, {step / 1e3:6.3f} ms per step of {calls}",
                      flush=True)
            del graph
    if rank == 0:
        result = {"kind": "allreduce_bench", "gpus": world_size, "backend": "nccl", "dtype": "bfloat16",
                  "iters": iters, "rows": rows, "env": environment(device),
                  "nccl_env": {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "TORCH_SYMM"))}}
        print(f"wrote {write_json(result, Path(out) / gpu_slug(device) / f'allreduce_{world_size}gpu.json')}")
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.allreduce_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--gpus", type=int, default=2, help="ranks, one GPU each")
    parser.add_argument("--hidden", default="1024,4096", help="hidden sizes (Qwen3-0.6B: 1024, Qwen3-8B: 4096)")
    parser.add_argument("--layers", default="28,36", help="layers of each model (2 all-reduces each per step)")
    parser.add_argument("--iters", type=int, default=50, help="timed calls (or replays) per size")
    parser.add_argument("--out-dir", type=Path, default=REPO_ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    hiddens, layers = [int(h) for h in args.hidden.split(",")], [int(n) for n in args.layers.split(",")]
    if len(hiddens) != len(layers):
        parser.error("--hidden and --layers need one entry per model")
    if torch.cuda.device_count() < args.gpus:
        parser.error(f"--gpus {args.gpus}: torch sees {torch.cuda.device_count()} GPU(s)")
    mp.spawn(measure, args=(args.gpus, get_free_port(), hiddens, layers, args.iters, str(args.out_dir)),
             nprocs=args.gpus)


if __name__ == "__main__":
    main()
