"""m13 on the CPU: the int8/int4 formats, the quantized matmul kernels and the FP8 K/V kernels, the engine.

* The formats round-trip within half a quantization step, and int4's nibbles sit where the layout says.
* The Triton kernels (quantized matmul in each regime, m08's store and decode kernels on an FP8 cache) run in
  Triton's interpreter against plain-torch references; with CUDA the same checks run compiled, plus Qwen3-8B's
  layer shapes. ``tests/compile_m13_for_gpu.py`` compiles the kernels for sm_90 without a GPU.
* The engine: unquantized, transformers' greedy tokens exactly; quantized, logits within stated tolerances of the
  unquantized engine on a test model (teacher-forced, ``accuracy.py``); through the Triton kernels (interpreter)
  the same logits as through the torch reference path; bad combinations refused with one line.

Tolerances on the test model (2 layers, hidden 128, every matrix std 0.3, untied, 6 prompts x 12 positions):
measured 0.027 / 0.46 / 0.06 relative RMS error for int8 / int4 / FP8 K/V, bounded at about twice that
(``TOLERANCES``, with the KL divergence and the top-1 agreement).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from conftest import (INIT_STD, GREEDY_MAX_TOKENS, mixed_length_prompts, random_prompts,  # noqa: E402
                      randomize_norm_weights)
from kernel_signatures import TritonLaunches  # noqa: E402
from milestones.m08_triton_kernel.device_kernel import device_kernel, runs_interpreted  # noqa: E402
from milestones.m01_naive_loop import SamplingParams  # noqa: E402
from milestones.m08_triton_kernel.paged_decode_kernel import (_fp8_words_to_fp16, paged_decode_attention,  # noqa: E402
                                                              paged_decode_attention_reference)
from milestones.m08_triton_kernel.store_kv_kernel import store_kv  # noqa: E402
from milestones.m13_quantization import EngineConfig, LLMEngine  # noqa: E402
from milestones.m13_quantization import engine as engine_module  # noqa: E402
from milestones.m13_quantization.accuracy import compare_logits, forced_logits, logit_error  # noqa: E402
from milestones.m13_quantization import epilogue_layers  # noqa: E402
from milestones.m13_quantization.epilogue_layers import EpilogueQwen3Model  # noqa: E402
from milestones.m13_quantization.fp8_kv_cache import FP8_DTYPE, FP8PagedKVCache, from_fp8, to_fp8  # noqa: E402
from milestones.m13_quantization.launch_config import (CANDIDATES, LAUNCH_TABLE, QuantMatmulConfig,  # noqa: E402
                                                       choose_launch, choose_split_k, regime, swap_ab_rows)
from milestones.m13_quantization.dequant_matmul import quantized_matmul_reference  # noqa: E402
from milestones.m13_quantization.epilogue_matmuls import quantized_add_rms_norm, quantized_silu_and_mul  # noqa: E402
from milestones.m13_quantization.matmul_kernels import quantized_matmul  # noqa: E402
from milestones.m13_quantization.quantize import (GROUP_SIZE, QuantizedLinear, bytes_per_weight,  # noqa: E402
                                                  dequantize_weight, group_major, pack_int4, quantize_weight,
                                                  tile_int4, unpack_int4, untile_int4)

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
cuda_only = pytest.mark.skipif(not CUDA, reason="needs CUDA (compiled kernels at Qwen3-8B's shapes)")
TOLERANCES = {"int8": dict(rel_rms=0.06, kl_mean=0.02, top1=0.8),  # measured 0.027, 0.0041, 0.92
              "int4": dict(rel_rms=0.8, kl_mean=2.5, top1=0.25),  # measured 0.46, 1.09, 0.44
              "fp8": dict(rel_rms=0.12, kl_mean=0.05, top1=0.7)}  # measured 0.060, 0.018, 0.83
ACTIVATION_TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}  # max |kernel - reference| / max |reference|


# --------------------------------------------------------------------------- the formats


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_quantize_round_trip_is_within_half_a_step(method):
    weight = torch.randn(24, 384, generator=torch.Generator().manual_seed(0)) * 0.05
    weight[3, 7] = 0.9  # an outlier: int8 spends row 3's scale on it, int4 only that group's
    qweight, scales = quantize_weight(weight, method)
    error = (dequantize_weight(qweight, scales, method) - weight).abs()
    step = scales[:, None] if method == "int8" else scales.repeat_interleave(GROUP_SIZE, dim=1)
    assert (error <= step / 2 + 1e-7).all()
    assert error.max() > 0  # it did round
    if method == "int8":
        assert qweight.dtype == torch.int8 and qweight.shape == (24, 384) and qweight.abs().max() == 127
    else:
        assert qweight.dtype == torch.uint8 and qweight.shape == (24, 192) and scales.shape == (24, 3)


def test_int4_packs_element_j_low_and_j_plus_64_high_in_each_group():
    nibbles = torch.randint(0, 16, (5, 256), generator=torch.Generator().manual_seed(1), dtype=torch.uint8)
    packed = pack_int4(nibbles)
    assert packed.shape == (5, 128)
    for group in range(2):
        for j in (0, 17, 63):
            byte = packed[:, 64 * group + j]
            assert torch.equal(byte & 0xF, nibbles[:, 128 * group + j])
            assert torch.equal(byte >> 4, nibbles[:, 128 * group + 64 + j])
    assert torch.equal(unpack_int4(packed), nibbles)


def test_int4_tiles_put_a_group_of_16_rows_in_one_contiguous_kib():
    packed = torch.randint(0, 256, (48, 192), generator=torch.Generator().manual_seed(2), dtype=torch.uint8)
    tiles = tile_int4(packed)
    assert tiles.shape == (3, 3, 16, 64) and tiles.is_contiguous()
    for tile, group in ((0, 0), (2, 1), (1, 2)):
        assert torch.equal(tiles[tile, group], packed[16 * tile:16 * tile + 16, 64 * group:64 * group + 64])
    assert torch.equal(untile_int4(tiles), packed) and untile_int4(packed) is packed
    with pytest.raises(ValueError, match="N = 40 is not a multiple of 16"):
        tile_int4(packed[:40])


def test_bytes_per_weight_is_the_format_arithmetic():
    assert bytes_per_weight(None, torch.bfloat16) == 2 and bytes_per_weight(None, torch.float32) == 4
    assert bytes_per_weight("int8") == 1
    assert bytes_per_weight("int4") == 0.5 + 4 / 128  # a float32 scale per 128 weights


@pytest.mark.parametrize("out_features", [40, 48], ids=["rows", "tiles"])
def test_quantized_linear_module_matches_its_dequantized_weight(out_features):
    """int4 is stored in tiles where N is a multiple of 16 (48), in packed rows otherwise (40)."""
    linear = torch.nn.Linear(256, out_features, bias=True)
    for method in ("int8", "int4"):
        module = QuantizedLinear.from_linear(linear, method)
        tiled = method == "int4" and out_features % 16 == 0
        assert module.qweight.dim() == (4 if tiled else 2) and module.out_features == out_features
        if method == "int4":  # scales group by group, as the kernels read them (quantize.group_major)
            assert module.scales.t().is_contiguous()
        x = torch.randn(3, 7, 256)
        expected = x @ dequantize_weight(module.qweight, module.scales, method).T + linear.bias
        assert torch.allclose(module(x), expected, atol=1e-5)
        assert module.weight_bytes == module.qweight.numel() * module.qweight.element_size() + 4 * module.scales.numel()


# --------------------------------------------------------------------------- launch configuration


def test_regimes_and_split_k_for_qwen3_8b_shapes():
    assert [regime(m, "int8") for m in (1, 2, 3, 16, 17, 512, 513)] == ["gemv", "gemv", "small", "small", "large",
                                                                        "large", "prefill"]
    assert [regime(m, "int4") for m in (1, 4, 5, 16, 17)] == ["gemv", "gemv", "small", "small", "large"]
    assert choose_launch("int4", 5, 4096, 4096, 132)[0] == LAUNCH_TABLE["int4"]["small"]
    dp4a = LAUNCH_TABLE["int4"]["gemv"]
    assert (dp4a.unpack, dp4a.num_warps, dp4a.block_n, dp4a.min_programs_per_sm) == ("dp4a", 2, 64, 2)
    chosen = {}
    for n, k in ((6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288), (151936, 4096)):
        config, split = choose_launch("int4", 1, n, k, 132)
        assert config == dp4a and choose_launch("int4", 4, n, k, 132)[0] == dp4a
        chosen[n, k] = split
    # 2 programs of 64 rows per SM: q/k/v (96 programs) in 3 slices of K, rounded up to 4 equal ones (16 steps);
    # o_proj (64 programs) in 5, rounded up to 8; down_proj (64 programs, 48 steps) in 5, rounded up to 6
    assert chosen == {(6144, 4096): 4, (4096, 4096): 8, (24576, 4096): 1, (4096, 12288): 6, (151936, 4096): 1}
    assert choose_launch("int4", 1, 1024, 2048, 132)[1] == 8  # Qwen3-0.6B's o_proj: 16 programs, K in 8 slices
    words = replace(dp4a, block_n=32, min_programs_per_sm=1)
    assert choose_split_k(1, 512, 8192, 132, words) == 16  # 16 programs: 9 slices wanted, 16 divide 32 steps
    assert choose_split_k(1, 256, 8192, 132, words) == 16  # 8 programs: K cut in 16 (the most)
    assert choose_split_k(1, 256, 1024, 132, words) == 4  # ...but never into slices shorter than block_k
    assert choose_split_k(1, 256, 256, 132, words) == 1
    assert choose_split_k(1, 256, 256 * 13, 132, words) == 13  # 8 programs want 17 slices: 13 steps allow 13
    assert choose_split_k(1, 256, 256 * 17, 132, words) == 16  # 17 steps (prime): 16 slices, unequal
    config, split = choose_launch("int8", 1024, 4096, 4096, 132)
    assert config.kernel == "dequant" and config == LAUNCH_TABLE["int8"]["prefill"] and split == 1
    # from 17 rows: swap_ab, 64 rows of W a program, K in slices until there are 2 programs an SM
    wide = LAUNCH_TABLE["int4"]["large"]
    assert wide.kernel == "swap_ab" and LAUNCH_TABLE["int8"]["large"] == wide
    assert LAUNCH_TABLE["int4"]["prefill"].kernel == "dequant"
    assert [swap_ab_rows(m, wide) for m in (3, 17, 32, 33, 64, 65, 128, 512)] == [16, 32, 32, 64, 64, 128, 128, 128]
    splits = {(n, k): choose_launch("int4", 64, n, k, 132)[1]
              for n, k in ((6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288), (151936, 4096))}
    # q/k/v: 96 programs want 3 slices of 32 groups, rounded up to 4; o_proj and down_proj: 64 want 5 (8 and 6)
    assert splits == {(6144, 4096): 4, (4096, 4096): 8, (24576, 4096): 1, (4096, 12288): 6, (151936, 4096): 1}
    assert choose_launch("int4", 256, 4096, 4096, 132)[1] == 4  # 2 x 64 programs want 3 slices: 4 divide 32


def test_launch_config_validation():
    with pytest.raises(ValueError, match="power of two"):
        QuantMatmulConfig(block_n=24)
    with pytest.raises(ValueError, match="tl.dot needs"):
        QuantMatmulConfig("dot", block_m=8)
    with pytest.raises(ValueError, match="tl.dot needs"):
        QuantMatmulConfig("swap_ab", block_n=8)
    with pytest.raises(ValueError, match="swap_ab steps through K 128 inputs at a time"):
        QuantMatmulConfig("swap_ab", block_m=64, block_n=64, block_k=256)
    with pytest.raises(ValueError, match="kernel must be"):
        QuantMatmulConfig("cutlass")
    with pytest.raises(ValueError, match="unpack must be one of convert, magic, subnormal, dp4a, got 'bogus'"):
        QuantMatmulConfig(unpack="bogus")


# --------------------------------------------------------------------------- the matmul kernels


def matmul_case(method: str, m: int, n: int, k: int, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    qweight, scales = quantize_weight(torch.randn(n, k, generator=gen) * 0.05, method)
    x = torch.randn(m, k, generator=gen).to(dtype)
    return x.to(DEVICE), qweight.to(DEVICE), scales.to(DEVICE)


def assert_close_to_reference(out: torch.Tensor, x, qweight, scales, method):
    reference = quantized_matmul_reference(x, qweight, scales, method).float()
    assert out.shape == reference.shape and out.dtype == x.dtype
    error = (out.float() - reference).abs().max() / reference.abs().max()
    assert error <= ACTIVATION_TOLERANCE[x.dtype], f"relative error {error:.2e}"


KERNEL_CASES = [  # (configuration, rows of x): every kernel, every way of unpacking, tails of M, N and K
    (LAUNCH_TABLE["int4"]["gemv"], 1), (LAUNCH_TABLE["int8"]["gemv"], 3),
    (CANDIDATES["gemv"]["n16-k256-w4-s4 convert"], 2), (CANDIDATES["gemv"]["n16-k256-w4-s4 magic"], 1),
    (LAUNCH_TABLE["int8"]["small"], 5),
    (LAUNCH_TABLE["int4"]["large"], 37), (LAUNCH_TABLE["int4"]["large"], 70),
    (CANDIDATES["large"]["dequant + cuBLAS"], 9), (LAUNCH_TABLE["int4"]["gemv"], 4),
    (CANDIDATES["gemv"]["n16-k256-w4-s3 sum per step"], 6),  # 6: 4 + 2 rows
    (CANDIDATES["gemv"]["n32-k256-w1-s3 subnormal"], 2),  # the table's gemv is dp4a (float32 x: subnormal)
]


@pytest.mark.parametrize("method", ["int8", "int4"])
@pytest.mark.parametrize("config, m", KERNEL_CASES, ids=[f"{c.kernel}-m{m}" for c, m in KERNEL_CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("n, k", [(40, 384), (32, 512)], ids=["tails", "whole-tiles"])
def test_quantized_matmul_matches_the_reference(method, config, m, dtype, n, k):
    """(40, 384): N and K (3 groups) leave partial tiles, masked; (32, 512): whole tiles, no masks (``EVEN``)."""
    x, qweight, scales = matmul_case(method, m, n, k, dtype)
    out = quantized_matmul(x, qweight, scales, method, config=config)
    assert_close_to_reference(out, x, qweight, scales, method)
    if method == "int4":  # packed rows with the scales group by group (QuantizedLinear's where N % 16): the same sums
        assert torch.equal(quantized_matmul(x, qweight, group_major(scales), method, config=config), out)


@pytest.mark.parametrize("method, n, k", [("int8", 72, 200), ("int4", 80, 640)], ids=["int8-k-tail", "int4"])
def test_swap_ab_slices_row_blocks_and_empty_shapes(method, n, k):
    """swap_ab past one block of x's rows (200: 128 + a partial 72), N past whole programs of 64 rows, int8's K
    past whole 128-input steps, every count of slices of K (the last ones empty where the count does not divide
    the steps); empty products without a launch, and a count of slices out of range refused in one line."""
    config = LAUNCH_TABLE[method]["large"]
    x, qweight, scales = matmul_case(method, 200, n, k, torch.float32, seed=7)
    steps = -(-k // 128)
    for split_k in range(1, steps + 1):
        assert_close_to_reference(quantized_matmul(x, qweight, scales, method, config=config, split_k=split_k), x,
                                  qweight, scales, method)
    assert quantized_matmul(x[:0], qweight, scales, method, config=config).shape == (0, n)
    empty_w, empty_s = (qweight[:0], scales[:0])
    assert quantized_matmul(x, empty_w, empty_s, method, config=config).shape == (200, 0)
    with pytest.raises(ValueError, match=rf"split_k must be an int in \[1, {steps}\]"):
        quantized_matmul(x, qweight, scales, method, config=config, split_k=steps + 1)
    with pytest.raises(ValueError, match="split_k must be an int"):
        quantized_matmul(x, qweight, scales, method, config=config, split_k=2.0)


TILED_CASES = [(LAUNCH_TABLE["int4"]["gemv"], 1), (LAUNCH_TABLE["int4"]["gemv"], 3),
               (CANDIDATES["gemv"]["n16-k256-w4-s4 magic"], 2), (LAUNCH_TABLE["int4"]["small"], 5),
               (LAUNCH_TABLE["int4"]["large"], 37), (CANDIDATES["large"]["dequant + cuBLAS"], 9),
               (CANDIDATES["large"]["swap_ab n128-m128-w8-s3"], 70), (LAUNCH_TABLE["int4"]["large"], 20)]


@pytest.mark.parametrize("config, m", TILED_CASES, ids=[f"{c.kernel}-n{c.block_n}-m{m}" for c, m in TILED_CASES])
@pytest.mark.parametrize("n, k", [(48, 384), (32, 512)], ids=["tails", "whole-tiles"])
def test_every_int4_kernel_reads_tiles_as_it_reads_rows(config, m, n, k):
    """The same product from ``tile_int4``'s layout: 48 rows leave a partial 32-row block (masked rows of a tile),
    384 inputs a partial 256-input step; split-K slices the tiles' groups."""
    x, qweight, scales = matmul_case("int4", m, n, k, torch.float32, seed=4)
    tiles = tile_int4(qweight)
    for split_k in ((None, 2) if config.kernel in ("gemv", "swap_ab") else (None,)):
        out = quantized_matmul(x, tiles, scales, "int4", config=config, split_k=split_k)
        assert_close_to_reference(out, x, qweight, scales, "int4")
        rows = quantized_matmul(x, qweight, scales, "int4", config=config, split_k=split_k)
        assert torch.allclose(out, rows, rtol=1e-5, atol=1e-6 * rows.abs().max().item())
        # the engine's scales, stored group by group: the same values at other addresses, the same sums
        by_group = quantized_matmul(x, tiles, group_major(scales), "int4", config=config, split_k=split_k)
        assert torch.equal(by_group, out)


