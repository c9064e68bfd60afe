"""m14: one model split across two ranks (gloo on the CPU, the worker spawned by the engine inside the test).

What the split must preserve is exact: transformers' greedy tokens on the tied, untied and a GQA-4 test model,
under batching, chunking, prefix hits, preemption and async scheduling, with every rank's K/V pool poisoned.
What it must hold: each rank only its slices (checked against the checkpoint), a random preset's TP=2 shards
exactly TP=1's weights. What it must not do: leave a process behind (closed, collected, or after a worker was
killed mid-generate), or change anything at ``tensor_parallel_size=1``.
"""

from __future__ import annotations

import gc
import os
import pickle
import signal
import subprocess
import sys
import time
import types
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file
from transformers import Qwen3ForCausalLM

from conftest import env_with_checkout, greedy_reference, random_prompts, randomize_norm_weights, tiny_hf_config
from milestones.m14_tensor_parallel import EngineConfig, LLMEngine, TensorParallelError
from milestones.m14_tensor_parallel.parallel_layers import RowParallelLinear
from milestones.m14_tensor_parallel.parallel_state import rank_devices
from paged_helpers import CHATS, assert_blocks_all_free, generate_exactly, greedy, make_engine, reference
from tensor_parallel_helpers import GraphsWithoutCapture, graph_steps, held_weights, poison_pool

PREVIOUS = "m13_quantization"
TP2 = dict(tensor_parallel_size=2, distributed_timeout_s=120.0)
KNOBS = dict(max_num_seqs=4, block_size=4, max_num_batched_tokens=10, kv_cache_tokens=56)
PROMPTS = random_prompts(5, 2, 24, seed=141)


