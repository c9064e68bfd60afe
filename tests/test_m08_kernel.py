"""m08's Triton kernels against plain torch: paged decode attention on every path, and the K/V store.

Without CUDA the kernels run in Triton's interpreter, at small sizes; with CUDA the same checks run compiled,
plus Qwen3-0.6B's shape at larger sizes, every sweep configuration, CUDA-graph capture and a check that the
wrapper never synchronises with the host. Every cache is NaN outside the slots the sequences own, and every
block table holds NaN blocks past each sequence's last block: a single stray read shows up as NaN.
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from decode_configs import SWEEP_CONFIGS  # noqa: E402
from milestones.m08_triton_kernel import paged_decode_kernel  # noqa: E402
from milestones.m08_triton_kernel.paged_decode_kernel import (  # noqa: E402
    DEFAULT_CONFIG, LAUNCH_TABLE, MAX_SPLITS, DecodeKernelConfig, choose_launch,
    choose_num_splits, paged_decode_attention, paged_decode_attention_reference)
from milestones.m08_triton_kernel.store_kv_kernel import store_kv  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
cuda_only = pytest.mark.skipif(not CUDA, reason="needs CUDA (compiled kernels at larger sizes)")


TOLERANCES = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}  # atol = rtol
DTYPES = list(TOLERANCES)
BLOCK = 16
EDGE_LENGTHS = (1, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 5, 333)  # one key, around a block, several, long


class PagedBatch:
    """Random q and a paged cache for sequences of the given lengths, laid out the way the engine's pool is.

    Physical blocks are a random permutation (tables are shuffled, not contiguous); the cache is NaN except the
    slots holding real keys; table entries past a sequence's last block name never-written (NaN) blocks.
    """

    def __init__(self, lengths, num_heads=4, num_kv_heads=2, head_dim=16, block_size=BLOCK, dtype=torch.float32,
                 seed=0, device=DEVICE, spare_blocks=3, extra_columns=2, lens_dtype=torch.int32,
                 table_dtype=torch.int32):
        gen = torch.Generator().manual_seed(seed)
        needed = [-(-n // block_size) for n in lengths]
        num_blocks = sum(needed) + spare_blocks
        order = torch.randperm(num_blocks, generator=gen).tolist()
        owned, self.garbage_blocks = order[: sum(needed)], order[sum(needed):]
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        k_cache = torch.full(shape, float("nan"))
        v_cache = torch.full(shape, float("nan"))
        width = max(needed, default=0) + extra_columns
        tables = torch.tensor([[self.garbage_blocks[(b + i) % spare_blocks] for i in range(width)]
                               for b in range(len(lengths))], dtype=torch.int32).view(len(lengths), width)
        for b, n in enumerate(lengths):
            for i in range(needed[b]):
                block = owned.pop()
                tables[b, i] = block
                used = min(block_size, n - i * block_size)
                k_cache[block, :used] = torch.randn(used, num_kv_heads, head_dim, generator=gen)
                v_cache[block, :used] = torch.randn(used, num_kv_heads, head_dim, generator=gen)
        self.q = torch.randn(len(lengths), num_heads, head_dim, generator=gen).to(device, dtype)
        self.k_cache, self.v_cache = k_cache.to(device, dtype), v_cache.to(device, dtype)
        self.block_tables = tables.to(device, table_dtype)
        self.context_lens = torch.tensor(lengths, dtype=lens_dtype).view(len(lengths)).to(device)
        self.scale = 1 / math.sqrt(head_dim)

    def args(self):
        return self.q, self.k_cache, self.v_cache, self.block_tables, self.context_lens, self.scale

    def run(self, **kwargs) -> torch.Tensor:
        return paged_decode_attention(*self.args(), **kwargs)

    def reference(self) -> torch.Tensor:
        return paged_decode_attention_reference(*self.args())


def assert_matches(out: torch.Tensor, batch: PagedBatch) -> None:
    assert out.dtype == batch.q.dtype and out.shape == batch.q.shape
    assert torch.isfinite(out).all(), "a NaN from an unused slot or block leaked into the output"
    tol = TOLERANCES[out.dtype]
    torch.testing.assert_close(out.float(), batch.reference().float(), atol=tol, rtol=tol)


# --------------------------------------------------------------------------- against the reference


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("num_heads, num_kv_heads", [(2, 2), (4, 2), (8, 2), (8, 1)], ids=lambda x: str(x))
def test_every_gqa_ratio(dtype, num_heads, num_kv_heads):
    """Group sizes 1, 2, 4, 8: the query heads of one K/V head are the rows of one program."""
    batch = PagedBatch(EDGE_LENGTHS, num_heads, num_kv_heads, dtype=dtype, seed=num_heads + num_kv_heads)
    assert_matches(batch.run(num_splits=1), batch)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_split_path_every_dtype(dtype):
    """Split-K: partial results per slice, then the combine kernel; short sequences leave slices empty."""
    batch = PagedBatch([1, BLOCK, BLOCK + 1, 333], dtype=dtype, seed=5)
    assert_matches(batch.run(num_splits=3), batch)


@pytest.mark.parametrize("length", EDGE_LENGTHS)
@pytest.mark.parametrize("num_splits", [1, 4])
def test_context_length_edges(length, num_splits):
    batch = PagedBatch([length], dtype=torch.float16, seed=length)
    assert_matches(batch.run(num_splits=num_splits), batch)


@pytest.mark.parametrize("size", [1, 3, 8])
def test_batch_sizes(size):
    rng = random.Random(size)
    lengths = [rng.randint(1, 200) for _ in range(size)]
    batch = PagedBatch(lengths, dtype=torch.bfloat16, seed=size)
    assert_matches(batch.run(), batch)  # the heuristic's choice of splits


@pytest.mark.parametrize("tile, block_size", [(16, 32), (32, 8), (64, 16), (16, 1)])
def test_tiles_smaller_and_larger_than_blocks(tile, block_size):
    """A tile spans several blocks, exactly one, or part of one: the per-key table lookup handles all three."""
    batch = PagedBatch([1, 7, 40], block_size=block_size, seed=tile + block_size)
    config = DecodeKernelConfig(tile_tokens=tile)
    assert_matches(batch.run(num_splits=1, config=config), batch)
    assert_matches(batch.run(num_splits=3, config=config), batch)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_dots_in_fp32_match(dtype):
    batch = PagedBatch([5, 70, 130], dtype=dtype, seed=3)
    assert_matches(batch.run(config=DecodeKernelConfig(dot_in_fp32=True), num_splits=2), batch)


@pytest.mark.parametrize("lens_dtype, table_dtype", [(torch.int64, torch.int64), (torch.int64, torch.int32),
                                                     (torch.int32, torch.int64)], ids=str)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_int64_lengths_and_tables(lens_dtype, table_dtype, num_splits):
    """The engine's metadata is int64: lengths and block ids of either width, on both paths. (The interpreter never
    type-checks the kernel; tests/compile_for_gpu.py compiles these variants, see test_kernels_compile_for_hopper.)"""
    batch = PagedBatch([1, 17, 70], seed=12, lens_dtype=lens_dtype, table_dtype=table_dtype)
    assert_matches(batch.run(num_splits=num_splits), batch)


def test_qwen3_shape_small():
    """16 query heads on 8 K/V heads of 128 dims, as Qwen3-0.6B (few keys, so the interpreter stays quick)."""
    batch = PagedBatch([3, 40], num_heads=16, num_kv_heads=8, head_dim=128, dtype=torch.bfloat16, seed=7)
    assert_matches(batch.run(num_splits=1), batch)


def test_strided_q_and_out():
    """q and out may be views (a slice of a packed batch) as long as head_dim is contiguous."""
    batch = PagedBatch([9, 33], seed=5)
    wide = torch.randn(2, 8, 16, device=DEVICE)
    batch.q = wide[:, ::2]  # stride 2 * head_dim between heads
    out_wide = torch.full((2, 8, 16), float("nan"), device=DEVICE)
    out = batch.run(out=out_wide[:, 1::2])
    assert_matches(out, batch)
    assert out_wide[:, ::2].isnan().all(), "wrote outside the out view"


# --------------------------------------------------------------------------- contract


@pytest.mark.parametrize("num_splits", [1, 3])
def test_out_is_written_fully_and_returned(num_splits):
    batch = PagedBatch([1, 20, 50], seed=11)
    out = torch.full_like(batch.q, float("nan"))
    result = batch.run(out=out, num_splits=num_splits)
    assert result is out
    assert_matches(out, batch)


def test_poisoned_blocks_are_really_there():
    """The NaN guard in every test is real: garbage table entries and unused slots hold NaN."""
    batch = PagedBatch([5, 17], seed=2)
    assert batch.k_cache[batch.block_tables[0, 1].long()].isnan().all()  # sequence 0 owns one block only
    assert batch.v_cache[batch.block_tables[1, 1].long(), 1:].isnan().all()  # 17 keys: slot 0 of block 1 used
    poisoned_view = batch.reference()
    assert torch.isfinite(poisoned_view).all()


@pytest.mark.parametrize("num_splits", [1, 2])
def test_zero_length_rows_read_nothing_and_give_zeros(num_splits):
    """A padding row (context length 0, e.g. in a captured CUDA graph) costs nothing and returns zeros."""
    batch = PagedBatch([30, 1, 12], seed=4)
    batch.context_lens[1] = 0
    out = batch.run(num_splits=num_splits)
    assert (out[1] == 0).all()
    assert_matches(out, batch)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_lengths_past_the_table_are_clamped(num_splits):
    """The kernel never reads past the table's last column, whatever context_lens says."""
    batch = PagedBatch([2 * BLOCK, 20], seed=6, extra_columns=0)  # 2 columns: 32 keys addressable
    batch.context_lens[0] = 1000
    out = batch.run(num_splits=num_splits)
    batch.context_lens[0] = 2 * BLOCK
    assert_matches(out, batch)