@pytest.mark.parametrize("unpack", ["subnormal", "magic"])
def test_int4_gemv_keeps_its_precision_over_the_activations_range(unpack):
    """``subnormal`` reads each nibble's bits as a float (``u * 2^-149``) and scales x up by 2^64: products of
    activations from 1e-12 to 1e12 (and exact zeros) must stay as accurate as the conversion's."""
    gen = torch.Generator().manual_seed(5)
    qweight, scales = quantize_weight(torch.randn(24, 512, generator=gen) * 0.05, "int4")
    magnitude = 10.0 ** torch.randint(-12, 13, (2, 512), generator=gen).float()
    x = torch.randn(2, 512, generator=gen) * magnitude * (torch.rand(2, 512, generator=gen) > 0.1)
    config = replace(LAUNCH_TABLE["int4"]["gemv"], unpack=unpack)
    out = quantized_matmul(x.to(DEVICE), qweight.to(DEVICE), scales.to(DEVICE), "int4", config=config)
    reference = quantized_matmul_reference(x, qweight, scales, "int4").to(torch.float64)
    assert torch.allclose(out.cpu().double(), reference, rtol=1e-5, atol=1e-5 * reference.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 2, 4])
@pytest.mark.parametrize("method", ["int8", "int4"])
def test_split_k_adds_the_slices(method, rows, dtype):
    """The program that finishes a row block's last slice adds every slice and stores the output in x's dtype;
    it leaves its counter at zero for the next launch, and the sum does not depend on which program finishes."""
    from milestones.m13_quantization import matmul_kernels

    x, qweight, scales = matmul_case(method, rows, 24, 768, dtype, seed=3)
    config = LAUNCH_TABLE[method]["gemv"]
    out = quantized_matmul(x, qweight, scales, method, config=config, split_k=3)
    assert out.dtype == dtype
    assert_close_to_reference(out, x, qweight, scales, method)
    counters = matmul_kernels._split_counters(x.device, 24)
    assert not counters.any(), "a finishing program left its counter set"
    again = quantized_matmul(x, qweight, scales, method, config=config, split_k=3)
    assert torch.equal(again, out)


