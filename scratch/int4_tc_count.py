"""Compile scratch/int4_tc.py's kernel for sm_90 on a machine without a GPU and count its loop's SASS instructions:
    .venv/bin/python scratch/int4_tc_count.py   (from the repository root)
"""
import os, sys
os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, "tests"); sys.path.insert(0, ".")
import torch, re
from compile_for_gpu import TargetOnlyDriver
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver
driver.set_active(TargetOnlyDriver(GPUTarget("cuda", 90, 32)))
import importlib.util
spec = importlib.util.spec_from_file_location("tc", "scratch/int4_tc.py"); tc = importlib.util.module_from_spec(spec); spec.loader.exec_module(tc)
n, k = 4096, 4096
x = torch.zeros(4, k, dtype=torch.bfloat16); w = torch.zeros(n // 16, k // 128, 16, 16, dtype=torch.int32); s = torch.ones(n, k // 128); out = torch.zeros(4, n)
for bn, warps, stages in ((64, 4, 3), (128, 4, 3), (32, 4, 3)):
    kk = tc._tc_kernel.warmup(x, w, s, out, 4, n, k, 512, x.stride(0), s.stride(0), BLOCK_N=bn, STAGES=stages, num_warps=warps, grid=(n // bn, 8))
    sass_like = kk.asm["ptx"]
    loop = sass_like
    print(bn, warps, stages, "shared", kk.metadata.shared, "mma", len(re.findall(r"mma\.sync|wgmma", loop)), "lop3", len(re.findall(r"lop3", loop)), "ldmatrix", len(re.findall("ldmatrix", loop)), "st.shared", len(re.findall(r"st\.shared", loop)), "lines", len(loop.splitlines()))
import subprocess, tempfile
kk = tc._tc_kernel.warmup(x, w, s, out, 4, n, k, 512, x.stride(0), s.stride(0), BLOCK_N=64, STAGES=3, num_warps=4, grid=(n // 64, 8))
p = tempfile.mktemp(suffix=".cubin"); open(p, "wb").write(kk.asm["cubin"])
b = [f for f in os.listdir(os.path.dirname(__import__("triton").__file__) + "/backends/nvidia/bin")]
tool = os.path.dirname(__import__("triton").__file__) + "/backends/nvidia/bin/cuobjdump"
sass = subprocess.run([tool, "-sass", p], capture_output=True, text=True).stdout
lines = [l for l in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", l)]
print("total instr", len(lines))
# find loop: backward branch
for i, l in enumerate(lines):
    m = re.search(r"BRA\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))", l)
    if m and m.group(1):
        tgt = int(m.group(1), 16); cur = int(re.search(r"/\*([0-9a-f]{4})\*/", l).group(1), 16)
        if tgt < cur: print("backward branch at", hex(cur), "to", hex(tgt), "loop instrs", (cur - tgt) // 16)
