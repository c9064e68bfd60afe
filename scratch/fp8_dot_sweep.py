"""Scratch (a diagnosis, not a milestone): does the FP8 decode kernel read faster when its dots run on FP8 tensor
cores, as vLLM's FlashAttention-3 path does (q quantized per row; optionally p too), instead of widening K/V?"""
import json, os, sys
import torch, triton, triton.language as tl, triton.testing
from milestones.m08_triton_kernel.launch_config import DecodeKernelConfig, LAUNCH_TABLE, FP8_LAUNCH_TABLE
from milestones.m08_triton_kernel.paged_decode_kernel import (paged_decode_attention, paged_decode_attention_reference,
                                                              LOG2_E, _load_kv_tile)

@triton.jit
def _fp8_dot_kernel(q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr, out_ptr, k_scale_ptr,
                    v_scale_ptr, scale_log2, stride_q_seq, stride_q_head, stride_k_block, stride_k_slot, stride_k_head,
                    stride_table, GROUP: tl.constexpr, GROUP_ROWS: tl.constexpr, HEAD_DIM: tl.constexpr,
                    BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, PV_FP8: tl.constexpr):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    end = tl.load(context_lens_ptr + seq)
    rows = tl.arange(0, GROUP_ROWS)
    dims = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + rows
    q = tl.load(q_ptr + seq * stride_q_seq + heads[:, None] * stride_q_head + dims[None, :],
                mask=(rows < GROUP)[:, None], other=0.0).to(tl.float32)
    q_scale = tl.maximum(tl.max(tl.abs(q), 1), 1e-12) / 448.0  # per row
    q8 = (q / q_scale[:, None]).to(tl.float8e4nv)
    row_scale = q_scale * scale_log2 * tl.load(k_scale_ptr)
    m = tl.full([GROUP_ROWS], float("-inf"), tl.float32)
    l = tl.zeros([GROUP_ROWS], tl.float32)
    acc = tl.zeros([GROUP_ROWS, HEAD_DIM], tl.float32)
    table_row = block_tables_ptr + seq * stride_table
    k_head = k_cache_ptr + kv_head * stride_k_head
    v_head = v_cache_ptr + kv_head * stride_k_head
    next_keys = tl.arange(0, TILE)
    next_blocks = tl.load(table_row + next_keys // BLOCK_SIZE, mask=next_keys < end, other=0)
    for tile_start in range(0, end, TILE):
        keys = tile_start + tl.arange(0, TILE)
        valid = keys < end
        block = next_blocks.to(tl.int64)
        next_keys = keys + TILE
        next_blocks = tl.load(table_row + next_keys // BLOCK_SIZE, mask=next_keys < end, other=0)
        k, v = _load_kv_tile(k_head, v_head, block, keys % BLOCK_SIZE, dims, valid, stride_k_block, stride_k_slot,
                             stride_k_block, stride_k_slot, False, False)
        scores = tl.dot(q8, tl.trans(k)) * row_scale[:, None]
        scores = tl.where(valid[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, 1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l = l * alpha + tl.sum(p, 1)
        if PV_FP8:
            pv = tl.dot((p * 256.0).to(tl.float8e4nv), v) * (1.0 / 256.0)
        else:
            pv = tl.dot(p.to(tl.float16), v.to(tl.float16))
        acc = acc * alpha[:, None] + pv
        m = m_new
    out = acc / tl.where(l > 0, l, 1.0)[:, None] * tl.load(v_scale_ptr)
    tl.store(out_ptr + seq * stride_q_seq + heads[:, None] * stride_q_head + dims[None, :], out.to(out_ptr.dtype.element_ty),
             mask=(rows < GROUP)[:, None])


def fp8_dot_attention(q, k, v, table, lens, scale, ks, vs, out, tile, warps, stages, pv_fp8):
    b, h, d = q.shape
    kvh = k.shape[2]
    _fp8_dot_kernel[(b, kvh)](q, k, v, table, lens, out, ks, vs, scale * LOG2_E, q.stride(0), q.stride(1),
                              k.stride(0), k.stride(1), k.stride(2), table.stride(0), GROUP=h // kvh, GROUP_ROWS=16,
                              HEAD_DIM=d, BLOCK_SIZE=k.shape[1], TILE=tile, PV_FP8=pv_fp8, num_warps=warps,
                              num_stages=stages)
    return out


def case(batch, context, fp8, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    heads, kv_heads, dim, bs = 16, 8, 128, 16
    blocks_per = context // bs
    num_blocks = batch * blocks_per + 8
    q = torch.randn(batch, heads, dim, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(num_blocks, bs, kv_heads, dim, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(num_blocks, bs, kv_heads, dim, device="cuda", dtype=torch.bfloat16, generator=g)
    table = torch.randperm(num_blocks, device="cuda", generator=g)[: batch * blocks_per].view(batch, blocks_per).int()
    lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    ks = vs = None
    if fp8:
        ks = (k.abs().amax().float() / 448).reshape(1); vs = (v.abs().amax().float() / 448).reshape(1)
        k = (k.float() / ks).to(torch.float8_e4m3fn); v = (v.float() / vs).to(torch.float8_e4m3fn)
    return q, k, v, table, lens, ks, vs


def main():
    out = {"gpu": torch.cuda.get_device_name(), "triton": triton.__version__, "torch": torch.__version__, "rows": []}
    scale = 128 ** -0.5
    for batch, context in [(176, 1024), (64, 2048)]:
        for label, fp8 in (("bf16 m08", False), ("fp8 m08", True)):
            q, k, v, table, lens, ks, vs = case(batch, context, fp8)
            nbytes = 2 * batch * context * 8 * 128 * k.element_size()
            ref = paged_decode_attention_reference(q[:8], k, v, table[:8], lens[:8], scale,
                                                   *((ks, vs) if fp8 else ())).float()
            candidates = [("table", (FP8_LAUNCH_TABLE if fp8 else LAUNCH_TABLE)["direct"], None)]
            if fp8:
                candidates += [("m08 t128 w4 s3", DecodeKernelConfig(tile_tokens=128, num_warps=4, num_stages=3), None)]
                candidates += [(f"fp8 dots{' +pv' if pv else ''} t{t} w{w} s{s}", None, (t, w, s, pv))
                               for pv in (False, True) for t in (64, 128) for w in (4, 8) for s in (2, 3)]
            for name, cfg, dot in candidates:
                o = torch.empty_like(q)
                if dot is None:
                    fn = lambda: paged_decode_attention(q, k, v, table, lens, scale, out=o, config=cfg, num_splits=1,
                                                        k_scale=ks, v_scale=vs)
                else:
                    fn = lambda: fp8_dot_attention(q, k, v, table, lens, scale, ks, vs, o, *dot)
                try:
                    fn(); torch.cuda.synchronize()
                    err = (o[:8].float() - ref).abs().max().item()
                    rms = ((o[:8].float() - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()
                    ms = triton.testing.do_bench_cudagraph(fn, rep=40)
                except Exception as e:
                    print(batch, context, label, name, "failed:", str(e)[:300], flush=True); continue
                row = dict(batch=batch, context=context, cache=label, kernel=name, ms=ms, tb_s=nbytes / ms / 1e9,
                           max_abs_err=err, rel_rms_err=rms)
                out["rows"].append(row)
                print(f"{batch}x{context} {label:8s} {name:24s} {ms*1e3:7.1f} us {nbytes/ms/1e9:5.2f} TB/s "
                      f"max err {err:.3g} rel rms {rms:.3g}", flush=True)
    os.makedirs(sys.argv[1], exist_ok=True)
    json.dump(out, open(os.path.join(sys.argv[1], "fp8_dot_sweep.json"), "w"), indent=1)

main()
