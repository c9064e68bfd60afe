"""Scratch: compile m08's decode kernel for sm_90 (no GPU) and count the SASS instructions of its main loop.

    python scratch/sass_count.py [--dump DIR]
Instructions per byte = (loop-body instructions per thread) * threads / (K+V bytes of one tile).
"""
import os
os.environ["TRITON_INTERPRET"] = "0"
import argparse, re, subprocess, sys, tempfile
from pathlib import Path
import torch
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests")); sys.path.insert(0, str(ROOT))
from compile_for_gpu import CompileOnly, TargetOnlyDriver  # noqa


def loop_body(sass: str):
    """The instructions between the target of the largest backward branch and that branch."""
    lines = sass.splitlines()
    instrs, labels = [], {}
    for line in lines:
        m = re.match(r"\s*\.(L_x_\d+):", line)
        if m:
            labels[m.group(1)] = len(instrs)
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            instrs.append(m.group(2).strip())
    best = None
    for i, ins in enumerate(instrs):
        m = re.search(r"BRA\s+(?:`\()?\.?(L_x_\d+)", ins)
        if m and m.group(1) in labels and labels[m.group(1)] <= i:
            start = labels[m.group(1)]
            if best is None or i - start > best[1] - best[0]:
                best = (start, i)
    return instrs[best[0]:best[1] + 1] if best else []


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", default=None)
    ap.add_argument("--only", default=None)
    args = ap.parse_args()
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver
    from triton.backends.nvidia.compiler import get_ptxas
    from milestones.m08_triton_kernel import paged_decode_kernel as pdk
    from milestones.m08_triton_kernel.launch_config import FP8_LAUNCH_TABLE, LAUNCH_TABLE, DecodeKernelConfig
    if os.environ.get("PAIRS") is not None:
        pdk.FP8_PAIRS = os.environ["PAIRS"] == "1"
    if os.environ.get("WIDEN") is not None:
        pdk.FP8_WIDEN = int(os.environ["WIDEN"])
    driver.set_active(TargetOnlyDriver(GPUTarget("cuda", 90, 32)))
    compiled = []
    pdk._paged_decode_kernel = CompileOnly(pdk._paged_decode_kernel.compiled, compiled)
    pdk._combine_splits_kernel = CompileOnly(pdk._combine_splits_kernel.compiled, [])
    pdk.runs_interpreted = lambda device: False
    nvdisasm = str(Path(get_ptxas(90).path).parent / "nvdisasm")
    cases = [("bf16 direct", torch.bfloat16, LAUNCH_TABLE["direct"], 1),
             ("bf16 split", torch.bfloat16, LAUNCH_TABLE["split"], 4),
             ("fp8 direct", torch.float8_e4m3fn, FP8_LAUNCH_TABLE["direct"], 1),
             ("fp8 split", torch.float8_e4m3fn, FP8_LAUNCH_TABLE["split"], 4)]
    extra = os.environ.get("EXTRA_CFGS")  # e.g. "64:4:3,128:8:2"
    if extra:
        for c in extra.split(","):
            t, w, s = map(int, c.split(":"))
            cases.append((f"fp8 t{t}w{w}s{s}", torch.float8_e4m3fn, DecodeKernelConfig(tile_tokens=t, num_warps=w, num_stages=s), 1))
    for name, cdtype, config, splits in cases:
        if args.only and args.only not in name:
            continue
        q = torch.zeros(2, 16, 128, dtype=torch.bfloat16)
        cache = torch.zeros(8, 16, 8, 128, dtype=cdtype)
        tables = torch.arange(8, dtype=torch.int32).view(2, 4)
        lens = torch.tensor([40, 64])
        scales = dict(k_scale=torch.ones(1), v_scale=torch.ones(1)) if cdtype == torch.float8_e4m3fn else {}
        n = len(compiled)
        pdk.paged_decode_attention(q, cache, cache.clone(), tables, lens, 128 ** -0.5, num_splits=splits,
                                   config=config, **scales)
        k = compiled[n]
        with tempfile.TemporaryDirectory() as tmp:
            p = Path(tmp) / "k.cubin"; p.write_bytes(k.asm["cubin"])
            sass = subprocess.run([nvdisasm, "-c", "-hex" if False else "-c", str(p)], capture_output=True, text=True).stdout
            ptxp = Path(tmp) / "k.ptx"; ptxp.write_text(k.asm["ptx"])
            v = subprocess.run([get_ptxas(90).path, "-v", "--gpu-name=sm_90a", str(ptxp), "-o", str(Path(tmp) / "x.cubin")],
                               capture_output=True, text=True).stderr
        regs = re.search(r"Used (\d+) registers", v).group(1)
        spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", v).groups()
        body = loop_body(sass)
        threads = config.num_warps * 32
        elem = 1 if cdtype == torch.float8_e4m3fn else 2
        nbytes = config.tile_tokens * 128 * 2 * elem
        ops = {}
        for ins in body:
            op = re.sub(r"^@!?U?P\w+\s+", "", ins).split()[0]
            ops[op] = ops.get(op, 0) + 1
        top = sorted(ops.items(), key=lambda x: -x[1])[:14]
        print(f"{name:16s} tile {config.tile_tokens} w{config.num_warps} s{config.num_stages}: loop {len(body)} instr, "
              f"{len(body) * threads / nbytes:.2f} instr/byte, {regs} regs, spills {spill}, smem {k.metadata.shared}")
        print("    " + " ".join(f"{o}:{c}" for o, c in top))
        if args.dump:
            d = Path(args.dump); d.mkdir(parents=True, exist_ok=True)
            tag = name.replace(" ", "_")
            (d / f"{tag}.sass").write_text(sass); (d / f"{tag}.ptx").write_text(k.asm["ptx"])
            (d / f"{tag}.loop.sass").write_text("\n".join(body))


main()
