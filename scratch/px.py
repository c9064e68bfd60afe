"""Experiment: int4 GEMV with x prepared once (prescaled floats in nibble order), batch 1."""
import triton
import triton.language as tl
import torch

X_UP = tl.constexpr(18446744073709551616.0)  # 2^64
NIBBLE_OFFSET = tl.constexpr(-2.0679515313825692e-25)  # -8 * 2^-85
UNIT_DOWN = tl.constexpr(3.8685626227668134e25)  # 2^85


@triton.jit
def prep_x_kernel(x_ptr, xp_ptr, xs_ptr, TOP: tl.constexpr):
    """Program g: group g of x -> xp[g, p, c] = x[128g + 4c + p//2 + 64(p%2)] * 2^(64 - 4p) (p < 6) or 2^64,
    and xs[g, c] = -8 * 2^-85 * sum_p x[...]."""
    g = tl.program_id(0)
    c = tl.arange(0, 16)
    total = tl.zeros([16], tl.float32)
    for p in tl.static_range(8):
        x = tl.load(x_ptr + g * 128 + 4 * c + p // 2 + 64 * (p % 2)).to(tl.float32)
        total += x
        if p < 6:
            up = X_UP / (1 << (4 * p))
        else:
            up = X_UP
        if TOP and p == 6:
            x6 = x
        if TOP and p == 7:
            x = x - 16.0 * x6  # f6 = n6 + 16 n7, f7 = n7: n6 x6 + n7 x7 = f6 x6 + f7 (x7 - 16 x6)
        tl.store(xp_ptr + (g * 8 + p) * 16 + c, x * up)
    tl.store(xs_ptr + g * 16 + c, total * NIBBLE_OFFSET)


@triton.jit
def _nib(words, P: tl.constexpr, TOP: tl.constexpr):
    if TOP and P >= 6:
        f = (words.to(tl.uint32, bitcast=True) >> (4 * P)).to(tl.float32, bitcast=True)
    elif P < 6:
        f = (words & (0xF << (4 * P))).to(tl.float32, bitcast=True)
    else:
        f = ((words >> (4 * P)) & 0xF).to(tl.float32, bitcast=True)
    return f


@triton.jit
def gemv_px_kernel(xp_ptr, xs_ptr, w_ptr, s_ptr, out_ptr, N, K, stride_wn, stride_sn,
                   BLOCK_N: tl.constexpr, GPS: tl.constexpr, NUM_STAGES: tl.constexpr, TOP: tl.constexpr,
                   TILED: tl.constexpr):
    pid = tl.program_id(0)
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    c = tl.arange(0, 16)
    acc = tl.zeros([BLOCK_N, 16], tl.float32)
    if TILED:  # [N/16, G, 16 rows, 16 words]: group g of rows 16rb..16rb+15 is one contiguous KiB
        w_rows = w_ptr + ((cols // 16) * (K // 128) * 256 + (cols % 16) * 16)[:, None]
    else:
        w_rows = w_ptr + cols[:, None] * stride_wn
    for g0 in tl.range(0, K // 128, GPS, num_stages=NUM_STAGES):
        for t in tl.static_range(GPS):
            g = g0 + t
            if TILED:
                words = tl.load(w_rows + (g * 256 + c)[None, :])
            else:
                words = tl.load(w_rows + (g * 16 + c)[None, :])
            scale = tl.load(s_ptr + cols * stride_sn + g)
            part = tl.zeros([BLOCK_N, 16], tl.float32) + tl.load(xs_ptr + g * 16 + c)[None, :]
            for p in tl.static_range(8):
                part += _nib(words, p, TOP) * tl.load(xp_ptr + (g * 8 + p) * 16 + c)[None, :]
            acc += part * scale[:, None]
    tl.store(out_ptr + cols, (tl.sum(acc, axis=1) * UNIT_DOWN).to(out_ptr.dtype.element_ty))


def gemv_px(x, qweight, scales, block_n=16, gps=2, warps=1, stages=4, top=True, xp=None, xs=None, prep=True, tiled=None):
    n, k = qweight.shape[0], x.shape[1]
    g = k // 128
    if xp is None:
        xp = torch.empty(g * 128, dtype=torch.float32, device=x.device)
        xs = torch.empty(g * 16, dtype=torch.float32, device=x.device)
    if prep:
        prep_x_kernel[(g,)](x, xp, xs, TOP=top, num_warps=1)
    out = x.new_empty((1, n))
    words = (qweight if tiled is None else tiled).view(torch.int32)
    gemv_px_kernel[(triton.cdiv(n, block_n),)](xp, xs, words, scales, out, n, k, words.stride(0), scales.stride(0),
                                               BLOCK_N=block_n, GPS=gps, NUM_STAGES=stages, TOP=top, TILED=tiled is not None,
                                               num_warps=warps)
    return out


def to_tiled(qweight):
    """[N, K/2] bytes -> [N/16, K/128, 16, 64]: each 128-input group of 16 rows one contiguous KiB."""
    n, half = qweight.shape
    return qweight.view(n // 16, 16, half // 64, 64).permute(0, 2, 1, 3).contiguous()