def test_empty_batch():
    batch = PagedBatch([4], seed=0)
    q = batch.q[:0]
    out = paged_decode_attention(q, batch.k_cache, batch.v_cache, batch.block_tables[:0], batch.context_lens[:0],
                                 batch.scale)
    assert out.shape == (0, 4, 16)


def test_choose_num_splits():
    sms = 132  # an H200; Qwen3-0.6B has 8 K/V heads
    assert choose_num_splits(64, 8, 2048, sms) == 1  # 512 programs already fill the GPU
    assert choose_num_splits(256, 8, 8192, sms) == 1
    assert choose_num_splits(16, 8, 2048, sms) == 3  # 128 programs x 3 = 384 <= 396 in one wave
    assert choose_num_splits(1, 8, 2048, sms) == 16  # capped: slices of 2 tiles of 64 keys
    assert choose_num_splits(1, 8, 8192, sms) == 49  # one wave of 396 programs
    assert choose_num_splits(1, 8, 10**6, sms, DecodeKernelConfig(programs_per_sm=100)) == MAX_SPLITS
    assert choose_num_splits(1, 8, 1, sms) == 1  # nothing to split
    for batch in range(1, 80):  # never more programs than one wave unless unsplit
        splits = choose_num_splits(batch, 8, 4096, sms)
        assert splits == 1 or batch * 8 * splits <= DEFAULT_CONFIG.programs_per_sm * sms


