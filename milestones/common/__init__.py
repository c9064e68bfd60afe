"""Plumbing that every milestone uses and none teaches: read a milestone's own package for its idea.

* ``demo.py``: what every demo (``python -m milestones.mNN_...``) is built from: flag types and the common flags,
  one-line errors, seeded prompts, timing in interleaved rounds, tables and speed-ups;
* ``latency.py``: TTFT, inter-token latency and throughput from the timestamps every ``RequestOutput`` carries;
* ``engine_stats.py``: ``EngineStats``, the counters an engine keeps while it runs (``engine.stats``);
* ``server_thread.py``: uvicorn in a background thread on a free port (m09's demo, the tests, the benchmarks),
  and the idle-connection timeout every server runs with;
* ``serve_cli.py``: ``python -m milestones.m09_server serve``'s command line, with vLLM's flag names;
* ``http_guards.py``: the server's doors: an API key on ``/v1``, a request body's size and time limits;
* ``openai_protocol.py``: OpenAI's request shapes as pydantic models (what a client may send), ``usage``;
* ``openai_errors.py``: every error a server answers, in OpenAI's shape (``APIError`` and the FastAPI handlers);
* ``stream_client.py``: concurrent streams through the official ``openai`` client, timed (m09's demo).

Nothing here imports a numbered milestone (m01 imports this package, never the other way): where plumbing needs
a milestone's class, the caller passes it in (``engine_config(EngineConfig, args)``, ``serve(argv, milestone,
build_app)``).
"""
