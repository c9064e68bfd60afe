"""m13's deferred norm done in the finish of the GEMV before it (``gemv_epilogues.deferred_norm_when_last``).

``quantized_deferred_add_norm`` is ``quantized_matmul_slices`` then ``deferred_add_rms_norm`` in one launch: the
last program of each group of outputs to count itself done adds the group's slices, the residual, and writes the
group's integers and sum of squares. The checks: the residual and the words are the two launches' to the bit
(the same additions in the same order), the parts of the sum of squares add up to theirs, every counter is back
at zero, for the table's blocks (two a group), blocks of a whole group and more, one slice or several, 1-4 rows;
bad shapes and other matmuls are refused in one line; the decoder with it launches none of the norms between
GEMVs and gives the same output within the order of that sum.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

pytest.importorskip("triton")

from milestones.m13_quantization import epilogue_layers, matmul_kernels  # noqa: E402
from milestones.m13_quantization.deferred_norm import deferred_add_rms_norm  # noqa: E402
from milestones.m13_quantization.epilogue_matmuls import (quantized_deferred_add_norm,  # noqa: E402
                                                          quantized_matmul_slices)
from milestones.m13_quantization.integer_dots import int16_x  # noqa: E402
from milestones.m13_quantization.launch_config import LAUNCH_TABLE  # noqa: E402
from milestones.m13_quantization.quantize import group_major, quantize_int4, quantize_int8, tile_int4  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
DP4A = LAUNCH_TABLE["int4"]["gemv"]


def int4_weight(n: int, k: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    packed, scales = quantize_int4(torch.randn(n, k, generator=gen) * 0.05)
    return tile_int4(packed).to(DEVICE), group_major(scales).to(DEVICE)


def two_launches_and_one(x, packed, scales, residual, weight, **launch):
    """(the slices then the deferred norm's kernel, the norm in the GEMV's finish), each on its own residual."""
    ours, theirs = residual.clone(), residual.clone()
    words = int16_x(x)
    expected = deferred_add_rms_norm(quantized_matmul_slices(x, packed, scales, "int4", x_words=words, **launch),
                                     theirs, weight, 1e-6)
    got = quantized_deferred_add_norm(x, packed, scales, "int4", ours, weight, 1e-6, x_words=words, **launch)
    return (expected, theirs), (got, ours)


def assert_same_norm(expected, got, theirs, ours):
    assert torch.equal(ours, theirs) and torch.equal(got.words, expected.words)
    assert got.squares.shape == (ours.shape[0], ours.shape[1] // 128)  # a part a group
    torch.testing.assert_close(got.squares.sum(dim=1), expected.squares.sum(dim=1), rtol=1e-5, atol=0)
    assert (got.eps, got.dim, got.dtype) == (expected.eps, expected.dim, expected.dtype)
    assert matmul_kernels._COUNTERS[ours.device].eq(0).all()  # every unit's counter set back for the next launch


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("block_n", [64, 256], ids=["two-blocks-a-group", "two-groups-a-block"])
@pytest.mark.parametrize("split_k", [1, 3], ids=["one-slice", "three-slices"])
def test_the_gemvs_finish_writes_the_deferred_norms_rows(rows, block_n, split_k):
    gen = torch.Generator().manual_seed(rows * block_n)
    packed, scales = int4_weight(512, 768, gen)
    x, residual = (torch.randn(rows, d, generator=gen).to(torch.bfloat16).to(DEVICE) for d in (768, 512))
    weight = (torch.rand(512, generator=gen) + 0.5).to(torch.bfloat16).to(DEVICE)
    config = replace(DP4A, block_n=block_n)
    (expected, theirs), (got, ours) = two_launches_and_one(x, packed, scales, residual, weight, config=config,
                                                           split_k=split_k)
    assert_same_norm(expected, got, theirs, ours)
    assert not torch.equal(ours, residual)  # the residual stream was added to, in place


def test_the_finish_adds_the_slices_in_slice_order():
    """Slices whose order shows in the sum: x's first 256 inputs are 1,000 times its last ones and its second 256
    their negation, over W's same columns, so slice 0's sums cancel slice 1's exactly and slice 2's are what is
    left; added from the last slice first, slice 2's low bits would be lost in slice 1's rounding. The finish must
    add them as the two launches do; and N of 384 over blocks of 256 rows (a unit cut by N) as well."""
    gen = torch.Generator().manual_seed(7)
    w = torch.randn(384, 768, generator=gen) * 0.05
    w[:, 256:512] = w[:, :256]
    packed, scales = quantize_int4(w)
    packed, scales = tile_int4(packed).to(DEVICE), group_major(scales).to(DEVICE)
    big = torch.randn(2, 256, generator=gen) * 1000
    x = torch.cat([big, -big, torch.randn(2, 256, generator=gen)], dim=1).to(torch.bfloat16).to(DEVICE)
    residual = torch.zeros(2, 384, dtype=torch.bfloat16, device=DEVICE)  # nothing to hide the sums' low bits
    weight = torch.ones(384, dtype=torch.bfloat16, device=DEVICE)
    for block_n in (64, 256):
        (expected, theirs), (got, ours) = two_launches_and_one(x, packed, scales, residual, weight,
                                                               config=replace(DP4A, block_n=block_n), split_k=3)
        assert_same_norm(expected, got, theirs, ours)
        assert ours.float().abs().max() < 10  # slices 0 and 1 cancelled: what is left is slice 2's


def test_the_norm_in_the_gemv_refuses_what_it_cannot_do():
    gen = torch.Generator().manual_seed(0)
    packed, scales = int4_weight(256, 256, gen)
    x, residual = (torch.randn(1, d, generator=gen).to(torch.bfloat16).to(DEVICE) for d in (256, 256))
    weight = torch.ones(256, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match="residual as"):
        quantized_deferred_add_norm(x, packed, scales, "int4", residual[:, :128], weight, 1e-6)
    with pytest.raises(ValueError, match="done in int4's GEMV on dp4a only"):
        q8, s8 = quantize_int8(torch.randn(256, 256, generator=gen))
        quantized_deferred_add_norm(x, q8.to(DEVICE), s8.to(DEVICE), "int8", residual, weight, 1e-6)
    with pytest.raises(ValueError, match="done in int4's GEMV on dp4a only"):
        quantized_deferred_add_norm(x, packed, scales, "int4", residual, weight, 1e-6,
                                    config=LAUNCH_TABLE["int4"]["small"])
    with pytest.raises(ValueError, match="done in int4's GEMV on dp4a only"):  # 5 rows: not the GEMV
        quantized_deferred_add_norm(x.repeat(5, 1), packed, scales, "int4", residual.repeat(5, 1), weight, 1e-6)
    narrow, narrow_scales = int4_weight(192, 256, gen)
    with pytest.raises(ValueError, match="N a multiple of 128"):
        quantized_deferred_add_norm(x, narrow, narrow_scales, "int4", residual[:, :192].contiguous(), weight[:192],
                                    1e-6)


def test_the_decoders_norms_between_gemvs_come_from_their_finish(monkeypatch):
    """The tiny model's decoder at one row, int4 on the Triton kernels: with ``NORM_IN_GEMV_MAX_ROWS`` the three
    norms between GEMVs (two layers; the final norm's reader is the LM head, and layer 0's input norm is
    ``first_norm``'s) come from o_proj's and down_proj's finish instead of ``deferred_add_rms_norm``'s launches,
    and the output is the same within the order in which the parts of the sum of squares are added."""
    from milestones.m01_naive_loop.loader import build_model, init_random_, preset_config
    from milestones.m13_quantization.deferred_norm import DeferredRows
    from milestones.m13_quantization.epilogue_layers import EpilogueCausalLM
    from milestones.m13_quantization.quantized_loader import quantize_model_

    config = preset_config("tiny")
    config.num_hidden_layers = 2
    model = build_model(config, DEVICE, torch.bfloat16)
    init_random_(model, 0, std=config.initializer_range)
    decoder = EpilogueCausalLM(quantize_model_(model, "int4", "triton"))
    calls = {"deferred_add_rms_norm": [], "quantized_deferred_add_norm": []}
    for name, seen in calls.items():
        launch = getattr(epilogue_layers, name)
        monkeypatch.setattr(epilogue_layers, name,
                            lambda *args, launch=launch, seen=seen, **kw: seen.append(launch(*args, **kw)) or seen[-1])
    outputs = {}
    for rows in (0, 4):
        monkeypatch.setattr(epilogue_layers, "NORM_IN_GEMV_MAX_ROWS", rows)
        with torch.no_grad():  # attention stood in for by q, k and v: what is checked is the norms
            outputs[rows] = decoder(torch.tensor([5], device=DEVICE), torch.tensor([3], device=DEVICE),
                                    lambda layer, q, k, v: q + v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
                                    + k.sum())
    assert len(calls["deferred_add_rms_norm"]) == 3 and len(calls["quantized_deferred_add_norm"]) == 3
    assert all(isinstance(rows, DeferredRows) for rows in calls["quantized_deferred_add_norm"])
    got, expected = outputs[4].float(), outputs[0].float()
    assert (got - expected).norm() / expected.norm() < 1e-2


@pytest.mark.skipif(not CUDA, reason="needs CUDA (dp4a compiled, at Qwen3-8B's shapes)")
@pytest.mark.parametrize("rows", [1, 2, 4])
@pytest.mark.parametrize("n, k", [(4096, 4096), (4096, 12288)], ids=["o_proj", "down_proj"])
def test_the_norm_in_the_gemv_on_cuda_at_qwen3_8b_shapes(rows, n, k):
    """Compiled, the programs of a group finish in any order, and the last one still sees every slice: the same
    bits as the two launches, repeated."""
    gen = torch.Generator().manual_seed(rows)
    packed, scales = int4_weight(n, k, gen)
    x, residual = (torch.randn(rows, d, generator=gen).to(torch.bfloat16).to(DEVICE) for d in (k, n))
    weight = (torch.rand(n, generator=gen) + 0.5).to(torch.bfloat16).to(DEVICE)
    for _ in range(3):
        (expected, theirs), (got, ours) = two_launches_and_one(x, packed, scales, residual, weight)
        assert_same_norm(expected, got, theirs, ours)