def children_of(pid: int) -> list[int]:
    """Live child processes of ``pid`` (Linux: from /proc), multiprocessing's resource tracker left out."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z" and b"resource_tracker" not in command:
            found.append(int(entry.name))
    return found


def is_gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def tokens(outputs) -> list[list[int]]:
    return [o.token_ids for o in outputs]


@pytest.fixture(scope="module")
def gqa4_checkpoint(tmp_path_factory):
    """8 query heads sharing 2 K/V heads (a GQA ratio of 4): 4 heads and 1 K/V head per rank at TP=2; q's width
    (8 x 16) is not the hidden size (64), so o_proj is not square."""
    directory = tmp_path_factory.mktemp("gqa4")
    config = tiny_hf_config()
    config.num_attention_heads, config.num_key_value_heads = 8, 2
    torch.manual_seed(4)
    model = Qwen3ForCausalLM(config).eval()
    randomize_norm_weights(model, 4)
    model.save_pretrained(directory)
    greedy_reference(model, PROMPTS, 9)  # refuses a degenerate reference (see conftest)
    return directory, model


# --------------------------------------------------------------------------- exact tokens


def test_tokens_equal_transformers_under_chunking_prefix_hits_and_preemption(tiny_checkpoint, tokenizer_cache):
    """Async scheduling on, every rank's pool poisoned; then each rank's slices; then ``close`` leaves nothing."""
    directory, model = tiny_checkpoint
    before = set(children_of(os.getpid()))
    engine = make_engine("m14_tensor_parallel", directory, **TP2, **KNOBS)
    try:
        workers = engine.workers.pids
        assert set(workers) <= set(children_of(os.getpid())) and engine.config.async_scheduling
        engine.collective_rpc(poison_pool)  # every rank's pool: a slot read before it was written shows everywhere
        outputs, recorder = generate_exactly(engine, model, CHATS, [12, 12, 10, 12])
        assert engine.stats.num_preemptions >= 1 and engine.stats.prefix_cache_hit_tokens >= 24
        assert any(n > 1 and len(step.scheduled) > 1 for step in recorder.steps for *_, n in step.scheduled)
        assert_blocks_all_free(engine)
        check_slices(engine, directory)
    finally:
        engine.close()
    engine.close()  # idempotent
    assert all(map(is_gone, workers)) and set(children_of(os.getpid())) <= before and not dist.is_initialized()
    with pytest.raises(TensorParallelError, match="closed"):
        engine.generate(CHATS[:1], greedy(2), use_tqdm=False)


def check_slices(engine, directory) -> None:
    """Each rank holds its contiguous half of q/k/v, gate/up (rows) and o/down (columns), the whole norms and
    embedding; the LM head only on rank 0 (tied: the embedding itself)."""
    checkpoint = load_file(str(directory / "model.safetensors"))
    ranks = engine.collective_rpc(held_weights)
    layer = "model.layers.1."

    def halves(name: str, dim: int) -> list[torch.Tensor]:
        return list(checkpoint[layer + name].chunk(2, dim=dim))

    for rank, held in enumerate(ranks):
        qkv = [halves(f"self_attn.{p}_proj.weight", 0)[rank] for p in "qkv"]
        assert torch.equal(held[layer + "self_attn.qkv_proj.weight"], torch.cat(qkv))
        assert torch.equal(held[layer + "self_attn.o_proj.weight"], halves("self_attn.o_proj.weight", 1)[rank])
        gate_up = [halves(f"mlp.{p}_proj.weight", 0)[rank] for p in ("gate", "up")]
        assert torch.equal(held[layer + "mlp.gate_up_proj.weight"], torch.cat(gate_up))
        assert torch.equal(held[layer + "mlp.down_proj.weight"], halves("mlp.down_proj.weight", 1)[rank])
        assert torch.equal(held["model.norm.weight"], checkpoint["model.norm.weight"])
        assert held["model.embed_tokens.weight"] == checkpoint["model.embed_tokens.weight"].double().sum()
        assert ("lm_head.weight" in held) == (rank == 0 and "lm_head.weight" in checkpoint)


def test_a_gqa_ratio_of_four_then_a_worker_killed_mid_generate(gqa4_checkpoint, tokenizer_cache):
    """Exact tokens with 4 query heads per K/V head; then the worker is killed before a step of the next
    ``generate``: it raises at once, naming the dead rank, leaves no process and refuses every later call."""
    directory, model = gqa4_checkpoint
    engine = make_engine("m14_tensor_parallel", directory, **TP2, max_num_seqs=3, block_size=4,
                         max_num_batched_tokens=16, kv_cache_tokens=256)
    assert engine.model_config.num_attention_heads == 4 and engine.kv_pool.k.shape[-2] == 1  # per rank
    engine.collective_rpc(poison_pool)
    generate_exactly(engine, model, PROMPTS, [6, 9, 3, 7, 5])
    only_here = types.ModuleType("only_in_rank_0")  # a call a worker cannot import: refused, the group goes on
    exec("def count_layers(engine):\n    return len(engine.model.model.layers)", only_here.__dict__)
    sys.modules["only_in_rank_0"] = only_here
    try:
        with pytest.raises(RuntimeError, match="rank 1: RuntimeError: the call could not be unpickled here"):
            engine.collective_rpc(only_here.count_layers)
    finally:
        del sys.modules["only_in_rank_0"]
    with pytest.raises(AttributeError):  # a lambda cannot be pickled: refused before the workers hear of it
        engine.collective_rpc(lambda engine: 1)
    assert engine.collective_rpc("describe_kv_cache")[1] == engine.describe_kv_cache()

    worker, original, calls = engine.workers.processes[0], engine.forward, []

    def forward(host):  # the third step: the worker is gone before rank 0 sends it
        calls.append(host)
        if len(calls) == 3:
            os.kill(worker.pid, signal.SIGKILL)
            worker.join(60)
        return original(host)

    engine.forward = forward
    with pytest.raises(TensorParallelError, match=rf"rank 1 \(pid {worker.pid}\) was killed by SIGKILL"):
        engine.generate(PROMPTS, greedy(8), use_tqdm=False)
    assert is_gone(worker.pid) and not dist.is_initialized()
    assert not engine.has_unfinished()  # generate gave its requests back
    with pytest.raises(TensorParallelError, match="killed by SIGKILL"):  # at once, and every time after
        engine.generate(PROMPTS[:1], greedy(2), use_tqdm=False)
    engine.close()


# --------------------------------------------------------------------------- random presets, TP=1


def test_a_random_presets_shards_are_tp1s_weights_and_collection_stops_the_workers(tokenizer_cache):
    """Each rank draws m01's random tensors whole, in m01's order, and keeps its slice: TP=2 holds exactly TP=1's
    weights, so the two compute the same function (here with m13's FP8 K/V cache: each rank stores its own K/V
    heads in float8). Dropping the engine (no close) stops its worker."""
    knobs = dict(model="tiny", device="cpu", max_num_seqs=2, kv_cache_tokens=64, enable_prefix_caching=False,
                 kv_cache_dtype="fp8")
    single = LLMEngine(EngineConfig(**knobs))
    engine = LLMEngine(EngineConfig(**knobs, **TP2))
    whole, ranks = held_weights(single), engine.collective_rpc(held_weights)
    config = single.model_config
    head_dim, inter = config.head_dim, config.intermediate_size
    packed = {"qkv_proj": [config.num_attention_heads * head_dim] + 2 * [config.num_key_value_heads * head_dim],
              "gate_up_proj": [inter, inter]}  # m10 packs each rank's own slices side by side
    for name, full in whole.items():
        if name == "lm_head.weight":
            continue  # tied: the embedding
        module = name.split(".")[-2]
        for rank, held in enumerate(ranks):
            if module in packed:
                expected = torch.cat([part.chunk(2)[rank] for part in full.split(packed[module])])
            elif module in ("o_proj", "down_proj"):
                expected = full.chunk(2, dim=1)[rank]
            else:
                expected = full
            assert torch.equal(held[name], expected), (rank, name)
    prompts, params = random_prompts(2, 3, 9, seed=142), greedy(4)
    assert tokens(engine.generate(prompts, params, use_tqdm=False)) == tokens(
        single.generate(prompts, params, use_tqdm=False))
    workers = engine.workers.pids
    del engine
    gc.collect()
    assert all(map(is_gone, workers)) and not dist.is_initialized()


def test_tensor_parallel_size_1_is_the_previous_milestone(tied_checkpoint, tokenizer_cache):
    before = set(children_of(os.getpid()))
    engine = make_engine("m14_tensor_parallel", tied_checkpoint[0], **KNOBS)
    previous = make_engine(PREVIOUS, tied_checkpoint[0], **KNOBS)
    assert engine.parallel is None and engine.workers is None and not dist.is_initialized()
    assert not any(isinstance(m, RowParallelLinear) for m in engine.model.modules())
    assert engine.kv_pool.k.shape == previous.kv_pool.k.shape
    params = [greedy(n) for n in (12, 12, 10, 12)]
    assert tokens(engine.generate(CHATS, params, use_tqdm=False)) == tokens(
        previous.generate(CHATS, params, use_tqdm=False))
    for name in ("steps", "tokens_computed", "num_preemptions", "prefix_cache_hit_tokens", "running_per_step"):
        assert getattr(engine.stats, name) == getattr(previous.stats, name), name
    assert engine.collective_rpc(graph_steps) == [(engine.stats.graph_steps, engine.stats.piecewise_steps)]
    assert set(children_of(os.getpid())) <= before
    engine.close()  # nothing to stop: still usable
    assert engine.generate(CHATS[:1], greedy(2), use_tqdm=False)[0].token_ids


ENGINE_SCRIPT = """
import sys
from pathlib import Path

