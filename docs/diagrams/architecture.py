"""Draws docs/images/architecture.png: one request through the final engine (m10's, served by m09's server).

Run it after changing the path a request takes (the boxes name files and functions; docs/architecture.md
walks through the same hops in words):

    .venv/bin/python docs/diagrams/architecture.py                  # writes docs/images/architecture.png
    .venv/bin/python docs/diagrams/architecture.py --out /tmp/a.png # anywhere else

The picture is data: ``BOXES`` (lane, position, title, what happens there) and ``ARROWS`` below. Only
matplotlib is needed (a dependency of the notebooks); nothing of nanoserve is imported, so the script runs
anywhere. tests/test_docs.py runs it into a temporary folder, so the image can always be regenerated.
"""

from __future__ import annotations

import argparse
import textwrap
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display needed
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "images" / "architecture.png"
WIDTH_IN, HEIGHT_IN = 15.0, 11.0  # the figure, in inches; boxes below are in figure fractions

SERVER, ENGINE, GPU = "#e8f1fb", "#fdf1e3", "#eaf6ea"  # fills: event loop, engine thread (host), device work


@dataclass(frozen=True)
class Box:
    key: str
    x: float  # left edge
    y: float  # top edge
    w: float
    h: float
    title: str
    detail: str
    fill: str


