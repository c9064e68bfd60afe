"""One GPU call: how much of a batch-1 step the attention's split count costs, in bf16 and int4.

A captured decode graph serves every context length up to ``max_model_len`` (40,960 for Qwen3-8B), so m08's
heuristic picks the splits from that bound: at batch 1, 49 slices per K/V head. At 512 keys only 8 of them hold a
key (a slice is cut in whole 64-key tiles), the other 41 programs find nothing, and the combine weighs 49 partial
rows per head. Here the same engines are captured with the split count capped at 8 and at 4 (the same keys, fewer
empty programs and a shorter combine; 4: two tiles a program), quant_step's step, 5 interleaved rounds, and the
step's kernels under torch.profiler (``step_kernels.py``) for bf16 and int4 at batch 1, as captured now.

    python3 scratch/attention_splits.py OUT_DIR
"""

from __future__ import annotations

import json
import sys

import benchmarks.quant_step as quant_step
from milestones.m08_triton_kernel import paged_decode_kernel

CAPS = {"bf16-s8": ("bf16", 8), "int4-s8": ("int4", 8), "bf16-s4": ("bf16", 4), "int4-s4": ("int4", 4)}


def main(out_dir: str) -> None:
    plain_build, plain_choose = quant_step.build, paged_decode_kernel.choose_launch

    def build(mode, args):
        try:  # the graphs record the split count they capture: the cap matters only while building
            if mode in CAPS:
                cap = CAPS[mode][1]

                def choose(*a, **k):
                    config, splits = plain_choose(*a, **k)
                    return config, min(splits, cap)
                paged_decode_kernel.choose_launch = choose
            return plain_build(mode, args)
        finally:
            paged_decode_kernel.choose_launch = plain_choose

    for mode, (base, _) in CAPS.items():
        quant_step.MODES.setdefault(mode, quant_step.MODES[base])
    quant_step.build = build
    quant_step.main(["--modes", "bf16,int4,bf16-s8,int4-s8,bf16-s4,int4-s4", "--batches", "1,2,4", "--rounds", "5",
                     "--out", f"{out_dir}/m13_step_times_attention_splits.json"])
    quant_step.build = plain_build


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    main(out)
    if len(sys.argv) < 3 or sys.argv[2] != "no-profile":
        sys.path.insert(0, "scratch")
        import step_kernels

        step_kernels.main(f"{out}/m13_step_kernels_now.json", [1])
        print(json.dumps({"profiled": f"{out}/m13_step_kernels_now.json"}))
