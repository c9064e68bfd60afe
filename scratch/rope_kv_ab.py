"""One GPU call: the step with q/k norm + RoPE writing K/V into the cache (``int4-rope-kv``, ``kv_at_rope.py``)
against m08's store launch after it (m13's default until this is measured), beside bf16; 5 interleaved rounds
at 1, 2 and 4 rows (quant_step, no second gate). quant_step's slots are all -1 (timing stores nothing), so both
arms write no K/V: what differs is the store's launch, which is what the fusion removes.

    python3 scratch/rope_kv_ab.py OUT_DIR
"""

from __future__ import annotations

import sys

import benchmarks.quant_step as quant_step
from milestones.m13_quantization import epilogue_layers


def main(out_dir: str) -> None:
    plain_build = quant_step.build

    def build(mode, args):
        try:  # the graphs record the launches they capture
            epilogue_layers.ROPE_STORES_KV = mode == "int4-rope-kv"
            return plain_build(mode, args)
        finally:
            epilogue_layers.ROPE_STORES_KV = False

    quant_step.MODES.setdefault("int4-rope-kv", {"quantization": "int4"})
    quant_step.build = build
    quant_step.main(["--modes", "bf16,int4,int4-rope-kv", "--batches", "1,2,4", "--rounds", "5",
                     "--out", f"{out_dir}/m13_step_times_rope_kv.json"])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