BOXES = [
    # ---- the HTTP side: uvicorn's event loop (m09_server) ----------------------------------------------------
    Box("post", 0.02, 0.915, 0.29, 0.075, "POST /v1/completions  (stream: true)",
        "app.py build_app: the route; common/openai_protocol.py CompletionRequest: pydantic checks every field (400 and an "
        "OpenAI error body)", SERVER),
    Box("serving", 0.02, 0.82, 0.29, 0.095, "OpenAIServing.completions  (serving.py)",
        "check_model, tokenize, check_context (prompt + max_tokens <= max_model_len), engine_sampling_params(); "
        "start(): an IncrementalDetokenizer, then add_request", SERVER),
    Box("async_add", 0.02, 0.705, 0.29, 0.085, "AsyncLLMEngine.add_request  (async_engine.py)",
        "puts (\"add\", stream, ids, params) in the inbox and awaits the engine's answer: a request id, or its "
        "ValueError (400)", SERVER),
    Box("await", 0.02, 0.585, 0.29, 0.115, "the handler waits on its RequestStream",
        "async for output in stream: meanwhile the event loop serves every other connection, /health and "
        "/metrics (an EngineState snapshot the engine thread publishes after each step). A client that "
        "leaves has its request aborted (close, cancel_on_disconnect).", SERVER),
    Box("deliver", 0.02, 0.31, 0.29, 0.07, "RequestStream  (async_engine.py)",
        "_deliver runs on the event loop: each RequestOutput goes into its request's asyncio.Queue", SERVER),
    Box("detok", 0.02, 0.215, 0.29, 0.085, "Generation.deltas  (serving.py, detokenizer.py)",
        "IncrementalDetokenizer.update: only whole characters leave; a possible stop string is held back; a "
        "match aborts the engine request (finish \"stop\")", SERVER),
    Box("sse", 0.02, 0.115, 0.29, 0.085, "stream_response -> sse()  (serving.py)",
        "one 'data: {...}' chunk per step that gave a token, then 'data: [DONE]'; close() aborts the request "
        "if the client left (its blocks are freed) and records /metrics", SERVER),
    # ---- the engine thread: m10's LLMEngine (subclass chain m01 .. m10) ---------------------------------------
    Box("add", 0.41, 0.915, 0.54, 0.075, "engine.add_request  (m04 engine.py)",
        "make_request (m01 engine.py): the prompt's ids inside the vocabulary, prompt + max_tokens <= "
        "max_model_len, fits the K/V pool (m04)  ->  a Sequence (m05 sequence.py)  ->  Scheduler.add: the "
        "waiting queue", ENGINE),
    Box("step", 0.41, 0.82, 0.54, 0.06, "engine.step() -> engine_step  (m04 / m05 engine.py)",
        "the thread's loop (AsyncLLMEngine._run): drain the inbox (adds, aborts), then one step while any "
        "request is unfinished", ENGINE),
    Box("schedule", 0.41, 0.735, 0.265, 0.135, "Scheduler.schedule  (m07 scheduler.py)",
        "one budget, max_num_batched_tokens: 1. a token for every decode, 2. the next chunk of prompts in "
        "flight, 3. admit new requests (FCFS) with a first chunk; prefix hits are not counted (m06); out of "
        "blocks: preempt the newest (m05, recompute)", ENGINE),
    Box("blocks", 0.685, 0.735, 0.265, 0.135, "PrefixCachingBlockManager  (m06)",
        "block_manager.py: cached_prefix: chained hashes of full blocks; allocate: hits shared by reference "
        "count, plus fresh blocks; append_slots as tokens arrive; cache_full_blocks; freed blocks kept, least "
        "recently used out first (m05: free list, block tables)", ENGINE),
    Box("decide", 0.41, 0.575, 0.54, 0.045, "LLMEngine.execute  (m10 engine.py): is_graph_step?",
        "every scheduled sequence feeds one token and samples, and the batch fits the largest captured graph",
        ENGINE),
    Box("graph", 0.41, 0.505, 0.23, 0.11, "yes: CUDAGraphRunner.replay",
        "graph_runner.py: host_batch -> static buffers (ids, positions, slot_mapping, context_lens, "
        "block_tables); replay the smallest captured batch size >= B; padding rows write and read nothing", GPU),
    Box("eager", 0.65, 0.505, 0.30, 0.11, "no: m05's execute, a packed [T] batch",
        "m05 engine.py: host_batch -> prepare_batch -> AttentionMetadata.build (paged_attention.py): "
        "slot_mapping, positions, query_start_loc, context_lens, block_tables: copied once per step, read by "
        "every layer", ENGINE),
    Box("forward", 0.41, 0.365, 0.54, 0.11, "Qwen3 forward  (m01 model.py, m10 packed_layers.py, m08 attention.py)",
        "every decoder layer (28 in Qwen3-0.6B): qkv_proj (one matmul), q/k RMSNorm, RoPE; attention = TritonPagedAttention: store_kv (one "
        "Triton launch) writes the new K/V at slot_mapping; decodes -> paged_decode_attention (Triton, reads the "
        "blocks in place); prompt chunks -> m05's GatherIndices + SDPA (torch); o_proj; gate_up_proj, "
        "down_proj. A captured graph holds exactly the decode path.", GPU),
    Box("sample", 0.41, 0.215, 0.54, 0.08, "sample_and_append  (m01 engine.py, sampler.py, request.py)",
        "logits only for the rows that sample (compute_logits); Sampler: greedy argmax, or temperature, top-k, "
        "top-p with the request's own generator; Request.append_token: EOS or a stop id -> \"stop\", "
        "max_tokens -> \"length\"", ENGINE),
    Box("output", 0.41, 0.105, 0.54, 0.07, "RequestOutput  (m04 step -> make_output; m09 engine.py)",
        "token ids so far and finish_reason; text stays \"\" while running (the server detokenizes); finished "
        "requests leave: remove_finished frees their blocks", ENGINE),
]

ARROWS = [  # (from "box:side[@fraction]", to, label)
    ("post:bottom", "serving:top", ""),
    ("serving:bottom", "async_add:top", ""),
    ("async_add:right", "add:left@0.9", "inbox\n(queue.SimpleQueue)"),
    ("async_add:bottom", "await:top", ""),
    ("await:bottom", "deliver:top", ""),
    ("add:bottom", "step:top", ""),
    ("step:bottom@0.245", "schedule:top", ""),
    ("schedule:right", "blocks:left", ""),
    ("schedule:bottom", "decide:top@0.245", "SchedulerOutput"),
    ("decide:bottom@0.213", "graph:top", ""),
    ("decide:bottom@0.722", "eager:top", ""),
    ("graph:bottom", "forward:top@0.213", "replay of the recorded decode pass"),
    ("eager:bottom", "forward:top@0.722", "kernels launched one by one"),
    ("forward:bottom", "sample:top", ""),
    ("sample:bottom", "output:top", ""),
    ("output:left", "deliver:right", "loop.call_soon_\nthreadsafe(_deliver)"),
    ("deliver:bottom", "detok:top", ""),
    ("detok:bottom", "sse:top", ""),
]


