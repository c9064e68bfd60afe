"""``python -m milestones.m09_server serve --model ... --port ...``: the server's command line, with vLLM's flag names.

Engine flags map onto the fields of the milestone's ``EngineConfig`` (``dataclasses.fields``); a flag whose
field the engine does not have (``--block-size`` before paged blocks exist) is a one-line error, and flags
not given keep the engine's defaults (``--help`` shows them). The engine class comes from the package named by
``milestone``, and the app from the ``build_app`` the caller passes in (m09's), so a later milestone serves its
own engine with ``serve(argv, "milestones.m10_...", build_app)``.

The server's doors (``http_guards.py``) have flags too: ``--api-key`` (vLLM's; also read from ``VLLM_API_KEY``
as vLLM does, so the key need not appear in ``ps``), ``--max-request-body-mb``, ``--request-body-timeout-s`` and
``--timeout-keep-alive`` (uvicorn's), which nanoserve adds; vLLM has no body limit of its own.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
from collections.abc import Callable

from .demo import HelpFormatter, byte_size, positive_float
from .http_guards import (DEFAULT_MAX_REQUEST_BODY_MB, DEFAULT_REQUEST_BODY_TIMEOUT_S, DEFAULT_TIMEOUT_KEEP_ALIVE_S,
                          ServerGuards)

API_KEY_ENV = "VLLM_API_KEY"

# (flag, EngineConfig field, type, help, what the engine does when the field is None)
ENGINE_FLAGS: tuple[tuple[str, str, object, str, str], ...] = (
    ("--device", "device", str, "auto, cpu, cuda or cuda:N", ""),
    ("--dtype", "dtype", str, "auto, float32, bfloat16 or float16", ""),
    ("--max-model-len", "max_model_len", int, "longest prompt + output accepted", "the model's own limit"),
    ("--seed", "seed", int, "seed of random preset weights and of requests that bring no seed", ""),
    ("--max-num-seqs", "max_num_seqs", int, "most requests in the running batch", ""),
    ("--max-num-batched-tokens", "max_num_batched_tokens", int, "token budget of one step", "no cap"),
    ("--block-size", "block_size", int, "tokens per K/V block", ""),
    ("--gpu-memory-utilization", "gpu_memory_utilization", float, "fraction of GPU memory the engine may use",
     "not used"),
    ("--kv-cache-memory-bytes", "kv_cache_memory_bytes", byte_size,
     "K/V cache size in bytes: 4G is 4 GiB, 4g 4*10**9 (instead of the utilization)", "not used"),
    ("--kv-cache-tokens", "kv_cache_tokens", int, "K/V pool size in tokens (m04's contiguous pool)",
     "room for max-num-seqs full-length requests"),
    ("--enable-prefix-caching", "enable_prefix_caching", argparse.BooleanOptionalAction, "reuse K/V of shared "
     "prompt prefixes", ""),
    ("--attention-backend", "attention_backend", str, "auto, torch or triton", ""),
    ("--enforce-eager", "enforce_eager", "flag", "never capture or replay CUDA graphs (m10 on)", ""),
    ("--async-scheduling", "async_scheduling", argparse.BooleanOptionalAction, "plan step N+1 while the GPU runs "
     "step N (m12 on)", ""),
    ("--quantization", "quantization", str, "int8 or int4 weights (m13 on)", "weights in --dtype"),
    ("--kv-cache-dtype", "kv_cache_dtype", str, "auto, or fp8 (fp8_e4m3): the K/V cache in float8 (m13 on)", ""),
    ("--calculate-kv-scales", "calculate_kv_scales", "flag", "FP8 K/V scales from the first prompt (m13 on)", ""),
    ("--tensor-parallel-size", "tensor_parallel_size", int, "ranks (GPUs) sharing every layer (m14 on)", ""),
)
SHORT_FLAGS = {"--tensor-parallel-size": "-tp"}  # vLLM's short spelling


def engine_default(config_cls, field: str, none_means: str) -> str:
    """What ``--help`` says of a flag: the engine's default for ``field``, or that the engine has no such field."""
    found = {f.name: f for f in dataclasses.fields(config_cls)}.get(field) if config_cls is not None else None
    if found is None:
        return "not in this engine" if config_cls is not None else "the engine's"
    value = found.default if found.default is not dataclasses.MISSING else None
    return none_means or "None" if value is None else str(value)


def add_engine_flags(parser: argparse.ArgumentParser, model_default: str | None = "tiny", config_cls=None) -> None:
    """The engine's flags; ``--help`` shows ``config_cls``'s defaults (an engine chosen later: "the engine's")."""
    group = parser.add_argument_group("engine (vLLM's flag names; each needs a matching EngineConfig field)")
    group.add_argument("--model", default=model_default,
                       help="a preset (tiny, qwen3-0.6b-random), a checkpoint directory, or a hub id")
    for flag, field, kind, help_text, none_means in ENGINE_FLAGS:
        text = f"{help_text} (default: {engine_default(config_cls, field, none_means)})"
        names = [SHORT_FLAGS[flag], flag] if flag in SHORT_FLAGS else [flag]
        if kind is argparse.BooleanOptionalAction:
            group.add_argument(*names, action=kind, default=None, help=text)
        elif kind == "flag":
            group.add_argument(*names, action="store_const", const=True, default=None, help=text)
        else:
            group.add_argument(*names, type=kind, dest=field, default=None, help=text)