def test_choose_launch_takes_the_table_entry_of_the_regime():
    sms = 132
    assert choose_launch(64, 8, 2048, sms) == (LAUNCH_TABLE["direct"], 1)  # 512 programs fill the GPU
    assert choose_launch(1, 8, 2048, sms) == (LAUNCH_TABLE["split"], 16)
    assert choose_launch(1, 8, 16, sms) == (LAUNCH_TABLE["direct"], 1)  # one tile of keys: nothing to split
    table = {"direct": DecodeKernelConfig(tile_tokens=32), "split": DecodeKernelConfig(programs_per_sm=1)}
    assert choose_launch(16, 8, 2048, sms, table) == (table["direct"], 1)  # 128 programs x 1 per SM: one wave
    assert choose_launch(8, 8, 2048, sms, table) == (table["split"], 2)


def test_the_wrapper_launches_the_table_config_of_each_regime(monkeypatch):
    """config=None: the split path runs LAUNCH_TABLE["split"], the direct path LAUNCH_TABLE["direct"]."""
    launches = []
    kernel = paged_decode_kernel._paged_decode_kernel

    class Recorder:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches.append((grid, kwargs["TILE"], kwargs["num_stages"]))
                return kernel[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(paged_decode_kernel, "_paged_decode_kernel", Recorder())
    monkeypatch.setitem(LAUNCH_TABLE, "direct", DecodeKernelConfig(tile_tokens=16, num_stages=2))
    monkeypatch.setitem(LAUNCH_TABLE, "split", DecodeKernelConfig(tile_tokens=32, num_stages=3, programs_per_sm=4))
    batch = PagedBatch([5, 70, 130], seed=3)
    # 3 sequences x 2 K/V heads on the interpreter's 8 "SMs": 4 x 8 // 6 = 5 slices fit, 130 keys are worth 2
    assert_matches(batch.run(max_context_len=130), batch)
    assert_matches(batch.run(num_splits=1), batch)
    assert_matches(batch.run(num_splits=3), batch)
    assert_matches(batch.run(num_splits=3, config=DecodeKernelConfig(tile_tokens=64)), batch)  # a given config
    assert launches == [((3, 2, 2), 32, 3), ((3, 2, 1), 16, 2), ((3, 2, 3), 32, 3), ((3, 2, 3), 64, 3)]


def test_checks_still_run_for_every_new_layout():
    """The wrapper checks each layout once and remembers it: a new layout (bad or not) is checked again."""
    batch = PagedBatch([5, 9], seed=1)
    assert_matches(batch.run(), batch)
    with pytest.raises(ValueError):
        batch.run(out=torch.empty(2, 4, 16, device=DEVICE).half())
    with pytest.raises(ValueError):
        paged_decode_attention(batch.q, batch.k_cache, batch.v_cache, batch.block_tables.float(),
                               batch.context_lens, batch.scale)
    with pytest.raises(ValueError):
        batch.run(num_splits=0)  # per-call arguments are checked on every call
    assert_matches(batch.run(), batch)


def test_more_splits_than_tiles_are_harmless():
    batch = PagedBatch([3, 70], seed=8)
    assert_matches(batch.run(num_splits=9), batch)


# --------------------------------------------------------------------------- validation


def _bad_inputs():
    good = PagedBatch([5, 9], seed=1)
    q, k, v, tables, lens, scale = good.args()
    yield "q rank", (q[:, None], k, v, tables, lens, scale), {}
    yield "v shape", (q, k, v[:, :8], tables, lens, scale), {}
    yield "dtype mismatch", (q.half(), k, v, tables, lens, scale), {}
    yield "int dtype", (q.long(), k.long(), v.long(), tables, lens, scale), {}
    yield "heads not a multiple", (torch.randn(2, 3, 16, device=DEVICE), k, v, tables, lens, scale), {}
    yield "head_dim 12", (q[..., :12], k[..., :12], v[..., :12], tables, lens, scale), {}
    yield "table dtype", (q, k, v, tables.float(), lens, scale), {}
    yield "table rows", (q, k, v, tables[:1], lens, scale), {}
    yield "lens shape", (q, k, v, tables, lens[:1], scale), {}
    yield "out shape", (q, k, v, tables, lens, scale), {"out": torch.empty(2, 4, 8, device=DEVICE)}
    yield "out dtype", (q, k, v, tables, lens, scale), {"out": torch.empty(2, 4, 16, device=DEVICE).half()}
    yield "num_splits 0", (q, k, v, tables, lens, scale), {"num_splits": 0}
    yield "num_splits too many", (q, k, v, tables, lens, scale), {"num_splits": MAX_SPLITS + 1}
    if CUDA:
        yield "mixed devices", (q.cpu(), k, v, tables, lens, scale), {}


@pytest.mark.parametrize("args, kwargs", [pytest.param(a, k, id=name) for name, a, k in _bad_inputs()])
def test_bad_inputs_raise_value_error(args, kwargs):
    with pytest.raises(ValueError):
        paged_decode_attention(*args, **kwargs)


@pytest.mark.parametrize("kwargs", [{"tile_tokens": 8}, {"tile_tokens": 48}, {"num_warps": 3},
                                    {"num_stages": 0}, {"programs_per_sm": 0}])
def test_bad_config_raises_value_error(kwargs):
    with pytest.raises(ValueError):
        DecodeKernelConfig(**kwargs)


# --------------------------------------------------------------------------- the K/V store


@pytest.mark.parametrize("dtype, slot_dtype", [(torch.float32, torch.int64), (torch.float16, torch.int32),
                                               (torch.bfloat16, torch.int64)], ids=str)
def test_store_kv_writes_the_mapped_slots_only(dtype, slot_dtype):
    num_blocks, block_size, kv_heads, head_dim = 6, 4, 2, 16
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, device=DEVICE).to(dtype)
    v_cache = torch.randn_like(k_cache)
    k_before, v_before = k_cache.clone(), v_cache.clone()
    k = torch.randn(5, kv_heads, head_dim, device=DEVICE).to(dtype)
    v = torch.randn_like(k)
    slots = torch.tensor([13, -1, 0, 23, 5], dtype=slot_dtype, device=DEVICE)  # -1: a padding token
    store_kv(k, v, k_cache, v_cache, slots)
    expected_k, expected_v = k_before.view(-1, kv_heads, head_dim), v_before.view(-1, kv_heads, head_dim)
    keep = slots >= 0
    expected_k[slots[keep].long()] = k[keep]
    expected_v[slots[keep].long()] = v[keep]
    assert torch.equal(k_cache.view(-1, kv_heads, head_dim), expected_k)
    assert torch.equal(v_cache.view(-1, kv_heads, head_dim), expected_v)


