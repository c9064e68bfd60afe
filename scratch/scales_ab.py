"""One GPU call: int4's scales stored group by group (``quantize.group_major``) against row by row, in m13's step.

Call 54 (``scratch/gemv_anatomy.py`` at 517c503) rebuilt the batch-1 GEMV part by part: at m13's launch its loads
alone stream as fast as a kernel that only streams, and loading each group's x and scales cost 1.2-4 us a matmul
(17.7 on the LM head). Row by row, a program's 32 scales of one group are 32 separate 32-byte sectors. The engine
now stores int4 scales group by group (128 contiguous bytes a group of 32 rows); this call times both layouts.

Modes (quant_step on qwen3-8b-random, batch 1, 2 and 4, 5 interleaved rounds, 512 keys):
    bf16          m13's bf16 engine
    int4          m13's int4 engine, scales group by group (the code at this commit)
    int4-rows     the same engine built with scales row by row (``group_major`` replaced by the identity)
Before timing, both int4 engines generate greedily at batch 1 and 2 through their captured graphs: the tokens
must be the same (the kernels add the same products in the same order; only the scales' addresses differ).

    python3 scratch/scales_ab.py OUT_DIR
"""

from __future__ import annotations

import json
import sys

import benchmarks.quant_step as quant_step
from milestones.m13_quantization import SamplingParams, quantize

MODES = ("bf16", "int4", "int4-rows")
CHECK: dict = {}


def main(out_dir: str) -> None:
    plain_build = quant_step.build

    def build(mode, args):
        saved = quantize.group_major
        try:
            if mode == "int4-rows":
                quantize.group_major = lambda scales: scales
            engine = plain_build(mode, args)
        finally:
            quantize.group_major = saved
        scales = [m.scales for m in engine.model.modules() if isinstance(m, quantize.QuantizedLinear)]
        print(f"[{mode}] scales strides: {sorted({tuple(s.stride()) for s in scales})[:3]}", flush=True)
        if mode.startswith("int4"):
            tokens = {}
            for size in (1, 2):
                prompts = [[(7 * i + 13 * j) % 1000 + 5 for j in range(24 + 5 * i)] for i in range(size)]
                outs = engine.generate(prompts, SamplingParams(max_tokens=24, ignore_eos=True), use_tqdm=False)
                tokens[size] = [list(o.token_ids) for o in outs]
            CHECK[mode] = tokens
        return engine

    quant_step.MODES.setdefault("int4-rows", {"quantization": "int4"})
    quant_step.build = build
    quant_step.main(["--modes", ",".join(MODES), "--batches", "1,2,4", "--rounds", "5",
                     "--out", f"{out_dir}/m13_step_times+scales-ab.json"])
    same = CHECK.get("int4") == CHECK.get("int4-rows") and "int4" in CHECK
    print(f"greedy tokens the same with both layouts: {same}", flush=True)
    with open(f"{out_dir}/m13_scales_tokens.json", "w") as f:
        json.dump({"same_tokens": same, "tokens": CHECK}, f)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