EPILOGUE_CASES = [(LAUNCH_TABLE["int4"]["gemv"], "int4"), (LAUNCH_TABLE["int8"]["gemv"], "int8"),
                  (CANDIDATES["gemv"]["n16-k256-w4-s4 magic"], "int4")]


@pytest.mark.parametrize("config, method", EPILOGUE_CASES,
                         ids=[f"{m}-n{c.block_n}-{c.unpack}" for c, m in EPILOGUE_CASES])
@pytest.mark.parametrize("rows", [1, 2, 4])
@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("n, dtype", [(76, torch.float32), (96, torch.bfloat16)], ids=["tails-fp32", "whole-bf16"])
def test_gemv_epilogues_finish_what_m12s_kernels_would(config, method, rows, split_k, dtype, n, monkeypatch):
    """The GEMV's finishing programs do the next kernel's work: SiLU * up and the residual's addition to the bit
    in bf16 (gate, up and the product rounded as stored), the norm up to the order of its sum of squares; every counter is
    back at zero afterwards, and a second launch gives the same bits. 76 rows leave a partial block in every
    configuration, its SiLU pairs too; at 96, int4 is in tiles (the engine's layout) and the norm's last program
    reads its row in slices (as it does past 4,096 values)."""
    from milestones.m12_async_scheduling.fused_kernels import add_rms_norm, silu_and_mul
    from milestones.m13_quantization import gemv_epilogues, matmul_kernels

    x, qweight, scales = matmul_case(method, rows, n, 768, dtype, seed=5)
    if n == 96:
        monkeypatch.setattr(gemv_epilogues, "NORM_MAX_N", 32)
        if method == "int4":
            qweight, scales = tile_int4(qweight), group_major(scales)
    launch = dict(config=config, split_k=split_k)
    product = quantized_matmul(x, qweight, scales, method, **launch)
    act = quantized_silu_and_mul(x, qweight, scales, method, **launch)
    assert act.shape == (rows, n // 2)
    # compiled for a GPU in float32, the epilogue may contract the GEMV's last product into a fused multiply-add
    # with what follows (int8's row scale and the residual, say); in bf16 each value is rounded first: the same bits
    same = (lambda a, b: torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)) if CUDA and dtype == torch.float32 \
        else (lambda a, b: torch.testing.assert_close(a, b, rtol=0, atol=0))
    same(act, silu_and_mul(product))
    gen = torch.Generator().manual_seed(6)
    residual = torch.randn(rows, n, generator=gen).to(dtype).to(DEVICE)
    weight = (1 + torch.randn(n, generator=gen) / 4).to(dtype).to(DEVICE)
    expected_residual = residual.clone()
    expected = add_rms_norm(product, expected_residual, weight, 1e-6)
    fused_residual = residual.clone()
    normed = quantized_add_rms_norm(x, qweight, scales, method, fused_residual, weight, 1e-6, **launch)
    same(fused_residual, expected_residual)
    # atol: where the residual stream nearly cancels, a last-bit difference in it is a large relative one
    tolerance = ACTIVATION_TOLERANCE[dtype] / 4
    torch.testing.assert_close(normed, expected, rtol=tolerance, atol=tolerance)
    assert not matmul_kernels._split_counters(x.device, 64).any(), "a finishing program left a counter set"
    again_residual = residual.clone()
    assert torch.equal(quantized_add_rms_norm(x, qweight, scales, method, again_residual, weight, 1e-6, **launch),
                       normed)