def test_store_kv_then_attention_sees_the_new_token():
    """The engine's order: store the step's K/V at its slot, then attend with context_lens including it."""
    batch = PagedBatch([8, 16], seed=9)
    new_k = torch.randn(2, 2, 16, device=DEVICE)
    new_v = torch.randn(2, 2, 16, device=DEVICE)
    slots = torch.stack([batch.block_tables[0, 0] * BLOCK + 8, batch.block_tables[1, 1] * BLOCK + 0])
    store_kv(new_k, new_v, batch.k_cache, batch.v_cache, slots)
    batch.context_lens += 1
    assert_matches(batch.run(), batch)


def test_store_kv_rejects_bad_inputs():
    cache = torch.zeros(4, 4, 2, 16, device=DEVICE)
    k = torch.zeros(3, 2, 16, device=DEVICE)
    slots = torch.zeros(3, dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError):
        store_kv(k, k, cache, cache, slots[:2])  # one slot per token
    with pytest.raises(ValueError):
        store_kv(k.half(), k.half(), cache, cache, slots)  # dtype mismatch
    with pytest.raises(ValueError):
        store_kv(k[:, :1], k[:, :1], cache, cache, slots)  # kv_heads mismatch
    with pytest.raises(ValueError):
        store_kv(k, k, cache.transpose(0, 1), cache.transpose(0, 1), slots)  # not viewable as slots: a copy