def anchor(boxes: dict[str, Box], spec: str) -> tuple[float, float]:
    """``"forward:top@0.25"``: the point a quarter of the way along the top edge of box ``forward``."""
    key, _, side = spec.partition(":")
    side, _, fraction = side.partition("@")
    box, f = boxes[key], float(fraction or 0.5)
    return {"top": (box.x + f * box.w, box.y), "bottom": (box.x + f * box.w, box.y - box.h),
            "left": (box.x, box.y - (1 - f) * box.h), "right": (box.x + box.w, box.y - (1 - f) * box.h)}[side]


def draw_box(fig, box: Box) -> None:
    fig.add_artist(FancyBboxPatch((box.x, box.y - box.h), box.w, box.h, boxstyle="round,pad=0.004,rounding_size=0.008",
                                  transform=fig.transFigure, facecolor=box.fill, edgecolor="#555555", linewidth=0.9))
    chars = int(box.w * WIDTH_IN * 72 / 4.6)  # characters per line at 8.2 pt, roughly
    fig.text(box.x + 0.006, box.y - 0.008, box.title, fontsize=9.2, fontweight="bold", va="top", ha="left")
    fig.text(box.x + 0.006, box.y - 0.029, textwrap.fill(box.detail, chars), fontsize=8.2, va="top", ha="left",
             linespacing=1.25, color="#222222")


def draw_arrow(fig, boxes: dict[str, Box], start: str, end: str, label: str, curve: float = 0.0,
               color: str = "#333333", linestyle: str = "-") -> None:
    a, b = anchor(boxes, start), anchor(boxes, end)
    fig.add_artist(FancyArrowPatch(a, b, transform=fig.transFigure, arrowstyle="-|>", mutation_scale=13,
                                   linewidth=1.2, color=color, linestyle=linestyle,
                                   connectionstyle=f"arc3,rad={curve}", shrinkA=2, shrinkB=2))
    if label:
        x, y = (a[0] + b[0]) / 2, (a[1] + b[1]) / 2
        fig.text(x + 0.004, y, label, fontsize=8.3, style="italic", ha="left" if abs(a[0] - b[0]) < 0.01 else "center",
                 va="center", color="#1a4a7a", bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.8})


def draw(out: Path) -> Path:
    fig = plt.figure(figsize=(WIDTH_IN, HEIGHT_IN))
    fig.text(0.015, 0.992, "One request through nanoserve's final engine: m10's LLMEngine served by m09's server",
             fontsize=13, fontweight="bold", va="top")
    legend = [(SERVER, "event loop (Python, async)"), (ENGINE, "engine thread (Python, on the host)"),
              (GPU, "GPU work (kernels launched, or a graph replayed)")]
    for i, (fill, text) in enumerate(legend):
        x = 0.02 + i * 0.22
        fig.add_artist(FancyBboxPatch((x, 0.953), 0.012, 0.012, boxstyle="square,pad=0", transform=fig.transFigure,
                                      facecolor=fill, edgecolor="#555555", linewidth=0.8))
        fig.text(x + 0.018, 0.959, text, fontsize=8.5, va="center")
    for x, w, title in ((0.012, 0.306, "event loop (uvicorn + FastAPI): m09_server"),
                        (0.402, 0.556, "engine thread: the only code that touches the engine")):
        fig.add_artist(FancyBboxPatch((x, 0.02), w, 0.92, boxstyle="round,pad=0.0,rounding_size=0.01",
                                      transform=fig.transFigure, facecolor="none", edgecolor="#999999",
                                      linestyle="--", linewidth=1.0))
        fig.text(x + w / 2, 0.928, title, fontsize=10, ha="center", va="center", color="#444444",
                 bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.0})
    boxes = {box.key: box for box in BOXES}
    for box in BOXES:
        draw_box(fig, box)
    for start, end, label in ARROWS:
        draw_arrow(fig, boxes, start, end, label)
    # The engine thread loops: after the outputs, the next step.
    draw_arrow(fig, boxes, "output:right", "step:right", "", curve=0.12, color="#888888", linestyle="--")
    fig.text(0.975, 0.46, "next step", rotation=90, fontsize=8.5, color="#666666", ha="center", va="center")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the PNG")
    args = parser.parse_args(argv)
    print(f"wrote {draw(args.out)}")


if __name__ == "__main__":
    main()
