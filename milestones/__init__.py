"""nanoserve milestones: a vLLM-style inference engine for Qwen3, built one idea at a time.

Each package ``mNN_*`` imports the one before it and adds a single idea:

    m01_naive_loop          our own Qwen3 forward pass; generate by re-running the whole sequence
    m02_kv_cache            prefill once, then decode one token per step against a K/V cache
    m03_static_batching     a padded batch of requests runs together
    m04_continuous_batching the batch is rebuilt every step by a scheduler

Every package exports the same offline API: ``EngineConfig``, ``LLMEngine`` and ``SamplingParams``.
"""
