"""``python -m milestones.m09_server serve --model ... --port ...``: the server, with vLLM's flag names.

Engine flags map onto the fields of the milestone's ``EngineConfig`` (``dataclasses.fields``); a flag whose
field the engine does not have (``--block-size`` before paged blocks exist) is a one-line error, and flags
not given keep the engine's defaults. The engine class comes from the package named by ``milestone``, so a
later milestone serves its own engine with ``serve(argv, milestone="milestones.m10_...")``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json

# (flag, EngineConfig field, type, help). Every one defaults to "not given".
ENGINE_FLAGS: tuple[tuple[str, str, object, str], ...] = (
    ("--device", "device", str, "auto, cpu, cuda or cuda:N"),
    ("--dtype", "dtype", str, "auto, float32, bfloat16 or float16"),
    ("--max-model-len", "max_model_len", int, "longest prompt + output accepted"),
    ("--seed", "seed", int, "seed of random preset weights and of requests that bring no seed"),
    ("--max-num-seqs", "max_num_seqs", int, "most requests in the running batch"),
    ("--max-num-batched-tokens", "max_num_batched_tokens", int, "token budget of one step"),
    ("--block-size", "block_size", int, "tokens per K/V block"),
    ("--gpu-memory-utilization", "gpu_memory_utilization", float, "fraction of GPU memory the engine may use"),
    ("--kv-cache-memory-gib", "kv_cache_memory_gib", float, "K/V cache size in GiB (overrides the utilization)"),
    ("--kv-cache-tokens", "kv_cache_tokens", int, "K/V pool size in tokens (m04's contiguous pool)"),
    ("--enable-prefix-caching", "enable_prefix_caching", argparse.BooleanOptionalAction, "reuse K/V of shared "
     "prompt prefixes"),
    ("--attention-backend", "attention_backend", str, "auto, torch or triton"),
    ("--enforce-eager", "enforce_eager", "flag", "never capture or replay CUDA graphs (m10 on)"),
    ("--quantization", "quantization", str, "int8 or int4 weights (m13 on)"),
    ("--kv-cache-dtype", "kv_cache_dtype", str, "auto, or fp8 (fp8_e4m3): the K/V cache in float8 (m13 on)"),
    ("--calculate-kv-scales", "calculate_kv_scales", "flag", "FP8 K/V scales from the first prompt (m13 on)"),
)


def add_engine_flags(parser: argparse.ArgumentParser, model_default: str | None = "tiny") -> None:
    group = parser.add_argument_group("engine (vLLM's flag names; each needs a matching EngineConfig field)")
    group.add_argument("--model", default=model_default,
                       help="a preset (tiny, qwen3-0.6b-random), a checkpoint directory, or a hub id")
    for flag, _, kind, help_text in ENGINE_FLAGS:
        if kind is argparse.BooleanOptionalAction:
            group.add_argument(flag, action=kind, default=None, help=help_text)
        elif kind == "flag":
            group.add_argument(flag, action="store_const", const=True, default=None, help=help_text)
        else:
            group.add_argument(flag, type=kind, default=None, help=help_text)


def engine_config(config_cls, args: argparse.Namespace, parser: argparse.ArgumentParser, **defaults):
    """``config_cls`` from the flags that were given, over ``defaults``; unsupported flags end the program."""
    fields = {f.name for f in dataclasses.fields(config_cls)}
    kwargs = {"model": args.model, **{k: v for k, v in defaults.items() if k in fields}}
    for flag, field, _, _ in ENGINE_FLAGS:
        value = getattr(args, field)
        if value is None:
            continue
        if field not in fields:
            parser.error(f"{flag} is not supported by this engine ({config_cls.__module__}.EngineConfig has no "
                         f"field {field!r})")
        kwargs[field] = value
    try:
        return config_cls(**kwargs)
    except ValueError as error:
        parser.error(str(error))


def build_engine(milestone: str, args: argparse.Namespace, parser: argparse.ArgumentParser, **defaults):
    """The milestone's ``LLMEngine`` built from the parsed flags (bad values end the program with one line)."""
    package = importlib.import_module(milestone)
    config = engine_config(package.EngineConfig, args, parser, **defaults)
    try:
        return package.LLMEngine(config)
    except ValueError as error:
        parser.error(str(error))


def serve_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="An OpenAI-compatible server (completions and chat, "
                                     "streaming, /metrics) over this milestone's engine.",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("model_tag", nargs="?", default=None, help="the model, as vLLM's `vllm serve MODEL`")
    add_engine_flags(parser)
    server = parser.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    server.add_argument("--port", type=int, default=8000)
    server.add_argument("--served-model-name", nargs="+", default=None,
                        help="name(s) clients pass as `model` (default: --model)")
    server.add_argument("--graceful-shutdown-s", type=float, default=5.0,
                        help="on Ctrl-C, how long requests in flight may take to finish before they are aborted")
    server.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    return parser


def serve(argv: list[str] | None = None, milestone: str = "milestones.m09_server") -> None:
    """Parse ``argv`` (the words after ``serve``), build the engine, and serve until Ctrl-C."""
    import uvicorn

    from .app import build_app

    parser = serve_parser(f"python -m {milestone} serve")
    args = parser.parse_args(argv)
    if args.model_tag is not None:
        args.model = args.model_tag
    engine = build_engine(milestone, args, parser)
    app = build_app(engine, args.served_model_name, shutdown_grace_s=0.0)
    name = (args.served_model_name or [args.model])[0]
    for describe in ("describe_kv_cache", "describe_cuda_graphs"):  # the K/V blocks (m05 on), the graphs (m10)
        if hasattr(engine, describe):
            print(getattr(engine, describe)(), flush=True)
    print(f"serving {engine.milestone} ({args.model!r} on {engine.device}, {engine.dtype}) as {name!r} at "
          f"http://{args.host}:{args.port}\ntry:\n{curl_example(f'http://{args.host}:{args.port}', name)}", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                timeout_graceful_shutdown=args.graceful_shutdown_s)


def curl_example(url: str, model: str) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 16, "stream": True}
    return f"curl -N {url}/v1/chat/completions -H 'Content-Type: application/json' -d '{json.dumps(body)}'"