from milestones.m14_tensor_parallel import EngineConfig, LLMEngine

if __name__ == "__main__":
    engine = LLMEngine(EngineConfig(model=sys.argv[1], device="cpu", tensor_parallel_size=2, kv_cache_tokens=64,
                                    distributed_timeout_s=120.0))
    Path(sys.argv[2]).write_text(" ".join(map(str, engine.workers.pids)))
    sys.stdin.read()  # until it is killed
"""


def test_the_workers_end_with_the_engines_process_however_it_ends(tied_checkpoint, tokenizer_cache, tmp_path):
    """SIGKILL leaves no chance to clean up: each worker watches its parent's sentinel and goes by itself."""
    script, pids_file = tmp_path / "engine.py", tmp_path / "pids"
    script.write_text(ENGINE_SCRIPT)
    process = subprocess.Popen([sys.executable, str(script), str(tied_checkpoint[0]), str(pids_file)],
                               env=env_with_checkout(), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: pids_file.exists() and pids_file.read_text(), "the engine started", process)
        workers = [int(pid) for pid in pids_file.read_text().split()]
        assert workers and not any(map(is_gone, workers))
    finally:
        process.kill()
        process.wait(60)
    wait_for(lambda: all(map(is_gone, workers)), "every worker is gone")


def wait_for(condition, what: str, process: subprocess.Popen | None = None, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert process is None or process.poll() is None, f"the engine's process exited ({process.returncode})"
        assert time.monotonic() < deadline, f"not within {timeout_s:.0f} s: {what}"
        time.sleep(0.05)


# --------------------------------------------------------------------------- refusals


def test_bad_sizes_are_refused_before_any_process_starts(tied_checkpoint, tokenizer_cache):
    before = set(children_of(os.getpid()))
    with pytest.raises(ValueError, match=r"^tensor_parallel_size=3 does not divide the model's K/V heads "
                                         r"\(num_key_value_heads=2\): use one of 1, 2$"):
        make_engine("m14_tensor_parallel", tied_checkpoint[0], tensor_parallel_size=3)
    with pytest.raises(ValueError, match="tensor_parallel_size must be an integer >= 1"):
        EngineConfig(tensor_parallel_size=0)
    with pytest.raises(ValueError, match=r"^quantization='int8' cannot be split across ranks yet: use it with "
                                         r"tensor_parallel_size=1$"):
        make_engine("m14_tensor_parallel", tied_checkpoint[0], quantization="int8", tensor_parallel_size=2)
    if torch.cuda.device_count() < 2:
        with pytest.raises(ValueError, match=r"needs GPUs cuda:0\.\.cuda:1, but torch sees"):
            rank_devices(torch.device("cuda"), 2)
    assert set(children_of(os.getpid())) <= before


def test_one_tensor_parallel_engine_per_process(tied_checkpoint, tokenizer_cache):
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=timedelta(seconds=10))
    try:
        with pytest.raises(ValueError, match="already has a torch.distributed group"):
            make_engine("m14_tensor_parallel", tied_checkpoint[0], **TP2)
    finally:
        dist.destroy_process_group()


