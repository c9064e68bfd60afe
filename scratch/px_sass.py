import os, sys
os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, "tests")
import torch
from compile_for_gpu import CompileOnly, TargetOnlyDriver
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver
from scratch.sass import sass_of, loop_counts
import scratch.px as px

driver.set_active(TargetOnlyDriver(GPUTarget("cuda", 90, 32)))
for spec in sys.argv[1:]:
    bn, gps, w, s, top = map(int, spec.split(","))
    compiled = []
    orig = px.gemv_px_kernel
    px.gemv_px_kernel = CompileOnly(orig, compiled)
    px.prep_x_kernel = CompileOnly(px.prep_x_kernel if not isinstance(px.prep_x_kernel, CompileOnly) else px.prep_x_kernel.kernel, [])
    n, k = 4096, 4096
    x = torch.zeros(1, k, dtype=torch.bfloat16)
    px.gemv_px(x, torch.zeros(n, k // 2, dtype=torch.uint8), torch.ones(n, k // 128), bn, gps, w, s, bool(top))
    px.gemv_px_kernel = orig
    sass = sass_of(compiled[0])
    cnt, ops = loop_counts(sass)
    per_thread_bytes = bn * gps * 64 / (32 * w)
    print(spec, "loop", cnt, "per byte %.2f" % (cnt / per_thread_bytes), "shared", compiled[0].metadata.shared)
    print("   ", ops.most_common(16))
    open(f"/tmp/px_{spec.replace(',', '_')}.txt", "w").write(sass)
