"""One GPU call: programmatic dependent launch (PDL) in m13's batch-1 decode step on qwen3-8b-random.

Modes (5 interleaved rounds, batch 1 and 2, 512 keys):
    bf16             m13's bf16 engine
    bf16-pdl         the same, every Triton kernel of the step's rest (m12's norms, q/k norm + RoPE, SiLU; m08's
                     K/V store, decode and combine) launched with PDL: it tells its dependents they may start
                     (griddepcontrol.launch_dependents), then waits for the kernel before (griddepcontrol.wait)
    int4             m13's table
    int4-pdl         the rest as bf16-pdl, and the GEMVs launched with PDL: each asks L2 for its whole slice of
                     weights (one bulk prefetch a row) before waiting, and lets its dependents start after its loop
    int4-pdl-nopf    the same without the prefetch
    int4-pdl-gemv    only the GEMVs with PDL and the prefetch (the rest launched as before)
With ``second`` (call 48): bf16, bf16-pdl, int4, int4-pdl-rest (the rest with PDL, the GEMVs as before),
int4-pdl-pf256 (the GEMVs' prefetch cut to one loop step) and int4-pdl-nopf.

Before timing, every PDL engine generates greedily from the same prompts at batch 1 and 2 as its plain twin does:
the tokens must be the same (PDL changes when kernels start, never what they compute).

    python3 scratch/pdl_ab.py OUT_DIR [second]
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import inspect
import json
import sys
import tempfile
import textwrap
from pathlib import Path

import benchmarks.quant_step as quant_step
from milestones.m08_triton_kernel import paged_decode_kernel, store_kv_kernel
from milestones.m08_triton_kernel.device_kernel import DeviceKernel
from milestones.m12_async_scheduling import fused_kernels
from milestones.m13_quantization import SamplingParams, matmul_kernels
from milestones.m13_quantization.launch_config import choose_launch

REST = {fused_kernels: ("_add_rms_norm_kernel", "_qk_norm_rope_kernel", "_silu_and_mul_kernel"),
        store_kv_kernel: ("_store_kv_kernel",),
        paged_decode_kernel: ("_paged_decode_kernel", "_combine_splits_kernel")}
TMP = Path(tempfile.mkdtemp(prefix="pdl_kernels_"))


class PDLKernel(DeviceKernel):
    def __getitem__(self, grid):
        launch = super().__getitem__(grid)
        return lambda *args, **kwargs: launch(*args, launch_pdl=True, **kwargs)


def pdl_twin(module, name: str) -> PDLKernel:
    """The kernel with launch_dependents + wait as its first statements (source rewritten, scratch only)."""
    fn = getattr(module, name).compiled.fn
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    f = tree.body[0]
    f.decorator_list = []
    first = int(bool(f.body) and isinstance(f.body[0], ast.Expr) and isinstance(f.body[0].value, ast.Constant))
    f.body[first:first] = ast.parse("tl.extra.cuda.gdc_launch_dependents()\ntl.extra.cuda.gdc_wait()").body
    path = TMP / f"{module.__name__.split('.')[-1]}{name}.py"
    path.write_text("import triton\nimport triton.language as tl\n\n\n@triton.jit\n" + ast.unparse(f) + "\n")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    twin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(twin)
    for key, value in vars(module).items():
        twin.__dict__.setdefault(key, value)
    return PDLKernel(getattr(twin, name))


TWINS = {(module, name): pdl_twin(module, name) for module, names in REST.items() for name in names}
SETTINGS = {"bf16": (False, None), "bf16-pdl": (True, None), "int4": (False, None),
            "int4-pdl": (True, 1 << 20), "int4-pdl-nopf": (True, 0), "int4-pdl-gemv": (False, 1 << 20)}
if len(sys.argv) > 2 and sys.argv[2] == "second":  # call 48: the rest alone, and a prefetch of one loop step
    SETTINGS = {"bf16": (False, None), "bf16-pdl": (True, None), "int4": (False, None),
                "int4-pdl-rest": (True, None), "int4-pdl-pf256": (True, 256), "int4-pdl-nopf": (True, 0)}


def chooser(prefetch):
    def choose(method, m, n, k, num_sms, table=None):
        config, split = choose_launch(method, m, n, k, num_sms)
        if prefetch is not None and config.kernel == "gemv":
            config = dataclasses.replace(config, pdl=True, prefetch_k=prefetch)
        return config, split

    return choose


def main(out_dir: str) -> None:
    plain_build = quant_step.build

    def build(mode, args):
        rest, prefetch = SETTINGS[mode]
        saved = {key: getattr(*key) for key in TWINS}
        saved_choose = matmul_kernels.choose_launch
        try:
            if rest:
                for (module, name), twin in TWINS.items():
                    setattr(module, name, twin)
            matmul_kernels.choose_launch = chooser(prefetch)
            engine = plain_build(mode, args)  # its graphs capture these launches
            tokens = {}
            for size in (1, 2):  # greedy through the captured decode graphs, checked against the plain twin below
                prompts = [[(7 * i + 13 * j) % 1000 + 5 for j in range(24 + 5 * i)] for i in range(size)]
                outs = engine.generate(prompts, SamplingParams(max_tokens=24, ignore_eos=True), use_tqdm=False)
                tokens[size] = [list(o.token_ids) for o in outs]
            CHECK[mode] = tokens
            return engine
        finally:
            for (module, name), kernel in saved.items():
                setattr(module, name, kernel)
            matmul_kernels.choose_launch = saved_choose

    for mode in SETTINGS:
        quant_step.MODES.setdefault(mode, {"quantization": "int4"} if mode.startswith("int4") else {})
    quant_step.build = build
    result = quant_step.main(["--modes", ",".join(SETTINGS), "--batches", "1,2", "--rounds", "5",
                              "--out", f"{out_dir}/m13_step_times_pdl_ab{'2' if 'int4-pdl-rest' in SETTINGS else ''}.json"])
    same = {mode: CHECK[mode] == CHECK["int4" if mode.startswith("int4") else "bf16"] for mode in SETTINGS}
    print("greedy tokens as the plain engine's:", same, flush=True)
    with open(f"{out_dir}/pdl_tokens.json", "w") as f:
        json.dump({"same_tokens": same, "tokens": CHECK}, f)


CHECK: dict = {}

if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
