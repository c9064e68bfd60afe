"""m13's q/k norm + RoPE writing K/V into the paged cache (``kv_at_rope.py``) instead of m08's store launch, and
done inside the decode kernel's programs (``rope_in_decode.py``) instead of a kernel of its own.

The checks: the kernel leaves the cache as RoPE then ``store_kv`` leave it, to the bit, in the model's dtype and
in FP8, and a padding row (slot -1) writes nothing; the decode kernel that makes q itself leaves the same cache and
gives the same heads as RoPE then m08's decode, split or not, where the new key is a split's last or a sequence's
only key; the decoder of a decode graph launches neither the store nor (by default) RoPE's kernel and gives the
same output and the same cache as with both; bad caches and slices are refused with a clear error.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from milestones.m08_triton_kernel.store_kv_kernel import store_kv  # noqa: E402
from milestones.m13_quantization.epilogue_matmuls import quantized_matmul_slices  # noqa: E402
from milestones.m13_quantization.kv_at_rope import CacheSlots  # noqa: E402
from milestones.m13_quantization.quantize import group_major, quantize_int4, tile_int4  # noqa: E402
from milestones.m13_quantization.sliced_sums import sliced_qk_norm_rope  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
HEADS, KV_HEADS, DIM = 4, 2, 64


def rope_case(tokens: int):
    """q/k/v's slices for ``tokens`` rows of x, and what q/k norm + RoPE needs besides."""
    from milestones.m01_naive_loop.model import RotaryEmbedding

    gen = torch.Generator().manual_seed(5)
    packed, scales = quantize_int4(torch.randn((HEADS + 2 * KV_HEADS) * DIM, 512, generator=gen) * 0.05)
    packed, scales = tile_int4(packed).to(DEVICE), group_major(scales).to(DEVICE)
    x = torch.randn(tokens, 512, generator=gen).to(torch.bfloat16).to(DEVICE)
    sums = quantized_matmul_slices(x, packed, scales, "int4")
    norm_weight = torch.rand(HEADS + KV_HEADS, DIM, generator=gen).to(torch.bfloat16).to(DEVICE)
    rope = RotaryEmbedding(DIM, 64, 1e6).to(DEVICE, torch.bfloat16)
    positions = torch.tensor([3, 17, 40][:tokens], device=DEVICE)
    return sums, (HEADS, KV_HEADS, DIM, norm_weight, rope.cos, rope.signed_sin, positions, 1e-6)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16-cache", "fp8-cache"])
def test_rope_leaves_the_cache_as_the_store_after_it_does(fp8):
    """Three tokens, one of them a graph's padding row (slot -1), another at slot 0: the caches RoPE writes are
    those m08's store writes after m12's RoPE, byte for byte, and nothing else changes, before the first slot
    either (the caches are views one slot into a larger buffer)."""
    sums, rope_args = rope_case(3)
    dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    gen = torch.Generator().manual_seed(6)
    before = [torch.randn(65, KV_HEADS, DIM, generator=gen).to(dtype).to(DEVICE) for _ in range(2)]  # K, V
    buffers = {name: [t.clone() for t in before] for name in ("store", "rope")}
    caches = {name: tuple(t[1:].view(4, 16, KV_HEADS, DIM) for t in bufs) for name, bufs in buffers.items()}
    slots = torch.tensor([37, -1, 0], device=DEVICE)
    scales = {"k_scale": torch.tensor([0.01], device=DEVICE), "v_scale": torch.tensor([0.004], device=DEVICE)}
    scales = scales if fp8 else {}
    q, k, v = sliced_qk_norm_rope(sums, *rope_args)
    store_kv(k, v, *caches["store"], slots, **scales)
    got = sliced_qk_norm_rope(sums, *rope_args, cache=CacheSlots(*caches["rope"], slots, **scales))
    assert got[1] is None and got[2] is None and torch.equal(got[0], q)
    written = [1 + 37, 1 + 0]  # buffer rows: one before the cache's first slot
    untouched = torch.ones(65, dtype=torch.bool, device=DEVICE)
    untouched[written] = False
    for stored, wrote, cached in zip(buffers["store"], buffers["rope"], before):
        stored, wrote, cached = (t.view(65, -1).view(torch.uint8) for t in (stored, wrote, cached))
        assert torch.equal(wrote, stored)
        assert torch.equal(wrote[untouched], cached[untouched])  # the padding row's too, and the row before
        assert not torch.equal(wrote[written], cached[written])


