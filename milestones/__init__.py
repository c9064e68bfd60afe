"""nanoserve milestones: a vLLM-style inference engine for Qwen3, built one idea at a time.

Each package ``mNN_*`` imports the one before it and adds a single idea:

    m01_naive_loop          our own Qwen3 forward pass; generate by re-running the whole sequence
    m02_kv_cache            prefill once, then decode one token per step against a K/V cache
    m03_static_batching     a padded batch of requests runs together
    m04_continuous_batching the batch is rebuilt every step by a scheduler
    m05_paged_blocks        K/V in fixed-size blocks handed out as tokens arrive; packed batches; preemption
    m06_prefix_cache        full blocks found again by a chained hash: shared prompt prefixes are computed once
    m07_chunked_prefill     long prompts split across steps, sharing each step with the running decodes
    m08_triton_kernel       a Triton paged-attention decode kernel reads K/V in place through the block tables
    m09_server              an OpenAI-compatible HTTP server with streaming over an engine loop thread
    m10_cuda_graphs         decode steps replayed from CUDA graphs; fewer kernels per step

``python -m milestones`` lists them with their measured gains; ``python -m milestones diff m06 m07`` shows what a
milestone adds over another.

Every package exports the same offline API: ``EngineConfig``, ``LLMEngine`` and ``SamplingParams``.
"""