def engine_config(config_cls, args: argparse.Namespace, parser: argparse.ArgumentParser, **defaults):
    """``config_cls`` from the flags that were given, over ``defaults``; unsupported flags end the program."""
    fields = {f.name for f in dataclasses.fields(config_cls)}
    kwargs = {"model": args.model, **{k: v for k, v in defaults.items() if k in fields}}
    for flag, field, *_ in ENGINE_FLAGS:
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


def build_engine_client(milestone: str, args: argparse.Namespace, parser: argparse.ArgumentParser, **defaults):
    """What the server of ``milestone`` talks to: ``LLMEngine.make_engine_client`` (an engine in a thread of
    this process up to m10, in a process of its own from m11 on); bad values end the program with one line."""
    package = importlib.import_module(milestone)
    config = engine_config(package.EngineConfig, args, parser, **defaults)
    try:
        return package.LLMEngine.make_engine_client(config)
    except ValueError as error:
        parser.error(str(error))


def serve_parser(prog: str, config_cls=None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="An OpenAI-compatible server (completions and chat, "
                                     "streaming, /metrics) over this milestone's engine.", formatter_class=HelpFormatter)
    parser.add_argument("model_tag", nargs="?", default=None,
                        help="the model, as vLLM's `vllm serve MODEL` (default: --model)")
    add_engine_flags(parser, config_cls=config_cls)
    server = parser.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    server.add_argument("--port", type=int, default=8000, help="port to listen on")
    server.add_argument("--served-model-name", nargs="+", default=None,
                        help="name(s) clients pass as `model` (default: --model)")
    server.add_argument("--graceful-shutdown-s", type=float, default=5.0,
                        help="on Ctrl-C, how long requests in flight may take to finish before they are aborted")
    server.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                        help="uvicorn's log level")
    doors = parser.add_argument_group("doors (what a server shared with a room refuses)")
    doors.add_argument("--api-key", nargs="+", default=None, metavar="KEY",
                       help=f"require 'Authorization: Bearer KEY' on /v1/* (/health and /metrics stay open) "
                            f"(default: ${API_KEY_ENV} if set, else no key)")
    doors.add_argument("--max-request-body-mb", type=positive_float, default=DEFAULT_MAX_REQUEST_BODY_MB,
                       help="larger request bodies get 413 before they are parsed (MiB)")
    doors.add_argument("--request-body-timeout-s", type=positive_float, default=DEFAULT_REQUEST_BODY_TIMEOUT_S,
                       help="a body not all there this long after its headers gets 408")
    doors.add_argument("--timeout-keep-alive", type=positive_float, default=DEFAULT_TIMEOUT_KEEP_ALIVE_S,
                       help="close a connection idle this long (s), including one that never sent a request")
    return parser


def server_guards(args: argparse.Namespace, environ=os.environ) -> ServerGuards:
    """The doors' settings from the flags; the keys from ``--api-key``, else from ``$VLLM_API_KEY``."""
    keys = args.api_key if args.api_key is not None else [environ.get(API_KEY_ENV, "")]
    return ServerGuards(api_keys=tuple(key for key in keys if key),
                        max_request_body_bytes=int(args.max_request_body_mb * 2**20),
                        request_body_timeout_s=args.request_body_timeout_s)


def serve(argv: list[str] | None, milestone: str, build_app: Callable) -> None:
    """Parse ``argv`` (the words after ``serve``), build the engine client, and serve ``build_app(client)`` until
    Ctrl-C."""
    import uvicorn

    from .server_thread import IdleConnectionTimeout

    parser = serve_parser(f"python -m {milestone} serve", importlib.import_module(milestone).EngineConfig)
    args = parser.parse_args(argv)
    if args.model_tag is not None:
        args.model = args.model_tag
    guards = server_guards(args)
    client = build_engine_client(milestone, args, parser)
    app = build_app(client, args.served_model_name, shutdown_grace_s=0.0, guards=guards)
    name = (args.served_model_name or [args.model])[0]
    for line in client.describe():
        print(line, flush=True)
    url = f"http://{args.host}:{args.port}"
    print(f"serving {client.milestone} ({args.model!r}) as {name!r} at {url}", flush=True)
    if guards.api_keys:
        print(f"an API key is required on /v1/* ({'--api-key' if args.api_key else '$' + API_KEY_ENV})", flush=True)
    elif args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: no API key, and {args.host} is reachable from other machines: pass --api-key", flush=True)
    print(f"try:\n{curl_example(url, name, with_key=bool(guards.api_keys))}", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                timeout_graceful_shutdown=args.graceful_shutdown_s, http=IdleConnectionTimeout,
                timeout_keep_alive=args.timeout_keep_alive)


def curl_example(url: str, model: str, with_key: bool = False) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 16, "stream": True}
    key = " -H 'Authorization: Bearer <your key>'" if with_key else ""
    return f"curl -N {url}/v1/chat/completions -H 'Content-Type: application/json'{key} -d '{json.dumps(body)}'"