def test_rope_refuses_a_cache_it_cannot_write():
    """A cache of another dtype, an FP8 cache without scales, a slot_mapping of the wrong length, caches whose rows
    are not (kv_heads, head_dim): each refused with one clear line."""
    sums, rope_args = rope_case(2)
    cache = torch.zeros(64, KV_HEADS, DIM, dtype=torch.bfloat16, device=DEVICE)
    slots = torch.tensor([1, 2], device=DEVICE)
    bad = {
        "must hold": CacheSlots(cache.float(), cache.float(), slots),
        "go with a float8": CacheSlots(cache.to(torch.float8_e4m3fn), cache.to(torch.float8_e4m3fn), slots),
        "slot_mapping must be": CacheSlots(cache, cache, slots[:1]),
        "must end in": CacheSlots(cache.view(64, 1, KV_HEADS * DIM), cache.view(64, 1, KV_HEADS * DIM), slots),
    }
    for message, slots_given in bad.items():
        with pytest.raises(ValueError, match=message):
            sliced_qk_norm_rope(sums, *rope_args, cache=slots_given)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16-cache", "fp8-cache"])
def test_the_decode_graphs_decoder_launches_no_store(fp8, monkeypatch):
    """The decoder of m13's decode graphs at two rows (the second a graph's padding row: slot -1, no keys), int4
    on dp4a (q/k/v leaves its slices after the deferred norm), over a real paged cache, bf16 or FP8 with scales
    of its own: with RoPE inside the decode kernel (the default) neither RoPE's kernel nor a store is launched,
    with RoPE writing K/V no store, and the output and both caches are the same to the bit as with both kernels
    (here a group of 2 heads sums its squares as one head does). An attention that is not a decode graph's (a
    plain function) gets k and v as in m12."""
    from milestones.m01_naive_loop.loader import build_model, init_random_, preset_config
    from milestones.m05_paged_blocks.paged_attention import PagedKVCache
    from milestones.m08_triton_kernel import store_kv_kernel
    from milestones.m10_cuda_graphs.graph_runner import GraphDecodeAttention
    from milestones.m13_quantization import epilogue_layers
    from milestones.m13_quantization.epilogue_layers import EpilogueCausalLM
    from milestones.m13_quantization.fp8_kv_cache import FP8PagedKVCache
    from milestones.m13_quantization.quantized_loader import quantize_model_

    config = preset_config("tiny")
    config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads = 2, 2, 1
    config.hidden_size, config.head_dim = 256, 128
    model = build_model(config, DEVICE, torch.bfloat16)
    init_random_(model, 0, std=config.initializer_range)
    decoder = EpilogueCausalLM(quantize_model_(model, "int4", "triton"))
    stores, store = [], store_kv_kernel.store_kv
    monkeypatch.setattr(store_kv_kernel, "store_kv", lambda *args, **kw: stores.append(1) or store(*args, **kw))
    ropes, rope = [], epilogue_layers.sliced_qk_norm_rope
    monkeypatch.setattr(epilogue_layers, "sliced_qk_norm_rope", lambda *a, **kw: ropes.append(1) or rope(*a, **kw))
    results = {}
    for run, at_rope, in_decode in (("in decode", True, True), ("rope", True, False), ("store", False, False),
                                    ("plain function", True, True)):
        monkeypatch.setattr(epilogue_layers, "ROPE_STORES_KV", at_rope)
        monkeypatch.setattr(epilogue_layers, "ROPE_IN_DECODE", in_decode)
        cache = (FP8PagedKVCache if fp8 else PagedKVCache)(2, 4, 16, 1, 128, torch.bfloat16, DEVICE)
        if fp8:
            cache.k_scale.copy_(torch.tensor([0.02, 0.03]))
            cache.v_scale.copy_(torch.tensor([0.01, 0.005]))
        gen = torch.Generator().manual_seed(1)  # 40 keys already cached, the new one goes to slot 40
        for filled in (cache.k, cache.v):
            filled.copy_(torch.randn(filled.shape, generator=gen).to(filled.dtype))
        before = cache.k.clone()
        graph = GraphDecodeAttention(cache, torch.tensor([40, -1], device=DEVICE),
                                     torch.tensor([[2, 0, 3, 1], [0, 0, 0, 0]], dtype=torch.int32, device=DEVICE),
                                     torch.tensor([41, 0], dtype=torch.int32, device=DEVICE), 4096)
        attention = (lambda *args: graph(*args)) if run == "plain function" else graph
        stores.clear()
        ropes.clear()
        with torch.no_grad():
            out = decoder(torch.tensor([5, 9], device=DEVICE), torch.tensor([40, 0], device=DEVICE), attention)
        results[run] = out, cache.k.clone(), cache.v.clone(), (len(stores), len(ropes)), before
    # a store a layer, or none; RoPE's kernel a layer, or none (in the decode kernel)
    launches = {run: results[run][3] for run in results}
    assert launches == {"in decode": (0, 0), "rope": (0, 2), "store": (2, 2), "plain function": (2, 2)}
    for run in ("rope", "store", "plain function"):
        assert all(torch.equal(a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a,
                               b.view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b)
                   for a, b in zip(results["in decode"][:3], results[run][:3]))
    k_after, k_before = (t.view(torch.uint8) for t in (results["in decode"][1], results["in decode"][4]))
    assert not torch.equal(k_after[:, 40], k_before[:, 40])  # slot 40 was written


