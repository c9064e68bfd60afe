"""One GPU call: three launch knobs of m13's small kernels at 1, 2 and 4 rows (512 keys, 5 interleaved rounds,
quant_step), each engine's graphs captured under its own setting: the deferred norm in 16 programs a row
(``int4-n16``: ``deferred_norm.GROUPS_PER_PROGRAM`` 2, against 4), the combine at 2 warps (``int4-c2``:
``integer_heads.COMBINE_WARPS``, against 4), q/k norm + RoPE at 2 warps (``int4-r2``: ``sliced_sums.ROPE_WARPS``,
against 1), and all three (``int4-all``). Then the batch-1 step's kernels of int4 and int4-all under the profiler.

    python3 scratch/launch_knobs_ab.py OUT_DIR
"""

from __future__ import annotations

import sys

import benchmarks.quant_step as quant_step
import milestones.m13_quantization.deferred_norm as deferred_norm
import milestones.m13_quantization.integer_heads as integer_heads
import milestones.m13_quantization.sliced_sums as sliced_sums

KNOBS = {"GROUPS_PER_PROGRAM": deferred_norm, "COMBINE_WARPS": integer_heads, "ROPE_WARPS": sliced_sums}
VARIANTS = {"int4-n16": {"GROUPS_PER_PROGRAM": 2}, "int4-c2": {"COMBINE_WARPS": 2}, "int4-r2": {"ROPE_WARPS": 2},
            "int4-all": {"GROUPS_PER_PROGRAM": 2, "COMBINE_WARPS": 2, "ROPE_WARPS": 2}}


def main(out_dir: str) -> None:
    plain_build = quant_step.build
    defaults = {name: getattr(module, name) for name, module in KNOBS.items()}

    def build(mode, args):
        try:  # the graphs record the launches they capture
            for name, module in KNOBS.items():
                setattr(module, name, VARIANTS.get(mode, {}).get(name, defaults[name]))
            return plain_build(mode, args)
        finally:
            for name, module in KNOBS.items():
                setattr(module, name, defaults[name])

    for mode in VARIANTS:
        quant_step.MODES.setdefault(mode, quant_step.MODES["int4"])
    quant_step.build = build
    quant_step.main(["--modes", "bf16,int4," + ",".join(VARIANTS), "--batches", "1,2,4", "--rounds", "5",
                     "--out", f"{out_dir}/m13_step_times_launch_knobs.json"])
    from scratch.step_kernels import main as step_kernels

    step_kernels(f"{out_dir}/m13_step_kernels_launch_knobs.json", [1], ["int4", "int4-all"])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