def test_gemv_epilogues_fall_back_to_m12s_kernels_past_the_gemvs_rows():
    """At the tensor cores' rows the same calls run the matmul, then m12's kernel."""
    from milestones.m12_async_scheduling.fused_kernels import add_rms_norm, silu_and_mul

    x, qweight, scales = matmul_case("int4", 5, 64, 256, torch.float32, seed=8)
    product = quantized_matmul(x, qweight, scales, "int4")
    assert torch.equal(quantized_silu_and_mul(x, qweight, scales, "int4"), silu_and_mul(product))
    residual, weight = torch.ones(5, 64, device=DEVICE), torch.full((64,), 0.5, device=DEVICE)
    expected_residual = residual.clone()
    expected = add_rms_norm(product, expected_residual, weight, 1e-6)
    assert torch.equal(quantized_add_rms_norm(x, qweight, scales, "int4", residual, weight, 1e-6), expected)
    assert torch.equal(residual, expected_residual)


def test_gemv_epilogues_refuse_bad_operands_in_one_line():
    x, qweight, scales = matmul_case("int8", 1, 24, 256, torch.float32)
    with pytest.raises(ValueError, match="gate and up rows in equal numbers, got N = 23"):
        quantized_silu_and_mul(x, qweight[:23], scales[:23], "int8")
    weight = torch.ones(24, device=DEVICE)
    for residual in (torch.zeros(1, 12, device=DEVICE), torch.zeros(1, 24, device=DEVICE, dtype=torch.bfloat16),
                     torch.zeros(1, 48, device=DEVICE)[:, ::2]):
        with pytest.raises(ValueError, match=r"add_rms_norm needs the residual as \[M, N\] = \[1, 24\]"):
            quantized_add_rms_norm(x, qweight, scales, "int8", residual, weight, 1e-6)
    with pytest.raises(ValueError, match="a contiguous norm weight"):
        quantized_add_rms_norm(x, qweight, scales, "int8", torch.zeros(1, 24, device=DEVICE), weight[:12], 1e-6)