def _decode_case(fp8: bool, max_context_len: int):
    """A graph's attention over one layer of a paged cache (bf16, or FP8 with scales) for three rows: a sequence of
    200 keys, one whose only key is the new one (its output is that token's V), and a padding row (no keys, slot -1);
    the new keys' slots are where the block tables put key ``n - 1``, and hold NaN until the step writes them: a
    key read before its store shows on a GPU, when that race happens (the interpreter runs programs in turn)."""
    from milestones.m05_paged_blocks.paged_attention import PagedKVCache
    from milestones.m10_cuda_graphs.graph_runner import GraphDecodeAttention
    from milestones.m13_quantization.fp8_kv_cache import FP8PagedKVCache

    cache = (FP8PagedKVCache if fp8 else PagedKVCache)(1, 16, 16, KV_HEADS, DIM, torch.bfloat16, DEVICE)
    if fp8:
        cache.k_scale.fill_(0.02)
        cache.v_scale.fill_(0.01)
    gen = torch.Generator().manual_seed(7)
    for filled in (cache.k, cache.v):
        filled.copy_(torch.randn(filled.shape, generator=gen).to(filled.dtype))
    tables = torch.zeros((3, 16), dtype=torch.int32)
    tables[0, :13] = torch.randperm(16, generator=gen)[:13].to(torch.int32)
    tables[1, 0] = int(torch.arange(16)[~torch.isin(torch.arange(16), tables[0, :13].long())][0])
    lengths = torch.tensor([200, 1, 0], dtype=torch.int32)
    slots = torch.tensor([int(tables[0, 199 // 16]) * 16 + 199 % 16, int(tables[1, 0]) * 16, -1])
    for filled in (cache.k, cache.v):  # the new keys' slots hold NaN until the step writes them
        filled[0, slots[:2].to(DEVICE)] = torch.tensor(float("nan")).to(filled.dtype).to(DEVICE)
    return GraphDecodeAttention(cache, slots.to(DEVICE), tables.to(DEVICE), lengths.to(DEVICE), max_context_len)


@pytest.mark.parametrize("max_context_len", [64, 4096], ids=["direct", "split"])
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16-cache", "fp8-cache"])
def test_rope_in_decode_is_rope_then_decode(fp8, max_context_len):
    """One launch (``rope_in_decode.py``) against q/k norm + RoPE writing K/V, then m08's decode: the caches the same
    to the bit, and the heads the same to a rounding (q's norms are summed over rows of heads here, which may
    round q's last bit otherwise). Split (4,096 keys assumed: 6 slices of 64 keys a program), the 200th key is the
    fourth slice's and the last two slices are empty; direct, each row is one program."""
    from milestones.m13_quantization.rope_in_decode import rope_decode_attention

    sums, rope_args = rope_case(3)
    two_launches, one_launch = _decode_case(fp8, max_context_len), _decode_case(fp8, max_context_len)
    cache = two_launches.cache
    slots = CacheSlots(cache.k[0], cache.v[0], two_launches.slot_mapping, **cache.kernel_scales(0))
    q, _, _ = sliced_qk_norm_rope(sums, *rope_args, cache=slots)
    expected = two_launches.decode_stored(0, q)
    got = rope_decode_attention(one_launch, 0, sums, *rope_args)
    for stored, wrote in ((two_launches.cache.k, one_launch.cache.k), (two_launches.cache.v, one_launch.cache.v)):
        assert torch.equal(wrote.view(torch.uint8), stored.view(torch.uint8))
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-3)
    assert torch.equal(got[2], torch.zeros_like(got[2]))  # the padding row reads nothing
    if DEVICE.type == "cpu":  # the interpreter sums a row of heads as it sums one head: to the bit
        assert torch.equal(got, expected)


def test_rope_in_decode_refuses_slices_too_narrow():
    from milestones.m13_quantization.rope_in_decode import rope_decode_attention

    sums, rope_args = rope_case(3)
    narrow = type(sums)(sums.parts[..., : -DIM], sums.dtype)
    with pytest.raises(ValueError, match="must hold"):
        rope_decode_attention(_decode_case(False, 64), 0, narrow, *rope_args)
