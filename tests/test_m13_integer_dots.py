"""m13's ``dp4a`` GEMV: x as 16-bit integers per group of 128, int4 times them four products an instruction.

On a CPU the Triton kernels run in the interpreter, where ``_dp4a`` is the same sum spelled out byte by byte
(the PTX instruction runs only compiled: the CUDA test below, and ``tests/compile_m13_for_gpu.py``). The checks:
``int16_x``'s integers and scales are what its torch reference says, to the bit; the GEMV gives the float
reference's sums for the x those integers stand for (so the only change from bf16 x is x's rounding, which is
measured too); float32 activations keep ``subnormal``; the launch table's rows; the add + norm that writes its
output as those integers too (``integer_norm.py``), and the decoder that hands them to the next GEMV.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from milestones.m12_async_scheduling.fused_kernels import add_rms_norm  # noqa: E402
from milestones.m13_quantization import epilogue_layers, matmul_kernels  # noqa: E402
from milestones.m13_quantization.epilogue_matmuls import quantized_add_rms_norm, quantized_silu_and_mul  # noqa: E402
from milestones.m13_quantization.integer_dots import X_INT_MAX, int16_x, int16_x_reference  # noqa: E402
from milestones.m13_quantization.deferred_norm import deferred_add_rms_norm, deferred_rms_norm  # noqa: E402
from milestones.m13_quantization.integer_norm import IntegerRows, add_rms_norm_int16  # noqa: E402
from milestones.m13_quantization.launch_config import CANDIDATES, LAUNCH_TABLE, choose_launch  # noqa: E402
from milestones.m13_quantization.matmul_kernels import quantized_matmul  # noqa: E402
from milestones.m13_quantization.quantize import (dequantize_int4, group_major, quantize_int4,  # noqa: E402
                                                  tile_int4)

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
DP4A = LAUNCH_TABLE["int4"]["gemv"]
SUBNORMAL = CANDIDATES["gemv"]["n32-k256-w1-s3 subnormal"]


def decoded(words: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``int16_x``'s words of each row -> (q ``[M, K]`` int32, s_x ``[M, K/128]``, sum q ``[M, K/128]``)."""
    hi = words[:, :k // 4].contiguous().view(torch.int8).int()  # signed high bytes, little-endian order
    lo = words[:, k // 4:k // 2].contiguous().view(torch.uint8).int()
    stats = words[:, k // 2:]
    return hi * 256 + lo, stats[:, :k // 128].contiguous().view(torch.float32), stats[:, k // 128:]


def test_int16_x_writes_each_groups_integers_and_scale():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 512, generator=gen) * 3
    x[0, :128] = 0.0  # a group of zeros: scale 1, integers 0
    x[1, 130] = 1e4  # one large input: the rest of its group keeps 1/32767 of it as a step
    x[2, 256:384] = torch.linspace(-1, 1, 128)
    q, s_x, q_sum = decoded(int16_x(x.to(DEVICE)).cpu(), 512)
    assert s_x[0, 0] == 1.0 and q[0, :128].eq(0).all()
    assert q.abs().max() <= X_INT_MAX and q.view(3, 4, 128).abs().amax(dim=2).eq(X_INT_MAX)[s_x != 1.0].all()
    assert torch.equal(q_sum, q.view(3, 4, 128).sum(dim=2))
    assert torch.equal((q.view(3, 4, 128) * s_x[:, :, None]).view(3, 512), int16_x_reference(x))
    # finer than bf16 for every input within 1/128 of its group's largest
    big = x.abs() >= x.view(3, 4, 128).abs().amax(dim=2, keepdim=True).repeat_interleave(128, dim=2).view(3, 512) / 128
    rel = ((int16_x_reference(x) - x).abs() / x.abs().clamp(min=1e-30))[big]
    assert rel.max() < 2 ** -9


@pytest.mark.parametrize("n, k, m, split_k", [(64, 256, 1, None), (40, 384, 2, 3), (96, 512, 4, 2), (32, 256, 3, 1)],
                         ids=["whole", "tails-3-slices", "4-rows", "3-rows"])
@pytest.mark.parametrize("tiled", [True, False], ids=["tiles", "rows"])
def test_dp4a_gemv_sums_what_the_integers_stand_for(n, k, m, split_k, tiled):
    """Against the float reference on the x that ``int16_x`` stands for, and against subnormal on the bf16 x
    itself: within the output's rounding to bf16 (a step of 2^-8 of the largest output, or less)."""
    gen = torch.Generator().manual_seed(n + k + m)
    packed, scales = quantize_int4(torch.randn(n, k, generator=gen) * 0.05)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    weight = dequantize_int4(packed, scales)
    if tiled and n % 16 == 0:
        packed, scales = tile_int4(packed), group_major(scales)
    packed, scales = packed.to(DEVICE), scales.to(DEVICE)
    out = quantized_matmul(x.to(DEVICE), packed, scales, "int4", config=DP4A, split_k=split_k).float().cpu()
    expected = int16_x_reference(x) @ weight.t()
    assert ((out - expected).abs().max() / expected.abs().max()) < 2 ** -7
    plain = quantized_matmul(x.to(DEVICE), packed, scales, "int4", config=SUBNORMAL, split_k=split_k).float().cpu()
    assert ((out - plain).abs().max() / plain.abs().max()) < 2 ** -7


def test_dp4a_epilogues_match_subnormals():
    gen = torch.Generator().manual_seed(3)
    n, k = 64, 256
    packed, scales = quantize_int4(torch.randn(2 * n, k, generator=gen) * 0.05)
    packed, scales = tile_int4(packed).to(DEVICE), group_major(scales).to(DEVICE)
    x = torch.randn(1, k, generator=gen).to(torch.bfloat16).to(DEVICE)
    silu = [quantized_silu_and_mul(x, packed, scales, "int4", config=c).float() for c in (DP4A, SUBNORMAL)]
    assert ((silu[0] - silu[1]).abs().max() / silu[1].abs().max()) < 2 ** -7
    residual = torch.randn(1, 2 * n, generator=gen).to(torch.bfloat16).to(DEVICE)
    norm_weight = torch.rand(2 * n, generator=gen).to(torch.bfloat16).to(DEVICE)
    normed = []
    for config in (DP4A, SUBNORMAL):
        streams = residual.clone()
        normed.append(quantized_add_rms_norm(x, packed, scales, "int4", streams, norm_weight, 1e-6, config=config,
                                             split_k=2).float())
    assert ((normed[0] - normed[1]).abs().max() / normed[1].abs().max()) < 2 ** -6


def test_float32_activations_keep_subnormal():
    """16-bit integers are finer than bf16's 8 bits of x, not float32's 24: a float32 x keeps float products."""
    gen = torch.Generator().manual_seed(5)
    packed, scales = quantize_int4(torch.randn(32, 256, generator=gen) * 0.05)
    x = torch.randn(1, 256, generator=gen).to(DEVICE)
    packed, scales = packed.to(DEVICE), scales.to(DEVICE)
    assert torch.equal(quantized_matmul(x, packed, scales, "int4", config=DP4A),
                       quantized_matmul(x, packed, scales, "int4", config=SUBNORMAL))


def test_int4_runs_dp4a_to_4_rows():
    for m in (1, 2, 4):
        assert choose_launch("int4", m, 4096, 4096, 132)[0] == DP4A
    assert choose_launch("int4", 5, 4096, 4096, 132)[0] == LAUNCH_TABLE["int4"]["small"]
    assert choose_launch("int8", 1, 151936, 4096, 132)[0].unpack != "dp4a"


@pytest.mark.parametrize("rows, d", [(1, 256), (3, 384), (1, 4096)], ids=["1x256", "3x384", "1x4096"])
def test_add_rms_norm_int16_is_m12s_norm_then_int16_x(rows, d):
    """The same residual and output as m12's kernel, and the words ``int16_x`` writes of that output, to the
    bit (384: three groups, the row padded to 512 inside the kernel)."""
    gen = torch.Generator().manual_seed(rows + d)
    x, residual = (torch.randn(rows, d, generator=gen).to(torch.bfloat16).to(DEVICE) for _ in range(2))
    weight = torch.rand(d, generator=gen).to(torch.bfloat16).to(DEVICE)
    streams = residual.clone()
    expected = add_rms_norm(x, streams, weight, 1e-6)
    got = add_rms_norm_int16(x, residual, weight, 1e-6)
    assert torch.equal(residual, streams) and torch.equal(got.x, expected)
    assert torch.equal(got.words, int16_x(expected))
    with pytest.raises(ValueError, match="multiple of 128"):
        add_rms_norm_int16(x[:, :200].contiguous(), residual[:, :200].contiguous(), weight[:200], 1e-6)


def test_a_gemv_given_xs_words_multiplies_them_instead_of_converting():
    gen = torch.Generator().manual_seed(7)
    packed, scales = quantize_int4(torch.randn(128, 256, generator=gen) * 0.05)
    packed, scales = tile_int4(packed).to(DEVICE), group_major(scales).to(DEVICE)
    x = torch.randn(2, 256, generator=gen).to(torch.bfloat16).to(DEVICE)
    other = torch.randn(2, 256, generator=gen).to(torch.bfloat16).to(DEVICE)
    for matmul in (quantized_matmul, quantized_silu_and_mul):
        plain = matmul(x, packed, scales, "int4")
        assert torch.equal(matmul(x, packed, scales, "int4", x_words=int16_x(x)), plain)
        # the words are what it multiplies: another x's words give that x's result
        assert torch.equal(matmul(x, packed, scales, "int4", x_words=int16_x(other)),
                           matmul(other, packed, scales, "int4"))
    with pytest.raises(ValueError, match="x_words must be int16_x's form"):
        quantized_matmul(x, packed, scales, "int4", x_words=int16_x(x)[:, :-1])


@pytest.mark.parametrize("deferred", [False, True], ids=["exact-norm", "deferred-norm"])
def test_norms_before_dp4a_gemvs_hand_them_their_integers(deferred, monkeypatch):
    """m13's decode graphs' decoder at one row of bf16, int4 on the Triton kernels: with each norm before q/k/v
    and gate_up writing their x as integers, and gate_up's GEMV down_proj's, the conversions per step drop from
    four a layer to one (o_proj's x: attention here is a plain function, with no combine). The norm that writes
    the integers exactly gives the same output to the bit as converting before every GEMV; the deferred norm
    (1 / rms multiplied by the reader) the same within x's rounding."""
    from milestones.m01_naive_loop.loader import build_model, init_random_, preset_config
    from milestones.m13_quantization.deferred_norm import DeferredRows
    from milestones.m13_quantization.epilogue_layers import EpilogueCausalLM
    from milestones.m13_quantization.quantized_loader import quantize_model_

    config = preset_config("tiny")
    config.num_hidden_layers = 2
    model = build_model(config, DEVICE, torch.bfloat16)
    init_random_(model, 0, std=config.initializer_range)
    decoder = EpilogueCausalLM(quantize_model_(model, "int4", "triton"))
    conversions, convert = [], matmul_kernels.int16_x
    monkeypatch.setattr(matmul_kernels, "int16_x", lambda x: conversions.append(x.shape[0]) or convert(x))
    normed = []
    for name in ("add_rms_norm_int16", "deferred_add_rms_norm"):
        norm = getattr(epilogue_layers, name)
        monkeypatch.setattr(epilogue_layers, name, lambda *args, norm=norm: normed.append(norm(*args)) or normed[-1])
    monkeypatch.setattr(epilogue_layers, "NORM_EPILOGUE_MAX_ROWS", 0)  # m12's norm, whose bits the exact one keeps
    monkeypatch.setattr(epilogue_layers, "DEFERRED_NORM_MAX_ROWS", 4 if deferred else 0)
    monkeypatch.setattr(epilogue_layers, "NORM_IN_GEMV_MAX_ROWS", 0)  # the norms' own kernels (test_m13_norm_in_gemv)
    outputs = {}
    for rows in (4, 0):  # a norm writes integers up to 4 rows of x; then never
        monkeypatch.setattr(epilogue_layers, "INTEGER_X_MAX_ROWS", rows)
        conversions.clear()
        with torch.no_grad():  # attention stood in for by q, k and v: what is checked is the matmuls' x
            outputs[rows] = decoder(torch.tensor([5], device=DEVICE), torch.tensor([3], device=DEVICE),
                                    lambda layer, q, k, v: q + v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
                                    + k.sum()), len(conversions)
    # o_proj's x in each layer; layer 0's q/k/v's too, after m12's norm of the embedding (the deferred norm writes them)
    assert outputs[4][1] == 2 * 1 + (0 if deferred else 1) and outputs[0][1] == 4 * 2
    assert len(normed) == 3 and all(isinstance(r, DeferredRows if deferred else IntegerRows) for r in normed)
    assert outputs[4][0].dtype == torch.bfloat16
    if deferred:
        got, expected = outputs[4][0].float(), outputs[0][0].float()
        assert (got - expected).norm() / expected.norm() < 2e-2
    else:
        assert torch.equal(outputs[4][0], outputs[0][0])


@pytest.mark.skipif(not CUDA, reason="needs CUDA (dp4a compiled, at Qwen3-8B's shapes)")
@pytest.mark.parametrize("m", [1, 2, 4])
@pytest.mark.parametrize("n, k", [(6144, 4096), (4096, 12288), (24576, 4096)])
def test_dp4a_on_cuda_at_qwen3_8b_shapes(n, k, m):
    gen = torch.Generator().manual_seed(m)
    packed, scales = quantize_int4(torch.randn(n, k, generator=gen) * 0.05)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    expected = int16_x_reference(x).cuda() @ dequantize_int4(packed, scales).cuda().t()
    out = quantized_matmul(x.cuda(), tile_int4(packed).cuda(), group_major(scales).cuda(), "int4", config=DP4A)
    assert ((out.float() - expected).abs().max() / expected.abs().max()) < 2 ** -8


@pytest.mark.parametrize("head_dim", [128, 256])
def test_the_combine_writes_attentions_output_as_o_projs_integers(head_dim):
    """m08's combine with ``IntegerHeadsAttention``'s: the same output to the bit, and beside it the words
    ``int16_x`` writes from that output (a head is one group of 128 inputs, or two)."""
    from milestones.m08_triton_kernel.paged_decode_kernel import paged_decode_attention
    from milestones.m13_quantization.integer_heads import IntegerHeadsAttention

    gen = torch.Generator().manual_seed(head_dim)
    lengths, block, heads, kv_heads = [5, 40, 70], 16, 4, 2
    blocks = sum(-(-n // block) for n in lengths)
    k_cache, v_cache = (torch.randn(blocks, block, kv_heads, head_dim, generator=gen).to(torch.bfloat16).to(DEVICE)
                        for _ in range(2))
    tables = torch.zeros(len(lengths), 5, dtype=torch.int32)
    first = 0
    for row, n in enumerate(lengths):
        tables[row, :-(-n // block)] = torch.arange(first, first - (-n // block))
        first -= -n // block
    q = torch.randn(len(lengths), heads, head_dim, generator=gen).to(torch.bfloat16).to(DEVICE)
    args = (q, k_cache, v_cache, tables.to(DEVICE), torch.tensor(lengths, dtype=torch.int32, device=DEVICE),
            head_dim ** -0.5)
    attention = IntegerHeadsAttention(None, None, None, None, 0)
    out = paged_decode_attention(*args, num_splits=3, combine=attention.combine)
    assert torch.equal(out, paged_decode_attention(*args, num_splits=3))
    assert torch.equal(attention.words, int16_x(out.reshape(len(lengths), heads * head_dim)))


def test_decode_graphs_hand_o_proj_the_combines_integers(monkeypatch):
    """The decoder of m13's decode graphs at one row, int4 on dp4a, over a real paged cache: with m10's graph
    attention, o_proj reads the combine's integers, and the step converts one x a layer fewer; the output is the
    same to the bit as with the conversion launch (attention given as a plain function)."""
    from milestones.m01_naive_loop.loader import build_model, init_random_, preset_config
    from milestones.m05_paged_blocks.paged_attention import PagedKVCache
    from milestones.m10_cuda_graphs.graph_runner import GraphDecodeAttention
    from milestones.m13_quantization.epilogue_layers import EpilogueCausalLM
    from milestones.m13_quantization.quantized_loader import quantize_model_

    config = preset_config("tiny")
    config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads = 2, 2, 1
    config.hidden_size, config.head_dim = 256, 128  # a head: one group of o_proj's input
    model = build_model(config, DEVICE, torch.bfloat16)
    init_random_(model, 0, std=config.initializer_range)
    decoder = EpilogueCausalLM(quantize_model_(model, "int4", "triton"))
    cache = PagedKVCache(2, 4, 16, 1, 128, torch.bfloat16, DEVICE)
    gen = torch.Generator().manual_seed(1)
    for layer in range(2):  # 40 keys already cached, the new one goes to slot 40
        cache.k[layer].copy_(torch.randn(cache.k[layer].shape, generator=gen))
        cache.v[layer].copy_(torch.randn(cache.v[layer].shape, generator=gen))
    def graph_attention(bound: int) -> GraphDecodeAttention:  # K in slices from m08's heuristic, or not
        return GraphDecodeAttention(cache, torch.tensor([40], device=DEVICE),
                                    torch.tensor([[2, 0, 3, 1]], dtype=torch.int32, device=DEVICE),
                                    torch.tensor([41], dtype=torch.int32, device=DEVICE), bound)

    graph = graph_attention(4096)
    conversions, convert = [], matmul_kernels.int16_x
    monkeypatch.setattr(matmul_kernels, "int16_x", lambda x: conversions.append(x.shape[0]) or convert(x))
    monkeypatch.setattr(epilogue_layers, "NORM_EPILOGUE_MAX_ROWS", 0)
    outputs = {}
    for name, attention in (("combine", graph), ("launch", lambda *args: graph(*args)),
                            ("unsplit", graph_attention(64))):  # no slices: no combine, the launch stays
        conversions.clear()
        with torch.no_grad():
            outputs[name] = decoder(torch.tensor([5], device=DEVICE), torch.tensor([40], device=DEVICE),
                                    attention), len(conversions)
    # layer 0's q/k/v read the words of the deferred norm of the embedding (EpilogueQwen3Model.first_norm)
    assert outputs["launch"][1] == 2 * 1 and outputs["combine"][1] == 2 * 0
    assert outputs["unsplit"][1] == outputs["launch"][1]
    assert torch.equal(outputs["combine"][0], outputs["launch"][0])


@pytest.mark.parametrize("rows, split_k", [(1, None), (3, None), (2, 2)], ids=["1-row", "3-rows", "2-rows-2-slices"])
def test_silu_and_muls_gemv_writes_down_projs_integers(rows, split_k):
    """gate_up's GEMV with SiLU * up, its outputs also written as ``int16_x``'s words: each program makes one
    group of 128 outputs (256 rows of W) and converts it from registers. The outputs are the plain epilogue's, the
    words ``int16_x``'s of them, to the bit, and every counter is back at zero. A launch whose programs make part
    of a group is refused in one line; where the outputs are not whole groups, or the caller's launch does not
    make whole groups, the plain tensor comes back."""
    from milestones.m13_quantization.epilogue_matmuls import quantized_silu_and_mul_int16
    from milestones.m13_quantization.gemv_epilogues import _Epilogue
    from milestones.m13_quantization.integer_dots import int16_x_words
    from milestones.m13_quantization.launch_config import SILU_WORDS_GEMV

    gen = torch.Generator().manual_seed(rows)
    packed, scales = quantize_int4(torch.randn(2 * 256, 256, generator=gen) * 0.05)
    packed, scales = tile_int4(packed).to(DEVICE), group_major(scales).to(DEVICE)
    x = torch.randn(rows, 256, generator=gen).to(torch.bfloat16).to(DEVICE)
    plain = quantized_silu_and_mul(x, packed, scales, "int4", config=SILU_WORDS_GEMV, split_k=split_k or 1)
    words = torch.empty((rows, int16_x_words(256)), dtype=torch.int32, device=DEVICE)
    out = matmul_kernels._gemv(x, packed, scales, rows, 512, 256, True, SILU_WORDS_GEMV, split_k or 1,
                               _Epilogue("silu_and_mul", words=words))
    assert torch.equal(out, plain) and torch.equal(words, int16_x(plain))
    assert matmul_kernels._COUNTERS.get(x.device) is None or matmul_kernels._COUNTERS[x.device].eq(0).all()
    both = quantized_silu_and_mul_int16(x, packed, scales, "int4", split_k=split_k)  # SILU_WORDS_GEMV by default
    assert isinstance(both, IntegerRows) and torch.equal(both.x, plain) and torch.equal(both.words, words)
    with pytest.raises(ValueError, match="one group of 128 outputs"):
        matmul_kernels._gemv(x, packed, scales, rows, 512, 256, True, DP4A, 1, _Epilogue("silu_and_mul", words=words))
    partial = quantized_silu_and_mul_int16(x, packed, scales, "int4", config=DP4A)  # 32 outputs a program
    assert isinstance(partial, torch.Tensor) and partial.shape == (rows, 256)
    odd, odd_scales = quantize_int4(torch.randn(2 * 96, 256, generator=gen) * 0.05)
    alone = quantized_silu_and_mul_int16(x, odd.to(DEVICE), group_major(odd_scales).to(DEVICE), "int4")
    assert isinstance(alone, torch.Tensor) and alone.shape == (rows, 96)


@pytest.mark.parametrize("rows", [1, 3])
def test_the_norm_adds_the_slices_a_split_gemv_leaves(rows):
    """o_proj's and down_proj's GEMV may leave its K slices' sums unadded, for the norm after it to add (the
    exact one, or the deferred one): the residual, the output and the words (and the parts of the sum of squares)
    are those of the GEMV that finishes its own sums, to the bit, and no counter is touched. A GEMV with K in one
    slice leaves it too."""
    from milestones.m13_quantization.epilogue_matmuls import quantized_matmul_slices
    from milestones.m13_quantization.sliced_sums import SlicedSums

    gen = torch.Generator().manual_seed(rows)
    packed, scales = quantize_int4(torch.randn(256, 768, generator=gen) * 0.05)  # 3 steps of K: 3 slices here
    packed, scales = tile_int4(packed).to(DEVICE), group_major(scales).to(DEVICE)
    x, residual = (torch.randn(rows, d, generator=gen).to(torch.bfloat16).to(DEVICE) for d in (768, 256))
    weight = torch.rand(256, generator=gen).to(torch.bfloat16).to(DEVICE)
    sums = quantized_matmul_slices(x, packed, scales, "int4", x_words=int16_x(x))
    assert isinstance(sums, SlicedSums) and sums.parts.shape[:2] == (3, rows)
    assert matmul_kernels._COUNTERS.get(x.device) is None or matmul_kernels._COUNTERS[x.device].eq(0).all()
    finished = quantized_matmul(x, packed, scales, "int4")
    for norm in (add_rms_norm_int16, deferred_add_rms_norm):
        streams, ours = residual.clone(), residual.clone()
        expected, got = norm(finished, streams, weight, 1e-6), norm(sums, ours, weight, 1e-6)
        assert torch.equal(ours, streams) and all(torch.equal(getattr(got, name), getattr(expected, name))
                                                  for name in ("x", "words", "squares") if hasattr(got, name))
    short, short_scales = quantize_int4(torch.randn(256, 256, generator=gen) * 0.05)
    short, short_scales = tile_int4(short).to(DEVICE), group_major(short_scales).to(DEVICE)
    whole = quantized_matmul_slices(x[:, :256].contiguous(), short, short_scales, "int4")
    assert isinstance(whole, SlicedSums) and whole.parts.shape[0] == 1  # one step of K: one slice, still left
    expected = add_rms_norm_int16(quantized_matmul(x[:, :256].contiguous(), short, short_scales, "int4"),
                                  residual.clone(), weight, 1e-6)
    assert torch.equal(add_rms_norm_int16(whole, residual.clone(), weight, 1e-6).words, expected.words)
    with pytest.raises(ValueError, match="float32 slices"):
        add_rms_norm_int16(SlicedSums(sums.parts, torch.float16), residual, weight, 1e-6)
    with pytest.raises(ValueError, match="leaves its slices unadded only"):
        matmul_kernels._gemv(x, packed, scales, rows, 256, 768, True, DP4A, 3,
                             matmul_kernels._Epilogue("silu_and_mul"), leave_slices=True)


def test_q_k_norm_rope_adds_the_slices_q_k_v_leaves():
    """q/k/v's GEMV leaves its slices for q/k norm + RoPE to add: q, k and v are m12's kernel's (and v the
    projection's own columns) after the GEMV that finishes its sums, to the bit."""
    from milestones.m01_naive_loop.model import RotaryEmbedding
    from milestones.m12_async_scheduling.fused_kernels import qk_norm_rope
    from milestones.m13_quantization.epilogue_matmuls import quantized_matmul_slices
    from milestones.m13_quantization.sliced_sums import SlicedSums, sliced_qk_norm_rope

    heads, kv_heads, dim = 4, 2, 64
    gen = torch.Generator().manual_seed(3)
    packed, scales = quantize_int4(torch.randn((heads + 2 * kv_heads) * dim, 512, generator=gen) * 0.05)
    packed, scales = tile_int4(packed).to(DEVICE), group_major(scales).to(DEVICE)
    x = torch.randn(2, 512, generator=gen).to(torch.bfloat16).to(DEVICE)
    norm_weight = torch.rand(heads + kv_heads, dim, generator=gen).to(torch.bfloat16).to(DEVICE)
    rope = RotaryEmbedding(dim, 64, 1e6).to(DEVICE, torch.bfloat16)
    positions = torch.tensor([3, 17], device=DEVICE)
    sums = quantized_matmul_slices(x, packed, scales, "int4")
    assert isinstance(sums, SlicedSums) and sums.parts.shape[0] == 2
    got = sliced_qk_norm_rope(sums, heads, kv_heads, dim, norm_weight, rope.cos, rope.signed_sin, positions, 1e-6)
    qkv = quantized_matmul(x, packed, scales, "int4")
    q, k = qk_norm_rope(qkv, heads, kv_heads, dim, norm_weight, rope.cos, rope.signed_sin, positions, 1e-6)
    v = qkv[:, (heads + kv_heads) * dim:].view(2, kv_heads, dim)
    assert all(torch.equal(a, b) for a, b in zip(got, (q, k, v)))


def test_the_decoders_readers_add_its_gemvs_slices(monkeypatch):
    """The decoder at one row, int4 on dp4a, with q/k/v, o_proj and down_proj long enough in K to be cut into
    slices: the kernels after them add the slices, and the output is the same to the bit as with the GEMVs
    adding them (after the deferred norm q/k/v always leaves its slices: they are where 1 / rms is multiplied;
    the exact norm's readers are checked one by one above)."""
    from milestones.m01_naive_loop.loader import build_model, init_random_, preset_config
    from milestones.m13_quantization import epilogue_matmuls
    from milestones.m13_quantization.epilogue_layers import EpilogueCausalLM
    from milestones.m13_quantization.quantized_loader import quantize_model_
    from milestones.m13_quantization.sliced_sums import SlicedSums

    config = preset_config("tiny")
    config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads = 2, 4, 1
    config.hidden_size, config.head_dim, config.intermediate_size = 512, 128, 512  # K: 512 each, 2 slices
    model = build_model(config, DEVICE, torch.bfloat16)
    init_random_(model, 0, std=config.initializer_range)
    decoder = EpilogueCausalLM(quantize_model_(model, "int4", "triton"))
    left, leave = [], epilogue_matmuls.quantized_matmul_slices
    monkeypatch.setattr(epilogue_layers, "NORM_IN_GEMV_MAX_ROWS", 0)  # the norms' own kernels add the slices
    monkeypatch.setattr(epilogue_layers, "quantized_matmul_slices",
                        lambda *args, **kw: left.append(leave(*args, **kw)) or left[-1])
    outputs = {}
    for rows in (4, 0):  # the readers add the slices up to 4 rows of x; then never
        monkeypatch.setattr(epilogue_layers, "NORM_ADDS_SLICES_MAX_ROWS", rows)
        monkeypatch.setattr(epilogue_layers, "ROPE_ADDS_SLICES_MAX_ROWS", rows)
        with torch.no_grad():  # attention stood in for by q and v
            outputs[rows] = decoder(torch.tensor([5], device=DEVICE), torch.tensor([3], device=DEVICE),
                                    lambda layer, q, k, v: q + v.repeat_interleave(4, dim=1) + k.sum())
    # o_proj, down_proj, then o_proj (each layer's q/k/v reads a deferred norm's rows, layer 0's the embedding's:
    # deferred_matmul_slices; the last layer's norm is the head's: no integers)
    assert [isinstance(sums, SlicedSums) for sums in left] == [True] * 3
    assert torch.equal(outputs[4], outputs[0])


@pytest.mark.parametrize("rows, d", [(1, 512), (3, 384), (2, 1024)], ids=["1x512", "3x384", "2x1024"])
def test_the_deferred_norm_leaves_1_over_rms_to_its_readers(rows, d):
    """The norm before q/k/v and gate_up, cut at 1 / rms (``deferred_norm.py``): the residual is m12's to the
    bit, the words are ``int16_x``'s of ``h * w`` in float32, the parts add up to the sum of h^2; gate_up's GEMV
    and q/k norm + RoPE multiply by 1 / rms and come within x's rounding of the exact norm's results."""
    from milestones.m01_naive_loop.model import RotaryEmbedding
    from milestones.m12_async_scheduling.fused_kernels import qk_norm_rope
    from milestones.m13_quantization.epilogue_matmuls import deferred_matmul_slices
    from milestones.m13_quantization.sliced_sums import sliced_qk_norm_rope

    gen = torch.Generator().manual_seed(rows + d)
    x, residual = (torch.randn(rows, d, generator=gen).to(torch.bfloat16).to(DEVICE) for _ in range(2))
    weight = (torch.rand(d, generator=gen) + 0.5).to(torch.bfloat16).to(DEVICE)
    streams = residual.clone()
    exact = add_rms_norm_int16(x, streams, weight, 1e-6)
    deferred = deferred_add_rms_norm(x, residual, weight, 1e-6)
    assert torch.equal(residual, streams)
    assert torch.equal(deferred.words, int16_x(residual.float() * weight.float()))
    torch.testing.assert_close(deferred.squares.sum(dim=1), residual.float().pow(2).sum(dim=1), rtol=1e-5, atol=0)
    first = deferred_rms_norm(residual, weight, 1e-6)  # layer 0's: the embedding's rows, only read
    assert torch.equal(residual, streams) and torch.equal(first.words, deferred.words)
    assert torch.equal(first.squares, deferred.squares)

    def rel(got, expected):
        return ((got.float() - expected.float()).norm() / expected.float().norm()).item()

    packed, scales = quantize_int4(torch.randn(2 * 256, d, generator=gen) * 0.05)
    h = residual.double()  # the float64 truth: x normalised exactly, times the int4 weights
    gate_up = (h * (h.pow(2).mean(dim=1, keepdim=True) + 1e-6).rsqrt() * weight.double()
               ) @ dequantize_int4(packed, scales).double().T.to(DEVICE)
    truth = torch.nn.functional.silu(gate_up[:, :256]) * gate_up[:, 256:]
    packed, scales = tile_int4(packed).to(DEVICE), group_major(scales).to(DEVICE)
    errors = [rel(quantized_silu_and_mul(rows_in, packed, scales, "int4", **kw), truth)
              for rows_in, kw in ((deferred, {}), (exact.x, {"x_words": exact.words}))]
    assert errors[0] < errors[1] and errors[0] < 3e-2, errors  # bf16 roundings of x, gate, up and the output
    heads, kv_heads, dim = 2, 1, 64
    qkv_w, qkv_scales = quantize_int4(torch.randn((heads + 2 * kv_heads) * dim, d, generator=gen) * 0.05)
    qkv_w, qkv_scales = tile_int4(qkv_w).to(DEVICE), group_major(qkv_scales).to(DEVICE)
    norm_weight = torch.rand(heads + kv_heads, dim, generator=gen).to(torch.bfloat16).to(DEVICE)
    rope = RotaryEmbedding(dim, 64, 1e6).to(DEVICE, torch.bfloat16)
    positions = torch.arange(rows, device=DEVICE) + 5
    got = sliced_qk_norm_rope(deferred_matmul_slices(deferred, qkv_w, qkv_scales, "int4"), heads, kv_heads, dim,
                              norm_weight, rope.cos, rope.signed_sin, positions, 1e-6)
    qkv = quantized_matmul(exact.x, qkv_w, qkv_scales, "int4", x_words=exact.words)
    q, k = qk_norm_rope(qkv, heads, kv_heads, dim, norm_weight, rope.cos, rope.signed_sin, positions, 1e-6)
    v = qkv[:, (heads + kv_heads) * dim:].view(rows, kv_heads, dim)
    # within bf16's rounding of x and of the outputs (measured 0.4-0.5%); v would be 1 - 1 / rms off without it
    assert all(rel(a, b) < 1e-2 for a, b in zip(got, (q, k, v))), [rel(a, b) for a, b in zip(got, (q, k, v))]
    with pytest.raises(ValueError, match="deferred norm's rows are read by the GEMV only"):
        quantized_silu_and_mul(deferred, packed, scales, "int4", config=LAUNCH_TABLE["int4"]["small"])
    with pytest.raises(ValueError, match="multiple of 128"):
        deferred_add_rms_norm(x[:, :200].contiguous(), residual[:, :200].contiguous(), weight[:200], 1e-6)


def test_the_decoder_takes_no_tokens_and_deferred_rows_refuse_other_matmuls():
    """An empty step gives an empty output (no integer path at 0 rows); a deferred norm's rows given to a matmul
    that would read x itself (int8 here) are refused in one line, never multiplied as the unwritten stand-in."""
    from milestones.m01_naive_loop.loader import build_model, init_random_, preset_config
    from milestones.m13_quantization.epilogue_layers import EpilogueCausalLM
    from milestones.m13_quantization.epilogue_matmuls import deferred_matmul_slices
    from milestones.m13_quantization.quantize import quantize_int8
    from milestones.m13_quantization.quantized_loader import quantize_model_

    config = preset_config("tiny")
    config.num_hidden_layers = 1
    model = build_model(config, DEVICE, torch.bfloat16)
    init_random_(model, 0, std=config.initializer_range)
    decoder = EpilogueCausalLM(quantize_model_(model, "int4", "triton"))
    with torch.no_grad():
        out = decoder(torch.zeros(0, dtype=torch.long, device=DEVICE), torch.zeros(0, dtype=torch.long, device=DEVICE),
                      lambda layer, q, k, v: q)
    assert out.shape == (0, config.hidden_size)
    gen = torch.Generator().manual_seed(0)
    x, residual = (torch.randn(1, 256, generator=gen).to(torch.bfloat16).to(DEVICE) for _ in range(2))
    rows = deferred_add_rms_norm(x, residual, torch.ones(256, dtype=torch.bfloat16, device=DEVICE), 1e-6)
    q8, s8 = quantize_int8(torch.randn(128, 256, generator=gen))
    with pytest.raises(ValueError, match="multiplied as words, by int4's GEMV on dp4a only"):
        deferred_matmul_slices(rows, q8.to(DEVICE), s8.to(DEVICE), "int8")


def test_the_readers_add_the_slices_in_slice_order():
    """Hand-made slices whose float32 sum depends on the order: (1 + 1e8) - 1e8 is 0 in slice order, 1 in any
    other. The norms and q/k norm + RoPE give what they give for torch's sum in slice order, to the bit. (The
    other sums are quarters below 64, exact in bf16: Triton's interpreter rounds float32 to bf16 toward zero.)"""
    from milestones.m01_naive_loop.model import RotaryEmbedding
    from milestones.m12_async_scheduling.fused_kernels import qk_norm_rope
    from milestones.m13_quantization.sliced_sums import SlicedSums, sliced_qk_norm_rope

    gen = torch.Generator().manual_seed(8)
    heads, kv_heads, dim, rows = 2, 1, 128, 2
    width = (heads + 2 * kv_heads) * dim
    parts = torch.randint(-64, 65, (3, rows, width), generator=gen) / 4
    parts[0, :, ::2], parts[1, :, ::2], parts[2, :, ::2] = 1.0, 1e8, -1e8  # half the outputs cancel to 0 in order
    parts = parts.to(DEVICE)
    in_order = ((parts[0] + parts[1]) + parts[2]).to(torch.bfloat16)
    assert in_order[:, ::2].eq(0).all() and ((parts[2] + parts[1]) + parts[0])[:, ::2].eq(1).all()
    sums = SlicedSums(parts, torch.bfloat16)
    residual = torch.randn(rows, 256, generator=gen).to(torch.bfloat16).to(DEVICE)
    weight = torch.rand(256, generator=gen).to(torch.bfloat16).to(DEVICE)
    for norm in (add_rms_norm_int16, deferred_add_rms_norm):
        streams, ours = residual.clone(), residual.clone()
        expected, got = norm(in_order[:, :256].contiguous(), streams, weight, 1e-6), norm(sums, ours, weight, 1e-6)
        assert torch.equal(ours, streams) and torch.equal(got.words, expected.words)
    norm_weight = torch.rand(heads + kv_heads, dim, generator=gen).to(torch.bfloat16).to(DEVICE)
    rope = RotaryEmbedding(dim, 64, 1e6).to(DEVICE, torch.bfloat16)
    rope_args = (heads, kv_heads, dim, norm_weight, rope.cos, rope.signed_sin, torch.tensor([4, 9], device=DEVICE),
                 1e-6)
    q, k = qk_norm_rope(in_order, *rope_args)
    got = sliced_qk_norm_rope(sums, *rope_args)
    v = in_order[:, (heads + kv_heads) * dim:].view(rows, 1, dim)
    assert all(torch.equal(a, b) for a, b in zip(got, (q, k, v)))


def test_the_norms_refuse_slices_they_cannot_add():
    """A norm adds float32 slices into a residual of their dtype; slices carrying a deferred 1 / rms are for q/k
    norm + RoPE only: each refused in one line."""
    from milestones.m13_quantization.sliced_sums import SlicedSums

    parts = torch.zeros(2, 1, 256, device=DEVICE)
    residual, weight = (torch.zeros(n, 256, dtype=torch.bfloat16, device=DEVICE) for n in (1, 1))
    bad = [SlicedSums(parts.half(), torch.bfloat16), SlicedSums(parts, torch.float16),
           SlicedSums(parts, torch.bfloat16, row_squares=torch.ones(1, 8, device=DEVICE), eps=1e-6, x_dim=1024)]
    for norm in (add_rms_norm_int16, deferred_add_rms_norm):
        for sums in bad:
            with pytest.raises(ValueError, match="no deferred 1 / rms"):
                norm(sums, residual.clone(), weight[0], 1e-6)


@pytest.mark.parametrize("split_k", [None, 2], ids=["whole-K", "2-slices"])
def test_gate_ups_gemv_multiplies_each_row_by_its_own_1_over_rms(split_k):
    """Three rows of very different size after the deferred norm: gate_up's GEMV (K whole, or in slices its
    finish adds) multiplies each row's sums by that row's 1 / rms, each row within x's rounding of float64."""
    gen = torch.Generator().manual_seed(9)
    rows, d = 3, 512
    x = (torch.randn(rows, d, generator=gen) * torch.tensor([[1.0], [30.0], [0.03]])).to(torch.bfloat16).to(DEVICE)
    residual = torch.zeros(rows, d, dtype=torch.bfloat16, device=DEVICE)
    weight = (torch.rand(d, generator=gen) + 0.5).to(torch.bfloat16).to(DEVICE)
    deferred = deferred_add_rms_norm(x, residual, weight, 1e-6)
    packed, scales = quantize_int4(torch.randn(2 * 256, d, generator=gen) * 0.05)
    h = residual.double()
    gate_up = (h * (h.pow(2).mean(dim=1, keepdim=True) + 1e-6).rsqrt() * weight.double()
               ) @ dequantize_int4(packed, scales).double().T.to(DEVICE)
    truth = torch.nn.functional.silu(gate_up[:, :256]) * gate_up[:, 256:]
    packed, scales = tile_int4(packed).to(DEVICE), group_major(scales).to(DEVICE)
    got = quantized_silu_and_mul(deferred, packed, scales, "int4", config=DP4A, split_k=split_k).double()
    errors = (got - truth).norm(dim=1) / truth.norm(dim=1)
    assert (errors < 3e-2).all(), errors.tolist()