@cuda_only
@pytest.mark.filterwarnings("ignore:The CUDA Graph is empty")  # the refused capture's
def test_split_gemvs_replay_from_a_graph_beside_another_graphs_temporaries(monkeypatch):
    """An engine captures its batch sizes into graphs that share one memory pool. A graph captured first frees
    temporaries in that pool; the split counters must not be among them (they are allocated by the eager warm-up,
    outside any capture), or replaying the first graph would write into them and leave the second's output
    unwritten. Capturing a split GEMV with no counters yet is refused in one line."""
    from milestones.m13_quantization import matmul_kernels

    x, qweight, scales = matmul_case("int4", 1, 256, 4096, torch.bfloat16, seed=7)
    config = LAUNCH_TABLE["int4"]["gemv"]
    assert choose_split_k(1, 256, 4096, torch.cuda.get_device_properties(0).multi_processor_count, config) > 1
    expected = quantized_matmul(x, qweight, scales, "int4")  # the warm-up: compiles, allocates the counters
    first, second = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(first):
        ones = torch.ones(matmul_kernels.MIN_COUNTERS, dtype=torch.int32, device=DEVICE)  # freed in the pool
        total = ones.sum()
    with torch.cuda.graph(second, pool=first.pool()):
        out = quantized_matmul(x, qweight, scales, "int4")
    for _ in range(3):
        first.replay()
        second.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, expected) and total.item() == matmul_kernels.MIN_COUNTERS
    monkeypatch.setattr(matmul_kernels, "_COUNTERS", {})
    with pytest.raises(RuntimeError, match="before a CUDA graph is captured"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            quantized_matmul(x, qweight, scales, "int4")


def test_the_wrapper_refuses_bad_shapes_in_one_line():
    x, qweight, scales = matmul_case("int8", 2, 16, 256, torch.float32)
    with pytest.raises(ValueError, match="int4 needs K .* multiple of its group size 128"):
        quantized_matmul(torch.zeros(2, 200, device=DEVICE), qweight, scales, "int4")
    with pytest.raises(ValueError, match="int8 qweight for x"):
        quantized_matmul(x, qweight[:, :128], scales, "int8")
    with pytest.raises(ValueError, match="unknown quantization method 'int2'"):
        quantized_matmul(x, qweight, scales, "int2")
    x, qweight, scales = matmul_case("int4", 1, 32, 256, torch.float32)
    tiles = tile_int4(qweight)
    with pytest.raises(ValueError, match=r"int4 qweight for x \(1, 256\) must be torch.uint8 \(2, 2, 16, 64\)"):
        quantized_matmul(x, tiles[:, :1].contiguous(), scales, "int4")
    with pytest.raises(ValueError, match="int4 tiles: contiguous"):
        quantized_matmul(x, tiles.transpose(0, 1), scales, "int4")
    strided = torch.zeros(64, 4, device=DEVICE)[::2, ::2]  # scales contiguous along neither dimension
    with pytest.raises(ValueError, match="scales along one of theirs"):
        quantized_matmul(x, tiles, strided, "int4")
    with pytest.raises(ValueError, match=r"split_k must be an int in \[1, 2\] \(K's loop steps of 128 inputs"):
        quantized_matmul(x, tiles, scales, "int4", config=LAUNCH_TABLE["int4"]["large"], split_k=3)


@cuda_only
@pytest.mark.parametrize("method", ["int8", "int4"])
@pytest.mark.parametrize("m", [1, 4, 16, 64, 256])
@pytest.mark.parametrize("n, k", [(6144, 4096), (4096, 12288)])
def test_qwen3_8b_layer_shapes_on_cuda(method, m, n, k):
    x, qweight, scales = matmul_case(method, m, n, k, torch.bfloat16)
    assert_close_to_reference(quantized_matmul(x, qweight, scales, method), x, qweight, scales, method)
    if method == "int4":  # the engine's layout
        assert_close_to_reference(quantized_matmul(x, tile_int4(qweight), scales, method), x, qweight, scales, method)


@cuda_only
@pytest.mark.parametrize("method", ["int8", "int4"])
def test_every_candidate_on_cuda(method):
    from milestones.m13_quantization.launch_config import fits_method

    for configs in CANDIDATES.values():
        for config in configs.values():
            if fits_method(config, method):
                x, qweight, scales = matmul_case(method, 16, 4096, 4096, torch.bfloat16)
                assert_close_to_reference(quantized_matmul(x, qweight, scales, method, config=config), x, qweight,
                                          scales, method)


# --------------------------------------------------------------------------- the FP8 K/V kernels


def test_store_kernel_quantizes_as_torch_does():
    """Rounding to nearest (7.94 -> 8, a carry into the next power of two), saturation at 448, subnormals."""
    gen = torch.Generator().manual_seed(4)
    k = torch.randn(40, 2, 16, generator=gen) * 10
    v = torch.randn(40, 2, 16, generator=gen) * 0.01
    k[0, 0, :5] = torch.tensor([500.0, -1000.0, 7.94, 0.003, -0.0007])
    cache_k = torch.zeros(4, 16, 2, 16, dtype=FP8_DTYPE, device=DEVICE)
    cache_v = torch.zeros_like(cache_k)
    slots = torch.randperm(64, generator=gen)[:40]
    k_scale, v_scale = torch.tensor([0.5]), torch.tensor([0.01])
    store_kv(k.to(DEVICE), v.to(DEVICE), cache_k, cache_v, slots.to(DEVICE), k_scale=k_scale.to(DEVICE),
             v_scale=v_scale.to(DEVICE))
    for cache, x, scale in ((cache_k, k, k_scale), (cache_v, v, v_scale)):
        stored = cache.view(-1, 2, 16)[slots.to(DEVICE)].cpu()
        assert torch.equal(stored.view(torch.uint8), to_fp8(x, scale).view(torch.uint8))


@device_kernel
@triton.jit
def _widen_words_kernel(words_ptr, even_ptr, odd_ptr, n, PTX: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    even, odd = _fp8_words_to_fp16(tl.load(words_ptr + i, mask=i < n, other=0), PTX)
    tl.store(even_ptr + i, even, mask=i < n)
    tl.store(odd_ptr + i, odd, mask=i < n)


def test_fp8_words_widen_exactly_to_fp16():
    """Every int16 word of two finite e4m3 bytes (254 x 254: the cache never holds NaN), bit for bit as torch
    converts each byte, the low byte to ``even`` (little-endian: dim 2j) and the high byte to ``odd``. Compiled
    (CUDA), the decode kernel's PTX; interpreted, its plain Triton twin."""
    finite = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.int32)
    low, high = finite.repeat(len(finite)), finite.repeat_interleave(len(finite))
    words = ((high << 8) | low).to(torch.int16).to(DEVICE)
    even, odd = torch.empty(len(words), dtype=torch.float16, device=DEVICE), torch.empty_like(words, dtype=torch.float16)
    _widen_words_kernel[(triton.cdiv(len(words), 1024),)](words, even, odd, len(words),
                                                          PTX=not runs_interpreted(DEVICE), BLOCK=1024)
    for got, byte in ((even, low), (odd, high)):
        expected = byte.to(torch.uint8).view(FP8_DTYPE).to(torch.float16)
        assert torch.equal(got.cpu().view(torch.int16), expected.view(torch.int16))  # -0.0 and subnormals too


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("head_dim", [16, 64], ids=["bytes", "words"])  # words from head_dim 32 (a dot's K >= 16)
def test_decode_kernel_reads_an_fp8_cache_with_its_scales(num_splits, dtype, head_dim):
    """Interpreted, bf16 queries take float32 dots (device_kernel.py); fp16 queries the fp16 dots a GPU runs."""
    gen = torch.Generator().manual_seed(5)
    cache_k = (torch.randn(8, 16, 2, head_dim, generator=gen) * 3).to(FP8_DTYPE).to(DEVICE)
    cache_v = torch.randn(8, 16, 2, head_dim, generator=gen).to(FP8_DTYPE).to(DEVICE)
    tables = torch.randperm(8, generator=gen)[:6].view(3, 2).to(torch.int32).to(DEVICE)
    lens = torch.tensor([5, 20, 32], device=DEVICE)
    q = torch.randn(3, 4, head_dim, generator=gen).to(DEVICE, dtype)
    k_scale, v_scale = torch.tensor([0.5], device=DEVICE), torch.tensor([2.0], device=DEVICE)
    out = paged_decode_attention(q, cache_k, cache_v, tables, lens, 0.25, num_splits=num_splits, k_scale=k_scale,
                                 v_scale=v_scale)
    reference = paged_decode_attention_reference(q, cache_k, cache_v, tables, lens, 0.25, k_scale, v_scale)
    # float32: the dots' error; 16-bit: one rounding of the output apart at most (bf16: 2^-8 of a value) plus the dots'
    tolerance = dict(atol=2e-5, rtol=0) if dtype == torch.float32 else dict(atol=3e-2, rtol=2**-8)
    torch.testing.assert_close(out.float(), reference.float(), **tolerance)


def test_an_fp8_cache_is_decoded_with_its_own_launch_table(monkeypatch):
    """Half the bytes a key, the same work an iteration: an FP8 cache takes FP8_LAUNCH_TABLE (more keys an
    iteration), a bf16 one LAUNCH_TABLE, whether the heuristic or the caller picks the split count."""
    from milestones.m08_triton_kernel import paged_decode_kernel
    from milestones.m08_triton_kernel.launch_config import FP8_LAUNCH_TABLE, LAUNCH_TABLE

    assert FP8_LAUNCH_TABLE["direct"].tile_tokens > LAUNCH_TABLE["direct"].tile_tokens
    tables_seen = []
    real_choose = paged_decode_kernel.choose_launch
    monkeypatch.setattr(paged_decode_kernel, "choose_launch",
                        lambda *args: tables_seen.append(args[-1]) or real_choose(*args))
    tiles = []
    real_kernel = paged_decode_kernel._paged_decode_kernel
    monkeypatch.setattr(paged_decode_kernel, "_paged_decode_kernel", type("Spy", (), {
        "__getitem__": lambda self, grid: lambda *a, **k: tiles.append(k["TILE"]) or real_kernel[grid](*a, **k)})())
    gen = torch.Generator().manual_seed(6)
    q = torch.randn(2, 4, 16, generator=gen).to(DEVICE)
    tables, lens = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device=DEVICE), torch.tensor([20, 9], device=DEVICE)
    for cache, scales in ((torch.randn(4, 16, 2, 16, generator=gen).to(DEVICE), {}),
                          (torch.randn(4, 16, 2, 16, generator=gen).to(FP8_DTYPE).to(DEVICE),
                           dict(k_scale=torch.ones(1, device=DEVICE), v_scale=torch.ones(1, device=DEVICE)))):
        paged_decode_attention(q, cache, cache, tables, lens, 0.25, **scales)
        paged_decode_attention(q, cache, cache, tables, lens, 0.25, num_splits=1, **scales)
    assert tables_seen == [LAUNCH_TABLE, FP8_LAUNCH_TABLE]
    assert tiles == [LAUNCH_TABLE["direct"].tile_tokens] * 2 + [FP8_LAUNCH_TABLE["direct"].tile_tokens] * 2


