"""Compile a gemv variant for sm_90 here and count its SASS by opcode (scratch)."""
import os, sys, re, subprocess, tempfile, collections
os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, "tests")
import torch, triton
from compile_for_gpu import CompileOnly, TargetOnlyDriver
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver

def sass_of(compiled):
    cubin = compiled.asm["cubin"]
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    tool = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/nvdisasm")
    out = subprocess.run([tool, "-c", "-hex" if False else "-c", f.name], capture_output=True, text=True)
    return out.stdout

def loop_counts(sass):
    lines = [l for l in sass.splitlines() if re.search(r"/\*[0-9a-f]{4,}\*/", l)]
    # find the biggest backward branch: the main loop
    instrs = []
    for l in lines:
        m = re.search(r"/\*([0-9a-f]+)\*/\s+(.*?);", l)
        if m:
            instrs.append((int(m.group(1), 16), m.group(2).strip()))
    labels = {}
    for l in sass.splitlines():
        m = re.match(r"\.(L_x_\d+):", l.strip())
    best = None
    addr_of_label = {}
    cur = None
    for l in sass.splitlines():
        s = l.strip()
        m = re.match(r"^\.?(L_x_\d+):", s)
        if m:
            cur = m.group(1); continue
        m2 = re.search(r"/\*([0-9a-f]+)\*/", s)
        if m2 and cur:
            addr_of_label[cur] = int(m2.group(1), 16); cur = None
    for addr, ins in instrs:
        m = re.search(r"BRA\s+(?:`\()?\.?(L_x_\d+)", ins)
        if m and m.group(1) in addr_of_label and addr_of_label[m.group(1)] < addr:
            span = addr - addr_of_label[m.group(1)]
            if best is None or span > best[1] - best[0]:
                best = (addr_of_label[m.group(1)], addr)
    body = [ins for a, ins in instrs if best and best[0] <= a <= best[1]]
    ops = collections.Counter(re.sub(r"^@!?U?P\d+\s+", "", i).split()[0].split(".")[0] for i in body)
    return len(body), ops

def compile_gemv(config, m=1, n=4096, k=4096, dtype=torch.bfloat16, split_k=None):
    from milestones.m13_quantization import matmul_kernels as mk
    compiled = []
    orig = mk._quantized_gemv_kernel
    mk._quantized_gemv_kernel = CompileOnly(orig.compiled if hasattr(orig, "compiled") else orig, compiled)
    try:
        x = torch.zeros(m, k, dtype=dtype)
        w, s = torch.zeros(n, k // 2, dtype=torch.uint8), torch.ones(n, k // 128)
        mk.quantized_matmul(x, w, s, "int4", config=config, split_k=split_k)
    finally:
        mk._quantized_gemv_kernel = orig
    return compiled[0]

if __name__ == "__main__":
    driver.set_active(TargetOnlyDriver(GPUTarget("cuda", 90, 32)))
    from milestones.m13_quantization.launch_config import QuantMatmulConfig
    import milestones.m13_quantization.matmul_kernels as mk
    mk.runs_interpreted = lambda d: False
    specs = sys.argv[1:] or ["16,256,1,4"]
    for spec in specs:
        bn, bk, w, s = map(int, spec.split(","))
        c = compile_gemv(QuantMatmulConfig("gemv", block_n=bn, block_k=bk, num_warps=w, num_stages=s))
        sass = sass_of(c)
        n, ops = loop_counts(sass)
        bytes_per_iter = bn * bk // 2
        thr = 32 * w
        print(spec, "loop instrs", n, "per byte", n * thr / 32 / (bytes_per_iter / 32) / 1 if False else n / (bytes_per_iter / thr))
        print("   ", ops.most_common(25))
        open(f"/tmp/sass_{spec.replace(',', '_')}.txt", "w").write(sass)
