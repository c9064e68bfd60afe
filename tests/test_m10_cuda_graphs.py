"""m10 on the CPU: the batch-size ladder, padding to a graph's size, the eager fallback, packed layers, the server.

CUDA graphs need a GPU, so capture and replay themselves are checked in the GPU suite's float32 gate. Here the same
static buffers, built as the engine builds them on a GPU (``build_graph_runner``: the ladder and the block-table
width from the config) but with ``capture=False``, are filled and run with the Triton kernels in Triton's
interpreter: that checks what a replay reads (token ids, positions, slot mapping, block tables, context lengths,
padding rows) token for token against transformers, and after blocks were freed and reused.
"""

from __future__ import annotations

import pytest
import torch

from conftest import GREEDY_MAX_TOKENS, mixed_length_prompts, random_prompts
from kernel_signatures import TritonLaunches
from milestones.m01_naive_loop import SamplingParams
from milestones.m10_cuda_graphs import EngineConfig, LLMEngine
from milestones.m10_cuda_graphs.graph_runner import batch_size_ladder, padded_batch_size

GREEDY = SamplingParams(max_tokens=GREEDY_MAX_TOKENS, ignore_eos=True)


def test_the_ladder_doubles_to_eight_then_steps_by_eight_and_sixteen():
    assert batch_size_ladder(1) == [1]
    assert batch_size_ladder(5) == [1, 2, 4, 8]
    assert batch_size_ladder(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert batch_size_ladder(100) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112]
    ladder = batch_size_ladder(256)
    assert ladder[-1] == 256 and ladder == sorted(set(ladder))


def test_a_step_pads_to_the_smallest_graph_that_holds_it():
    ladder = batch_size_ladder(64)
    assert [padded_batch_size(ladder, n) for n in (1, 3, 8, 9, 17, 64)] == [1, 4, 8, 16, 24, 64]
    assert padded_batch_size(ladder, 65) is None  # larger than any graph: the step runs eagerly


def test_config_validation():
    with pytest.raises(ValueError, match="enforce_eager"):
        EngineConfig(enforce_eager="yes")
    with pytest.raises(ValueError, match="max_cuda_graph_batch_size"):
        EngineConfig(max_cuda_graph_batch_size=0)


def test_without_a_gpu_every_step_is_eager_and_exact(tiny_checkpoint, engine_factory, hf_reference):
    engine = engine_factory("m10_cuda_graphs", tiny_checkpoint[0], max_num_seqs=4, kv_cache_tokens=2048)
    assert engine.graph_runner is None and "off" in engine.describe_cuda_graphs()
    outputs = engine.generate(mixed_length_prompts(), GREEDY, use_tqdm=False)
    assert [o.token_ids for o in outputs] == hf_reference
    assert engine.stats.graph_steps == 0 and engine.stats.eager_steps == engine.stats.steps > 0


def test_packed_weights_are_the_checkpoint_weights_side_by_side(tiny_checkpoint, engine_factory):
    m09 = engine_factory("m09_server", tiny_checkpoint[0], kv_cache_tokens=256)
    m10 = engine_factory("m10_cuda_graphs", tiny_checkpoint[0], kv_cache_tokens=256)
    before, after = m09.model.model.layers[1], m10.model.model.layers[1]
    attn = before.self_attn
    assert torch.equal(after.self_attn.qkv_proj.weight,
                       torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
    assert torch.equal(after.mlp.gate_up_proj.weight, torch.cat([before.mlp.gate_proj.weight, before.mlp.up_proj.weight]))
    heads = attn.num_heads
    assert torch.equal(after.self_attn.qk_norm_weight[0], attn.q_norm.weight)
    assert torch.equal(after.self_attn.qk_norm_weight[heads], attn.k_norm.weight)


def replaying(config: EngineConfig) -> LLMEngine:
    """m10 with the runner its config asks for (``build_graph_runner``, as on a GPU), built without capturing:
    decode steps then run through the static buffers, with the kernels in Triton's interpreter."""
    engine = LLMEngine(config)
    assert engine.graph_runner is None  # no GPU: the engine itself runs every step eagerly
    engine.graph_runner = engine.build_graph_runner(capture=False)
    return engine


@pytest.fixture
def replaying_engine(tied_checkpoint, tokenizer_cache):
    """m10 on the Triton backend (interpreter) with a non-capturing runner over a ladder up to 8 rows."""
    return replaying(EngineConfig(model=str(tied_checkpoint[0]), device="cpu", max_num_seqs=5, block_size=4,
                                  kv_cache_tokens=600, attention_backend="triton"))


def test_the_runner_is_built_from_the_config(tied_checkpoint, tokenizer_cache):
    """The ladder ends at ``max_cuda_graph_batch_size`` (default ``max_num_seqs``); the block tables hold
    ``ceil(max_model_len / block_size)`` blocks, so the longest sequence the engine accepts replays too: here up
    to 50 tokens in blocks of 4 (13 blocks, the last one part full), decoded through the static buffers."""
    from conftest import hf_greedy

    directory, hf_model = tied_checkpoint
    knobs = dict(model=str(directory), device="cpu", block_size=4, kv_cache_tokens=256, max_model_len=50,
                 attention_backend="triton")
    engine = replaying(EngineConfig(max_num_seqs=8, max_cuda_graph_batch_size=4, **knobs))
    runner = engine.graph_runner
    assert runner.ladder == batch_size_ladder(4) == [1, 2, 4] and runner.graphs == {}
    assert tuple(runner.block_tables.shape) == (4, 13) and runner.max_context_len == 50
    assert replaying(EngineConfig(max_num_seqs=8, **knobs)).graph_runner.ladder == [1, 2, 4, 8]
    prompt = random_prompts(1, 44, 44, seed=23)[0]
    (out,) = engine.generate([prompt], SamplingParams(max_tokens=6, ignore_eos=True), use_tqdm=False)
    assert out.token_ids == hf_greedy(hf_model, prompt, 6)  # its last step reads 49 tokens: all 13 blocks
    assert engine.stats.graph_steps == 5 and engine.stats.eager_steps == 1


def test_static_buffers_padding_and_block_tables_give_transformers_tokens(replaying_engine, tied_checkpoint):
    from conftest import hf_greedy

    engine, hf_model = replaying_engine, tied_checkpoint[1]
    prompts = random_prompts(7, 1, 30, seed=21)
    lengths = [9, 3, 12, 6, 1, 10, 7]
    for round_ in range(2):  # the second round runs on blocks the first one freed
        params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in lengths]
        outputs = engine.generate(prompts, params, use_tqdm=False)
        for prompt, n, out in zip(prompts, lengths, outputs):
            assert out.token_ids == hf_greedy(hf_model, prompt, n), f"round {round_}"
        assert engine.stats.graph_steps > 0 and engine.stats.eager_steps > 0  # decodes replayed, prefills eager
        assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
        prompts = prompts[::-1]