def test_fp8_kernels_refuse_a_cache_without_its_scales():
    cache = torch.zeros(2, 16, 2, 16, dtype=FP8_DTYPE, device=DEVICE)
    q = torch.zeros(1, 4, 16, device=DEVICE)
    tables, lens = torch.zeros(1, 1, dtype=torch.int32, device=DEVICE), torch.ones(1, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="k_scale and v_scale go with a float8_e4m3fn cache"):
        paged_decode_attention(q, cache, cache, tables, lens, 0.25)
    with pytest.raises(ValueError, match="k_scale and v_scale go with a float8_e4m3fn cache"):
        store_kv(q[:, :2], q[:, :2], cache, cache, torch.zeros(1, dtype=torch.long, device=DEVICE))
    plain = torch.zeros(2, 16, 2, 16, device=DEVICE)
    with pytest.raises(ValueError, match="k_scale and v_scale go with a float8_e4m3fn cache"):
        paged_decode_attention(q, plain, plain, tables, lens, 0.25, k_scale=torch.ones(1), v_scale=torch.ones(1))


def test_fp8_cache_writes_and_gathers_through_its_scales():
    cache = FP8PagedKVCache(2, 4, 8, 2, 16, torch.float32, torch.device("cpu"))
    cache.k_scale[1], cache.v_scale[1] = 0.25, 4.0
    k, v = torch.randn(5, 2, 16), torch.randn(5, 2, 16) * 30
    slots = torch.tensor([3, 9, 0, 31, 17])
    cache.write(1, slots, k, v)
    got_k, got_v = cache.gather(1, slots)
    assert torch.equal(got_k, from_fp8(to_fp8(k, cache.k_scales[1]), cache.k_scales[1], torch.float32))
    assert torch.equal(got_v, from_fp8(to_fp8(v, cache.v_scales[1]), cache.v_scales[1], torch.float32))
    assert (got_k - k).abs().max() <= k.abs().max() / 16 + 2**-9 * 0.25  # 3 mantissa bits: 1/16 relative
    assert cache.kernel_scales(1)["k_scale"].item() == 0.25 and cache.k.dtype == FP8_DTYPE


# --------------------------------------------------------------------------- the engine


