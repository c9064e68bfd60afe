"""Scratch: the paged decode kernel with an FP8 cache against bf16, launch parameters crossed, nanovllm's steady state."""
import itertools, json, math, os, sys, statistics
import torch, triton, triton.testing
from milestones.m08_triton_kernel.launch_config import DecodeKernelConfig, LAUNCH_TABLE, FP8_LAUNCH_TABLE
from milestones.m08_triton_kernel.paged_decode_kernel import paged_decode_attention, paged_decode_attention_reference

def case(batch, context, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    heads, kv_heads, dim, bs = 16, 8, 128, 16
    blocks_per = context // bs
    num_blocks = batch * blocks_per + 8
    q = torch.randn(batch, heads, dim, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(num_blocks, bs, kv_heads, dim, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(num_blocks, bs, kv_heads, dim, device="cuda", dtype=torch.bfloat16, generator=g)
    perm = torch.randperm(num_blocks, device="cuda", generator=g)[: batch * blocks_per]
    table = perm.view(batch, blocks_per).to(torch.int32)
    lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    ks = vs = None
    if dtype == "fp8":
        ks = (k.abs().amax().float() / 448).reshape(1); vs = (v.abs().amax().float() / 448).reshape(1)
        k = (k.float() / ks).to(torch.float8_e4m3fn); v = (v.float() / vs).to(torch.float8_e4m3fn)
    return q, k, v, table, lens, ks, vs

def main():
    out = {"gpu": torch.cuda.get_device_name(), "triton": triton.__version__, "torch": torch.__version__, "rows": []}
    shapes = [(176, 1024), (64, 2048)]
    for batch, context in shapes:
        for dtype in ("bf16", "fp8"):
            q, k, v, table, lens, ks, vs = case(batch, context, dtype)
            nbytes = 2 * batch * context * 8 * 128 * k.element_size()
            ref = paged_decode_attention_reference(q[:4], k, v, table[:4], lens[:4], 128 ** -0.5,
                                                   *( (ks, vs) if ks is not None else ()))
            grid = [(t, w, s) for t in (128, 256) for w in (4, 8) for s in (2, 3)] if dtype == "fp8" else []
            default = (FP8_LAUNCH_TABLE if dtype == "fp8" else LAUNCH_TABLE)["direct"]
            for t, w, s in [(None, None, None)] + grid:
                cfg = default if t is None else DecodeKernelConfig(tile_tokens=t, num_warps=w, num_stages=s)
                o = torch.empty_like(q)
                fn = lambda: paged_decode_attention(q, k, v, table, lens, 128 ** -0.5, out=o, config=cfg, num_splits=1,
                                                    k_scale=ks, v_scale=vs)
                try:
                    fn(); torch.cuda.synchronize()
                    err = (o[:4].float() - ref.float()).abs().max().item()
                    ms = triton.testing.do_bench_cudagraph(fn, rep=40)
                except Exception as e:  # out of shared memory etc.
                    print(batch, context, dtype, t, w, s, "failed:", str(e)[:120]); continue
                row = dict(batch=batch, context=context, kv=dtype, tile=cfg.tile_tokens, warps=cfg.num_warps,
                           stages=cfg.num_stages, table_default=t is None, ms=ms, tb_s=nbytes / ms / 1e9, max_err=err)
                out["rows"].append(row)
                print(f"{batch}x{context} {dtype} t{cfg.tile_tokens} w{cfg.num_warps} s{cfg.num_stages}"
                      f"{' (table)' if t is None else ''}: {ms*1e3:.1f} us {nbytes/ms/1e9:.2f} TB/s err {err:.3g}", flush=True)
    os.makedirs(sys.argv[1], exist_ok=True)
    json.dump(out, open(os.path.join(sys.argv[1], "fp8_decode_sweep.json"), "w"), indent=1)

main()
