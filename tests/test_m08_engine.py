"""m08's engine on the Triton backend gives transformers' greedy tokens, with the kernels doing the decodes.

``test_m08_kernel.py`` checks the kernels against torch, handing them the softmax scale itself. Here the engine
hands it: ``1 / sqrt(head_dim)`` of the model it loaded, 16 for the tiny test model (Qwen3-0.6B's is 128), so an
engine that passed any other scale, or the wrong tables or lengths, gives other tokens.

Without CUDA the kernels run in Triton's interpreter (exact, slow), which ``TRITON_INTERPRET=1`` chooses only if
it is set before triton is first imported: ``tests/conftest.py`` sets it at the start of the session, before
anything imports triton, whatever the milestone packages do at import. So the sizes here are small.
"""

from __future__ import annotations

import pytest
import torch

from conftest import hf_greedy, random_prompts
from milestones.m01_naive_loop import SamplingParams

pytest.importorskip("triton")


def test_the_triton_backend_gives_transformers_tokens_with_a_head_dim_of_16(tied_checkpoint, tokenizer_cache,
                                                                            monkeypatch):
    from milestones.m08_triton_kernel import EngineConfig, LLMEngine, paged_decode_kernel
    from milestones.m08_triton_kernel.engine import triton_unavailable_reason

    reason = triton_unavailable_reason("cpu")
    if reason is not None and torch.cuda.is_available():
        pytest.skip("with a GPU present the session runs Triton compiled, not in its interpreter on the CPU")
    assert reason is None, reason
    directory, hf_model = tied_checkpoint
    assert hf_model.config.head_dim == 16
    engine = LLMEngine(EngineConfig(model=str(directory), device="cpu", max_num_seqs=3,
                                    block_size=4, kv_cache_tokens=128, attention_backend="triton"))
    assert engine.attention_backend == "triton"
    decodes = []
    real_kernel = paged_decode_kernel.paged_decode_attention

    def counted_kernel(q, *args, **kwargs):
        decodes.append(q.shape[0])
        return real_kernel(q, *args, **kwargs)

    monkeypatch.setattr(paged_decode_kernel, "paged_decode_attention", counted_kernel)
    prompts = random_prompts(3, 2, 11, seed=61)  # up to three blocks of 4 before the first decode
    outputs = engine.generate(prompts, SamplingParams(max_tokens=5, ignore_eos=True), use_tqdm=False)
    for prompt, output in zip(prompts, outputs):
        assert output.token_ids == hf_greedy(hf_model, prompt, 5), prompt
    assert decodes and max(decodes) == 3  # the decode steps went through the kernel, all three rows at once