# --------------------------------------------------------------------------- the decode graphs' path


def test_replayed_steps_take_the_filled_ids_on_every_rank(tied_checkpoint, tokenizer_cache):
    """Decode steps through the graph runner's buffers, mixed steps through m12's pieces (the all-reduces inside
    them): rank 0 fills the pending rows from step N's samples, then broadcasts them; a worker computing from
    the placeholders would change the tokens."""
    directory, model = tied_checkpoint
    engine = GraphsWithoutCapture(EngineConfig(model=str(directory), device="cpu", attention_backend="triton",
                                               max_num_seqs=4, block_size=4, kv_cache_tokens=128, **TP2))
    try:
        lengths = (5, 3, 6)
        outputs = engine.generate(PROMPTS[:3], [greedy(n) for n in lengths], use_tqdm=False)
        assert tokens(outputs) == [reference(model, p, n) for p, n in zip(PROMPTS[:3], lengths)]
        (decode, pieces), worker = engine.collective_rpc(graph_steps)
        assert decode >= 3 and pieces >= 1 and worker == (decode, pieces)
    finally:
        engine.close()


def test_the_benchmarks_give_every_split_the_same_kv_tokens():
    """A workload's K/V budget is tokens' worth: at TP=2 a rank holds half of each token's K/V, so the harness
    gives each rank half the bytes per token, and TP=1 and TP=2 run with the same number of slots."""
    import dataclasses

    from benchmarks.runners import MilestoneRunner
    from benchmarks.workloads import get_workload

    workload = get_workload("offline", 0)
    fields = {f.name for f in dataclasses.fields(EngineConfig)}
    for size in (1, 2):
        config = EngineConfig(model="tiny", device="cpu", tensor_parallel_size=size)
        sizing = MilestoneRunner._kv_sizing(config, fields, workload, "tiny", 1000, {})
        assert sizing["knob"] == "kv_cache_memory_bytes" and sizing["value"] // sizing["bytes_per_token"] == 1000
        assert sizing["bytes_per_token"] * size == 2 * 4 * 2 * 32 * 4  # K and V, 4 layers, 2 K/V heads of 32, fp32