def test_padding_rows_write_nowhere_and_read_nothing(replaying_engine):
    engine = replaying_engine
    for prompt in random_prompts(3, 4, 9, seed=5):
        engine.add_request(prompt, SamplingParams(max_tokens=4, ignore_eos=True))
    engine.step()  # the prefill: eager
    engine.step()  # a decode of 3 sequences, padded to the graph of 4
    runner = engine.graph_runner
    assert engine.stats.graph_steps == 1
    assert runner.slot_mapping[3].item() == -1 and runner.context_lens[3].item() == 0
    assert (runner.context_lens[:3] > 0).all()
    while engine.has_unfinished():
        engine.step()


def test_the_server_serves_m10_unchanged_with_enforce_eager(tied_checkpoint, tokenizer_cache):
    openai = pytest.importorskip("openai")
    from milestones.m09_server.app import build_app
    from milestones.common.server_thread import ServerThread

    engine = LLMEngine(EngineConfig(model=str(tied_checkpoint[0]), device="cpu", enforce_eager=True,
                                    max_num_seqs=4, kv_cache_tokens=512))
    offline = engine.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=5, ignore_eos=True), use_tqdm=False)[0]
    with ServerThread(build_app(engine, served_model_name="m10-tiny")) as running:
        client = openai.OpenAI(base_url=f"{running.url}/v1", api_key="unused", max_retries=0, timeout=60)
        reply = client.completions.create(model="m10-tiny", prompt=[5, 6, 7, 8], max_tokens=5, temperature=0,
                                          extra_body={"ignore_eos": True, "return_token_ids": True})
    choice = reply.choices[0]
    token_ids = getattr(choice, "token_ids", None) or choice.model_extra.get("token_ids")
    assert token_ids == offline.token_ids
    assert reply.usage.completion_tokens == 5


def test_eager_and_replayed_steps_launch_every_kernel_with_one_signature(tied_checkpoint, tokenizer_cache,
                                                                         monkeypatch):
    """A compiled Triton kernel is specific to its signature: its pointers' dtypes and 16-byte alignment, its
    integers' being 1 or a multiple of 16. If an eager step (a prompt chunk beside decodes) handed the decode
    kernel int64 lengths where the captured graphs hold int32, a server would compile new kernels at its first such
    steps, in the middle of serving. So every kernel m10 launches (store K/V, decode, combine the splits) has one
    signature per variant, replayed or eager. The variant (split or direct, how many splits) is chosen from a
    context bound, by design: the graphs' is ``max_model_len``, an eager step's its longest sequence, so here both
    regimes run both ways (a 5-row step pads to the graph of 8, which runs direct; a 200-token context splits)."""
    from milestones.m10_cuda_graphs.graph_runner import CUDAGraphRunner

    launches = TritonLaunches(monkeypatch)
    launches.in_graphs(CUDAGraphRunner, "forward")  # what a decode graph records
    engine = replaying(EngineConfig(model=str(tied_checkpoint[0]), device="cpu", max_num_seqs=5, block_size=4,
                                    kv_cache_tokens=1024, max_model_len=256, attention_backend="triton"))
    # Short sequences arriving while the ones before them decode: eager steps run direct, decode graphs split.
    for prompt in random_prompts(4, 3, 9, seed=8):
        engine.add_request(prompt, SamplingParams(max_tokens=3, ignore_eos=True))
        engine.step()
    while engine.has_unfinished():
        engine.step()
    # A long sequence decoding while short ones arrive: eager steps split too; with 5 decodes the graph of 8, direct.
    engine.add_request(random_prompts(1, 200, 200, seed=9)[0], SamplingParams(max_tokens=8, ignore_eos=True))
    engine.step()
    for prompt in random_prompts(4, 3, 9, seed=10):
        engine.add_request(prompt, SamplingParams(max_tokens=6, ignore_eos=True))
        engine.step()
    while engine.has_unfinished():
        engine.step()

    assert engine.stats.eager_steps > 1 and engine.stats.graph_steps > 0
    assert not launches.differing()
    assert launches.in_both() == {"_store_kv_kernel", "_paged_decode_kernel", "_combine_splits_kernel"}
    split = {dict(variant)["SPLIT"]: wheres for variant, wheres in launches.wheres("_paged_decode_kernel").items()}
    assert split == {False: {"captured", "eager"}, True: {"captured", "eager"}}