# --------------------------------------------------------------------------- the microbenchmark


def test_kernel_bench_smoke(tmp_path):
    """benchmarks/kernel_bench.py end to end at tiny sizes; its JSON is complete."""
    from benchmarks import kernel_bench

    out = tmp_path / "kernel_bench.json"
    args = ["--batch", "1,2", "--context", "17", "--num-heads", "4", "--num-kv-heads", "2", "--head-dim", "16",
            "--rep-ms", "1", "--copy-mib", "1", "--out", str(out)]
    if not CUDA:
        args += ["--device", "cpu"]
    kernel_bench.main(args)
    result = json.loads(out.read_text())
    assert result["name"] == "kernel_bench" and result["ok"] is True
    assert {"gpu_slug", "torch", "triton", "git_commit"} <= result["env"].keys()
    assert result["copy_bandwidth_gbs"] > 0 and result["shape"]["num_kv_heads"] == 2
    assert {"judged_on", "gpu", "why"} <= result["timing"].keys()
    assert result["launch_table"]["direct"]["tile_tokens"] == LAUNCH_TABLE["direct"].tile_tokens
    assert [(c["batch"], c["context"]) for c in result["cases"]] == [(1, 17), (2, 17)]
    for case in result["cases"]:
        assert {"triton_ms", "gather_ms", "speedup", "triton_gbs", "copy_fraction", "max_abs_diff", "num_splits",
                "regime", "config_name", "kv_bytes"} <= case.keys()
        assert case["copies"] >= 2  # calls rotate over copies of the K/V
        assert case["kv_bytes"] == 2 * case["batch"] * 17 * 2 * 16 * 2  # K and V, bf16
        assert case["max_abs_diff"] <= kernel_bench.BF16_TOLERANCE