@pytest.fixture(scope="module")
def groupable_checkpoint(tmp_path_factory):
    """conftest's kind of test model (std-0.3 matrices, random norm weights) with hidden 128 (int4 can group it)
    and an untied head (quantized too)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
                         rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=1,
                         eos_token_id=3, pad_token_id=0, initializer_range=INIT_STD)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).eval()
    randomize_norm_weights(model, 0)
    directory = tmp_path_factory.mktemp("groupable")
    model.save_pretrained(directory)
    return directory


def make_engine(checkpoint, **knobs) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(checkpoint), **{"device": "cpu", "kv_cache_tokens": 2048, **knobs}))


def accuracy_prompts() -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(4, 512) for _ in range(rng.randint(3, 20))] for _ in range(6)]


def test_unquantized_path_gives_transformers_tokens(tiny_checkpoint, engine_factory, hf_reference):
    engine = engine_factory("m13_quantization", tiny_checkpoint[0], max_num_seqs=4, kv_cache_tokens=2048)
    outputs = engine.generate(mixed_length_prompts(), SamplingParams(max_tokens=GREEDY_MAX_TOKENS, ignore_eos=True),
                              use_tqdm=False)
    assert [o.token_ids for o in outputs] == hf_reference
    assert not any(isinstance(m, QuantizedLinear) for m in engine.model.modules())


def test_quantized_logits_are_within_the_stated_tolerances(groupable_checkpoint, tokenizer_cache):
    reference = make_engine(groupable_checkpoint)
    engines = {"int8": make_engine(groupable_checkpoint, quantization="int8"),
               "int4": make_engine(groupable_checkpoint, quantization="int4"),
               "fp8": make_engine(groupable_checkpoint, kv_cache_dtype="fp8")}
    errors = compare_logits(reference, engines, accuracy_prompts(), 12)
    for mode, error in errors.items():
        bound = TOLERANCES[mode]
        assert error.positions == sum(12 for _ in accuracy_prompts())
        assert 1e-4 < error.rel_rms < bound["rel_rms"], (mode, error)  # above 0: the mode really is lossy
        assert error.kl_mean < bound["kl_mean"] and error.top1_agreement >= bound["top1"], (mode, error)
    assert errors["int8"].rel_rms < errors["int4"].rel_rms  # 255 levels per row against 15 per group
    for mode in ("int8", "int4"):
        linears = [m for m in engines[mode].model.modules() if isinstance(m, QuantizedLinear)]
        assert len(linears) == 2 * 4 + 1 and all(m.method == mode for m in linears)  # 4 per layer + the head
    assert isinstance(engines["fp8"].kv_pool, FP8PagedKVCache)


def test_the_triton_kernels_and_graphs_give_the_torch_paths_logits(groupable_checkpoint, tokenizer_cache,
                                                                   monkeypatch):
    """int4 matmuls and an FP8 cache through the Triton kernels, decode steps through the graph runner (the
    previous milestone's, with its fused layers): the same logits as the torch paths. With CUDA the graphs are
    captured and replayed; on a CPU the kernels run in Triton's interpreter and the runner fills the same static
    buffers without capturing."""
    knobs = dict(quantization="int4", kv_cache_dtype="fp8", max_num_seqs=2, device=str(DEVICE), dtype="float32")
    torch_path = make_engine(groupable_checkpoint, attention_backend="torch", enforce_eager=True, **knobs)
    triton_path = make_engine(groupable_checkpoint, attention_backend="triton", **knobs)
    for engine, kernel in ((torch_path, "torch"), (triton_path, "triton")):
        for module in engine.model.modules():
            if isinstance(module, QuantizedLinear):
                module.kernel = kernel
    if not CUDA:
        triton_path.graph_runner = triton_path.build_graph_runner(capture=False)
    # the decode graphs' GEMVs finish the add + norm and SiLU * up after them (epilogue_layers.py)
    assert type(triton_path.graph_runner.model.model) is EpilogueQwen3Model
    prompts = accuracy_prompts()[:2]  # a prompt step (eager), then decode steps (the graph runner's buffers)
    continuations = [o.token_ids for o in torch_path.generate(prompts, SamplingParams(max_tokens=3, ignore_eos=True),
                                                              use_tqdm=False)]
    folded = []  # rows of x of each add + norm done in a GEMV's finish (epilogue_layers: at one row)
    fold = epilogue_layers.quantized_add_rms_norm
    monkeypatch.setattr(epilogue_layers, "quantized_add_rms_norm",
                        lambda x, *args, **kwargs: folded.append(x.shape[0]) or fold(x, *args, **kwargs))
    for batch in (prompts, prompts[:1]):  # decode steps at 2 rows, then at 1
        forced = continuations[:len(batch)]
        error = logit_error(forced_logits(torch_path, batch, forced), forced_logits(triton_path, batch, forced))
        # float32 sums in another order can move a K/V value across an FP8 rounding boundary (a 1/16 step) now
        # and then: measured 7e-7 to 2.5e-5, against 0.06 for FP8 itself and 0.46 for int4 (the errors this path
        # adds to)
        assert error.rel_rms < 1e-3 and error.top1_agreement == 1.0, (len(batch), error)
    if not CUDA:  # the runner ran the decoder at each step; on CUDA the graphs recorded it before this count began
        assert folded and set(folded) == {1}, folded
    stats = triton_path.stats  # the prompt step ran outside the decode graphs: eagerly, or in pieces (m12)
    assert stats.graph_steps > 0 and stats.eager_steps + getattr(stats, "piecewise_steps", 0) > 0


def test_eager_and_replayed_fp8_steps_launch_every_kernel_with_one_signature(tied_checkpoint, tokenizer_cache,
                                                                             monkeypatch):
    """m12's check on an FP8 cache: the store, decode and prefill kernels now also take each layer's K and V
    scales, one-element views into a ``[num_layers]`` tensor. A pointer's 16-byte alignment is part of a compiled
    kernel's signature, so scales 4 bytes apart would compile every kernel twice (layer 0's scale aligned, layer
    1's not): ``FP8PagedKVCache`` keeps them 16 bytes apart. Every kernel has one signature per variant, launched
    from a decode graph, a mixed step's whole graph or pieces, or eagerly."""
    from milestones.m10_cuda_graphs.graph_runner import CUDAGraphRunner
    from milestones.m12_async_scheduling.full_graphs import FullGraphRunner
    from milestones.m12_async_scheduling.piecewise import PiecewiseGraphRunner

    launches = TritonLaunches(monkeypatch)
    launches.in_graphs(CUDAGraphRunner, "forward")
    launches.in_graphs(PiecewiseGraphRunner, "piece")
    launches.in_graphs(FullGraphRunner, "forward")
    for mode in ("full", "full_decode_only"):  # 3 sequences, graphs for 2 (as m12's test); direct decodes everywhere
        engine = make_engine(tied_checkpoint[0], attention_backend="triton", kv_cache_dtype="fp8", max_num_seqs=3,
                             max_cuda_graph_batch_size=2, block_size=4, max_num_batched_tokens=16,
                             kv_cache_tokens=256, max_model_len=64, cudagraph_mode=mode)
        engine.graph_runner = engine.build_graph_runner(capture=False)
        if mode == "full":
            engine.piecewise = engine.build_piecewise_runner(capture=False)
        for prompt in random_prompts(4, 3, 13, seed=8):  # each arrives while the ones before it decode
            engine.add_request(prompt, SamplingParams(max_tokens=3, ignore_eos=True))
            engine.step()
        while engine.has_unfinished():
            engine.step()
        assert engine.stats.graph_steps > 0 and (engine.stats.piecewise_steps if mode == "full"
                                                 else engine.stats.eager_steps) > 0

    assert not launches.differing()
    assert launches.in_both() >= {"_store_kv_kernel", "_paged_decode_kernel", "_paged_prefill_kernel"}
    assert all(dict(variant)["KV_FP8"] for name in ("_store_kv_kernel", "_paged_decode_kernel")
               for variant in launches.wheres(name))


def test_fp8_cache_holds_more_tokens_in_the_same_memory(groupable_checkpoint, tokenizer_cache):
    knobs = dict(kv_cache_memory_bytes=10 * 2**20)
    plain = LLMEngine(EngineConfig(model=str(groupable_checkpoint), device="cpu", **knobs))
    fp8 = LLMEngine(EngineConfig(model=str(groupable_checkpoint), device="cpu", kv_cache_dtype="fp8", **knobs))
    ratio = plain.kv_bytes_per_token // fp8.kv_bytes_per_token
    assert ratio == 4 and fp8.kv_pool.k.dtype == FP8_DTYPE  # float32 on this CPU: 4 bytes -> 1 (bf16: 2 -> 1)
    assert ratio * plain.kv_pool.num_blocks <= fp8.kv_pool.num_blocks < ratio * (plain.kv_pool.num_blocks + 1)
    assert "float8_e4m3fn" in fp8.describe_kv_cache()


def test_calculate_kv_scales_sets_each_layers_scales_from_the_first_prompt(groupable_checkpoint, tokenizer_cache):
    engine = make_engine(groupable_checkpoint, kv_cache_dtype="fp8", calculate_kv_scales=True)
    assert engine.kv_pool.needs_scales and torch.equal(engine.kv_pool.k_scale, torch.ones(2))
    engine.generate([[5, 6, 7, 8, 9]], SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)
    assert not engine.kv_pool.needs_scales
    assert (engine.kv_pool.k_scale != 1).all() and (engine.kv_pool.v_scale != 1).all()
    assert (engine.kv_pool.k_scale * 200 <= 448).all()  # the first prompt's largest |k| maps to 200, below 448


def test_a_preset_quantized_layer_by_layer_holds_m01s_weights_quantized(tokenizer_cache):
    """The streaming build draws m01's random values: quantizing m01's model gives the same bytes."""
    from milestones.m01_naive_loop.loader import load_model
    from milestones.m13_quantization.quantized_loader import load_preset_quantized, quantize_model_

    streamed = load_preset_quantized("tiny", torch.device("cpu"), torch.float32, 3, "int4", "torch").model
    whole = quantize_model_(load_model("tiny", torch.device("cpu"), torch.float32, seed=3).model, "int4", "torch")
    ours, theirs = dict(streamed.named_buffers()), dict(whole.named_buffers())
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[name], theirs[name]) for name in ours)
    assert all(torch.equal(a, b) for a, b in zip(streamed.parameters(), whole.parameters()))