def test_kernel_bench_rejects_bad_arguments(tmp_path):
    from benchmarks import kernel_bench

    with pytest.raises(SystemExit):
        kernel_bench.main(["--batch", "0"])
    if not CUDA:  # --device cuda without a GPU: one error line, nothing written
        out = tmp_path / "kernel_bench.json"
        with pytest.raises(SystemExit, match="^error: "):
            kernel_bench.main(["--device", "cuda", "--batch", "1", "--context", "1", "--out", str(out)])
        assert not out.exists()


# --------------------------------------------------------------------------- CUDA: compiled, larger


@cuda_only
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("size", [1, 7, 64])
def test_cuda_qwen3_shape(dtype, size):
    rng = random.Random(size)
    lengths = [rng.randint(1, 4096) for _ in range(size)]
    batch = PagedBatch(lengths, num_heads=16, num_kv_heads=8, head_dim=128, dtype=dtype, seed=size)
    assert_matches(batch.run(), batch)
    assert_matches(batch.run(num_splits=1), batch)
    assert_matches(batch.run(num_splits=7), batch)


@cuda_only
@pytest.mark.parametrize("name", list(SWEEP_CONFIGS))
def test_cuda_every_sweep_config(name):
    config = SWEEP_CONFIGS[name]
    batch = PagedBatch([1, 300, 2048, 17], num_heads=16, num_kv_heads=8, head_dim=128, dtype=torch.bfloat16,
                       seed=1)
    assert_matches(batch.run(config=config), batch)
    assert_matches(batch.run(config=config, num_splits=5), batch)


@cuda_only
def test_cuda_no_host_synchronisation():
    batch = PagedBatch([100, 900], num_heads=16, num_kv_heads=8, head_dim=128, dtype=torch.bfloat16)
    batch.run(num_splits=4)  # compile first
    batch.run(num_splits=1)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        batch.run()
        batch.run(num_splits=4, max_context_len=1024)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@cuda_only