def test_bad_combinations_are_refused_in_one_line(tied_checkpoint, tokenizer_cache, monkeypatch):
    with pytest.raises(ValueError, match="unknown quantization 'int3'"):
        EngineConfig(quantization="int3")
    with pytest.raises(ValueError, match="unknown kv_cache_dtype 'fp8_e5m2' \\(e5m2 is not supported here\\)"):
        EngineConfig(kv_cache_dtype="fp8_e5m2")
    with pytest.raises(ValueError, match="calculate_kv_scales needs an FP8 K/V cache"):
        EngineConfig(calculate_kv_scales=True)
    with pytest.raises(ValueError, match=r"int4' groups 128 inputs .* has 64 inputs .*use int8") as info:
        make_engine(tied_checkpoint[0], quantization="int4")  # conftest's model: hidden 64
    assert "\n" not in str(info.value)
    monkeypatch.setattr(engine_module, "fp8_unsupported_reason", lambda device, backend: "no float8 on this device")
    with pytest.raises(ValueError, match="kv_cache_dtype='fp8' cannot run here: no float8 on this device") as info:
        make_engine(tied_checkpoint[0], kv_cache_dtype="fp8")
    assert "\n" not in str(info.value)


def test_the_server_serves_a_quantized_engine_with_vllms_flags(groupable_checkpoint, tokenizer_cache):
    """``serve --quantization int8 --kv-cache-dtype fp8``: the flags reach m13's config, and the engine, in the
    engine core's process of its own, streams exactly what it generates offline."""
    import asyncio

    from milestones.common import serve_cli

    parser = serve_cli.serve_parser("serve", EngineConfig)
    args = parser.parse_args(["--model", str(groupable_checkpoint), "--device", "cpu", "--quantization", "int8",
                              "--kv-cache-dtype", "fp8", "--kv-cache-tokens", "512", "--max-num-seqs", "2"])
    config = serve_cli.engine_config(EngineConfig, args, parser)
    assert config.quantization == "int8" and config.kv_cache_dtype == "fp8"
    prompts, params = [[5, 6, 7, 8], [9, 10, 11]], SamplingParams(max_tokens=4, ignore_eos=True)
    offline = [o.token_ids for o in LLMEngine(config).generate(prompts, params, use_tqdm=False)]

    async def serve() -> list[list[int]]:
        client = LLMEngine.make_engine_client(config)
        client.start()
        try:
            streams = [await client.add_request(p, params) for p in prompts]
            results = []
            for stream in streams:
                async for output in stream:
                    last = output
                results.append(list(last.token_ids))
            return results
        finally:
            await client.shutdown()

    assert asyncio.run(asyncio.wait_for(serve(), 120)) == offline


def test_a_cpu_with_float8_support_is_accepted():
    from milestones.m13_quantization.fp8_kv_cache import fp8_unsupported_reason

    assert fp8_unsupported_reason(torch.device("cpu"), "torch") is None


def test_kernels_compile_for_hopper():
    """The quantized matmuls (launch table, bf16) and m08's kernels on an FP8 cache, compiled for sm_90 by Triton's
    compiler with no GPU: the interpreter above never type-checks them."""
    script = Path(__file__).with_name("compile_m13_for_gpu.py")
    result = subprocess.run([sys.executable, str(script), "--quick", "--json"], cwd=script.parents[1],
                            capture_output=True, text=True, timeout=600)
    if result.returncode == 77:
        pytest.skip(result.stdout.strip())
    assert result.stdout.strip(), result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    failures = [f"{r['variant']}: {r['error']}" for r in report["results"] if not r["ok"]]
    assert not failures, "\n\n".join(failures)
    names = {k["name"] for r in report["results"] for k in r["kernels"]}
    assert {"_quantized_gemv_kernel", "_quantized_dot_kernel", "_store_kv_kernel", "_paged_decode_kernel"} <= names


def test_the_suite_gates_a_lossy_member_without_its_lossy_knobs():
    """The float32 gate checks exact tokens: an FP8-K/V member is gated as m13 unquantized (gpu_suite.LOSSY_KNOBS)."""
    from benchmarks.gpu_suite import gate_items
    from benchmarks.suite_sets import SETS

    items = gate_items(SETS["m13-fp8-kv"])
    assert {(i.engine, i.workload, i.overrides) for i in items} == {("m13", "nanovllm", ()),
                                                                     ("m13", "memory-bound", ())}


def test_quant_bench_runs_and_recommends_a_table(tmp_path):
    """The microbenchmark at a toy shape (interpreter on a CPU, launch table only): rows for bf16, int8 and int4,
    every output checked, and a launch table printed from what was measured."""
    from benchmarks import quant_bench

    result = quant_bench.main(["--device", str(DEVICE), "--shapes", "32x256", "--batches", "1,16", "--quick",
                               "--out", str(tmp_path / "quant_bench.json")])
    assert result["ok"] and json.loads((tmp_path / "quant_bench.json").read_text())["name"] == "quant_bench"
    measured = {(r["method"], r["m"]) for r in result["rows"]}
    assert measured == {(method, m) for method in ("bf16", "int8", "int4") for m in (1, 16)}
    assert all(r["in_table"] for r in result["rows"])
    assert "LAUNCH_TABLE" in result["recommended"]["paste"] and set(result["recommended"]["table"]) == {"int8", "int4"}


def test_quant_step_refuses_a_batch_size_without_a_graph(capsys):
    """quant_step times captured graphs only: a size between two rungs of m10's ladder (3 of 1, 2, 4) would be
    timed eagerly, so it is refused in one line before any engine is built (or any GPU asked for)."""
    from benchmarks import quant_step

    with pytest.raises(SystemExit):
        quant_step.main(["--batches", "1,3,4"])
    refusal = "--batches [3]: no CUDA graph is captured at those sizes (m10's ladder: [1, 2, 4])"
    assert refusal in capsys.readouterr().err


def test_quant_bench_times_the_candidates_it_is_given(tmp_path):
    """``--candidates``: those named, at their regimes' batches, beside the table's entry; an unknown name, or
    ``--quick`` beside it, is refused before anything runs."""
    from benchmarks import quant_bench

    result = quant_bench.main(["--device", str(DEVICE), "--shapes", "64x256", "--batches", "1", "--methods", "int4",
                               "--candidates", "swap_ab n64-m128-w4-s3, n16-k256-w4-s4 magic",
                               "--out", str(tmp_path / "quant_bench.json")])
    assert result["ok"] and result["candidates"] == ["n16-k256-w4-s4 magic", "swap_ab n64-m128-w4-s3"]
    assert {r["config_name"] for r in result["rows"]} == {"table gemv", "swap_ab n64-m128-w4-s3",
                                                          "n16-k256-w4-s4 magic"}
    for bad in (["--candidates", "nope"], ["--quick", "--candidates", "swap_ab n64-m128-w4-s3"]):
        with pytest.raises(SystemExit):
            quant_bench.build_parser().parse_args(bad)