@pytest.mark.parametrize("num_splits", [None, 1, 4])
def test_cuda_graph_replay_follows_new_lengths_and_tables(num_splits):
    """Captured once, replayed after lengths and tables changed in place: the kernel reads them on the device."""
    batch = PagedBatch([700, 700, 700], num_heads=16, num_kv_heads=8, head_dim=128, dtype=torch.bfloat16, seed=2)
    batch.context_lens.copy_(torch.tensor([50, 700, 5]))
    out = torch.empty_like(batch.q)
    width = batch.block_tables.shape[1]

    def step():
        paged_decode_attention(*batch.args(), max_context_len=width * BLOCK, num_splits=num_splits, out=out)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    graph.replay()
    torch.cuda.synchronize()
    assert_matches(out, batch)

    batch.context_lens.copy_(torch.tensor([700, 3, 64]))
    batch.block_tables.copy_(batch.block_tables[[1, 2, 0]].clone())  # other sequences' blocks
    batch.q.copy_(torch.randn_like(batch.q))
    graph.replay()
    torch.cuda.synchronize()
    assert_matches(out, batch)


# --------------------------------------------------------------------------- compiled for the GPU, on any machine


@pytest.mark.slow
def test_kernels_compile_for_hopper():
    """Triton's compiler, not its interpreter, on every launch of the wrappers: direct and split paths, each dtype,
    int32 and int64 lengths and tables, compiled for sm_90 (the H200) through to a cubin, with no GPU. The
    interpreter runs kernels as numpy code and never type-checks them (it let an int64 length through that the
    compiler rejects); tests/compile_for_gpu.py runs in its own process because Triton picks one mode at import."""
    script = Path(__file__).with_name("compile_for_gpu.py")
    result = subprocess.run([sys.executable, str(script), "--json"], cwd=script.parents[1], capture_output=True,
                            text=True, timeout=900)
    if result.returncode == 77:
        pytest.skip(result.stdout.strip())
    assert result.stdout.strip(), result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    failures = [f"{r['variant']}: {r['error']}" for r in report["results"] if not r["ok"]]
    assert not failures, "\n\n".join(failures)
    assert report["target"] == "cuda:90" and result.returncode == 0
    compiled = {r["variant"]: r["kernels"] for r in report["results"]}
    for dtype in ("float32", "float16", "bfloat16"):
        for index in ("int32", "int64"):
            direct = compiled[f"decode direct {dtype} lens/tables {index}"]
            split = compiled[f"decode split {dtype} lens/tables {index}"]
            assert [k["name"] for k in direct] == ["_paged_decode_kernel"]
            assert [k["name"] for k in split] == ["_paged_decode_kernel", "_combine_splits_kernel"]
            assert all("ttgir" in k["stages"] and "ptx" in k["stages"] for k in direct + split)
    assert any(name.startswith("store_kv") for name in compiled)


# --------------------------------------------------------------------------- interpreted at launch


CPU_KERNELS_IN_A_FRESH_PROCESS = """
import os, transformers, triton, torch  # triton imported first, and without TRITON_INTERPRET
assert "TRITON_INTERPRET" not in os.environ
from milestones.m08_triton_kernel.paged_decode_kernel import paged_decode_attention, paged_decode_attention_reference
from milestones.m08_triton_kernel.store_kv_kernel import store_kv
k = torch.randn(40, 2, 16)
cache_k, cache_v = torch.zeros(4, 16, 2, 16), torch.zeros(4, 16, 2, 16)
store_kv(k, -k, cache_k, cache_v, torch.arange(40))
tables, lens, q = torch.tensor([[2, 0, 1], [1, 3, 0]]), torch.tensor([40, 17]), torch.randn(2, 4, 16)
for splits in (1, 2):
    out = paged_decode_attention(q, cache_k, cache_v, tables, lens, 0.25, num_splits=splits)
    torch.testing.assert_close(out, paged_decode_attention_reference(q, cache_k, cache_v, tables, lens, 0.25))
print("ok")
"""


def test_cpu_tensors_run_interpreted_whatever_imported_triton_first():
    """The interpreter is chosen at each launch, by the tensors' device: a process that imported triton (through
    transformers) with no TRITON_INTERPRET, as every process on a machine with CUDA does, runs CPU tensors
    through it too, Triton's own helpers (tl.max, tl.sum) included."""
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", CPU_KERNELS_IN_A_FRESH_PROCESS], cwd=root, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stdout[-2000:] + result.stderr[-4000:]
