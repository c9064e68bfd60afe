"""Does the suite catch the bugs it should? Reintroduce each known bug and see which tests fail.

A test suite is only as good as the bugs it catches. This script keeps a list of small, realistic bugs
("mutations") in the milestones' code. For each one it copies the repository to a scratch directory, applies the
bug there, runs the tests that should notice, and reports which tests failed. A mutation that no test catches is a
hole in the suite. The checkout itself is never modified.

    python tests/mutation_check.py                       # every mutation, every test that catches it (~7 CPU-minutes)
    python tests/mutation_check.py --quick               # stop each run at its first failing test
    python tests/mutation_check.py qk-norm-swapped       # one of them
    python tests/mutation_check.py --list

Exit status 1 when some mutation went uncaught, or when a mutation no longer applies (the code it edits moved:
update the mutation, do not drop it). Run it from the repository root with the project's Python.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COPIED = ("milestones", "tests", "pyproject.toml")  # all the selected tests need


@dataclass(frozen=True)
class Mutation:
    name: str
    bug: str  # what the mutation does, in words
    path: str  # the file it edits, relative to the repository root
    edits: tuple[tuple[str, str], ...]  # (original text, buggy text): each original must occur exactly once
    tests: tuple[str, ...]  # the test files (or node ids) that should catch it


MODEL = "milestones/m01_naive_loop/model.py"
MODEL_TESTS = ("tests/test_m01_loader.py", "tests/test_m01_engine.py", "tests/test_m02_kv_cache.py")
BATCH_TESTS = ("tests/test_m03_static_batching.py", "tests/test_m04_continuous_batching.py")

MUTATIONS = (
    Mutation(
        "rmsnorm-ignores-weight", "RMSNorm normalises but never multiplies by its weight", MODEL,
        (("F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)", "F.rms_norm(x, (x.shape[-1],), None, self.eps)"),),
        MODEL_TESTS,
    ),
    Mutation(
        "qk-norm-swapped", "the attention applies k_norm to q and q_norm to k", MODEL,
        (("q = self.q_norm(self.q_proj(x)", "q = self.k_norm(self.q_proj(x)"),
         ("k = self.k_norm(self.k_proj(x)", "k = self.q_norm(self.k_proj(x)")),
        MODEL_TESTS,
    ),
    Mutation(
        "padded-prefill-position", "a padded row's prompt positions start at 1 instead of 0 (m03 and m04 prefill)",
        "milestones/m03_static_batching/padded_batch.py",
        (("positions = (slots - pad_lens[:, None]).clamp(min=0)",
          "positions = (slots - pad_lens[:, None] + (pad_lens[:, None] > 0)).clamp(min=0)"),),
        BATCH_TESTS,
    ),
    Mutation(
        "padded-decode-position", "m03's decode steps give a padded row the position one too far",
        "milestones/m03_static_batching/engine.py",
        (("positions = (slot - padded.pad_lens)[:, None]",
          "positions = (slot - padded.pad_lens + (padded.pad_lens > 0))[:, None]"),),
        BATCH_TESTS,
    ),
    Mutation(
        "padded-rope-shift", "a padded row's RoPE positions are all one too far, in prefill and decode alike (m03)",
        "milestones/m03_static_batching/engine.py",
        (("hidden = self.model(padded.input_ids, padded.positions,",
          "hidden = self.model(padded.input_ids, padded.positions + (padded.pad_lens[:, None] > 0),"),
         ("positions = (slot - padded.pad_lens)[:, None]",
          "positions = (slot - padded.pad_lens + (padded.pad_lens > 0))[:, None]")),
        BATCH_TESTS,
    ),
    Mutation(
        "m04-prefill-rope-position", "m04's prefill rotates a padded row's tokens one position too far "
        "(its K/V still land in the right slots)", "milestones/m04_continuous_batching/engine.py",
        (("hidden = self.model(padded.input_ids, padded.positions, PrefillAttention(",
          "hidden = self.model(padded.input_ids, padded.positions + (padded.pad_lens[:, None] > 0), "
          "PrefillAttention("),),
        BATCH_TESTS,
    ),
    Mutation(
        "m04-rope-shift", "m04 rotates every token one position too far, in prefill and decode alike (K/V slots "
        "unchanged)", "milestones/m04_continuous_batching/engine.py",
        (("hidden = self.model(padded.input_ids, padded.positions, PrefillAttention(",
          "hidden = self.model(padded.input_ids, padded.positions + 1, PrefillAttention("),
         ("hidden = self.model(ids, positions, attention)", "hidden = self.model(ids, positions + 1, attention)")),
        ("tests/test_m04_continuous_batching.py",),
    ),
    Mutation(
        "m04-decode-position", "m04's decode gives the new token the position one too far",
        "milestones/m04_continuous_batching/engine.py",
        (("positions = (lengths - 1)[:, None]", "positions = lengths[:, None]"),),
        ("tests/test_m04_continuous_batching.py",),
    ),
    Mutation(
        "fcfs-overtake", "when the head of the queue does not fit, a later request that fits is admitted instead",
        "milestones/m04_continuous_batching/scheduler.py",
        (("""            head = self.waiting[0]
            if self.allocator.allocate(head.request_id, kv_slots_needed(head)) is None:
                break  # the head does not fit; FCFS means nobody overtakes it
            admitted.append(self.waiting.popleft())""",
          """            fits = next((r for r in self.waiting
                         if self.allocator.allocate(r.request_id, kv_slots_needed(r)) is not None), None)
            if fits is None:
                break
            self.waiting.remove(fits)
            admitted.append(fits)"""),),
        ("tests/test_m04_scheduler.py", "tests/test_m04_continuous_batching.py"),
    ),
    Mutation(
        "prefix-hash-unchained", "a block's hash ignores its parent, so equal blocks after different prefixes share "
        "one name (the later one is never found)", "milestones/m06_prefix_cache/block_manager.py",
        (("return hash((parent_hash, token_ids))", "return hash(token_ids)"),),
        ("tests/test_m06_prefix_cache.py",),
    ),
    Mutation(
        "decode-scale-head-dim-128", "m08's engine hands the decode kernel Qwen3-0.6B's softmax scale, "
        "1/sqrt(128), whatever the model's head_dim", "milestones/m08_triton_kernel/attention.py",
        (("q.shape[-1] ** -0.5, max_context_len=self.max_context_len,",
          "128 ** -0.5, max_context_len=self.max_context_len,"),),
        ("tests/test_m08_engine.py",),
    ),
    Mutation(
        "detok-drops-partial-char", "when a request finishes inside a character, the detokenizer drops "
        "the bytes it held back instead of sending them", "milestones/m09_server/detokenizer.py",
        (("if len(window_text) > len(prefix_text) and (complete or flush):",
          "if len(window_text) > len(prefix_text) and complete:"),),
        ("tests/test_m09_detokenizer.py",
         "tests/test_m09_server.py::test_a_completion_cut_inside_a_character_is_what_decode_gives"),
    ),
    Mutation(
        "usage-prompt-minus-cached", "the server reports prompt_tokens minus the tokens found in the prefix cache",
        "milestones/m09_server/serving.py",
        (("return usage(self.prompt_tokens, self.completion_tokens, self.cached_tokens)",
          "return usage(self.prompt_tokens - self.cached_tokens, self.completion_tokens, self.cached_tokens)"),),
        ("tests/test_m09_server.py::test_usage_counts_the_whole_prompt_after_a_prefix_cache_hit",),
    ),
    Mutation(
        "tokenize-on-the-loop", "the server tokenizes a completion's prompt on the event loop, where every other "
        "request waits for it", "milestones/m09_server/serving.py",
        (("ids = await self.off_loop(self.tokenize, body.prompt) if", "ids = self.tokenize(body.prompt) if"),),
        ("tests/test_m09_hostile_clients.py::test_a_prompt_being_tokenized_delays_only_itself",),
    ),
    Mutation(
        "body-limit-unenforced", "the body limit counts nothing: a 30 MB body reaches FastAPI's JSON parser",
        "milestones/common/http_guards.py",
        (("if length is not None and length.isdigit() and int(length) > self.max_bytes:", "if False:"),
         ("            if size > self.max_bytes:\n", "            if False:\n")),
        ("tests/test_m09_hostile_clients.py::test_a_30_mb_body_gets_413_while_health_and_a_stream_go_on",),
    ),
    Mutation(
        "graph-ladder-ignores-cap", "m10 captures graphs up to max_num_seqs even when max_cuda_graph_batch_size "
        "is smaller", "milestones/m10_cuda_graphs/engine.py",
        (("max_batch = self.config.max_cuda_graph_batch_size or self.config.max_num_seqs",
          "max_batch = self.config.max_num_seqs"),),
        ("tests/test_m10_cuda_graphs.py::test_the_runner_is_built_from_the_config",),
    ),
    Mutation(
        "graph-tables-too-narrow", "m10's static block tables hold floor(max_model_len / block_size) blocks, "
        "one too few for the longest sequences", "milestones/m10_cuda_graphs/engine.py",
        (("max_blocks_per_seq = -(-self.max_model_len // self.config.block_size)",
          "max_blocks_per_seq = self.max_model_len // self.config.block_size"),),
        ("tests/test_m10_cuda_graphs.py::test_the_runner_is_built_from_the_config",),
    ),
    Mutation(
        "m07-budget-below-seats", "m07 accepts a token budget smaller than max_num_seqs (vLLM refuses it)",
        "milestones/m07_chunked_prefill/config.py",
        (("if self.max_num_batched_tokens < self.max_num_seqs:", "if False:"),),
        ("tests/test_m07_chunked_prefill.py",),
    ),
    Mutation(
        "m13-int4-nibbles-swapped", "m13's int4 unpacking reads a byte's high nibble as element j and the low one as "
        "element j + 64", "milestones/m13_quantization/weight_unpacking.py",
        (("        lo = ((b & 0xF) | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + 8.0)\n"
          "        hi = ((b >> 4) | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + 8.0)",
          "        lo = ((b >> 4) | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + 8.0)\n"
          "        hi = ((b & 0xF) | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + 8.0)"),),
        ("tests/test_m13_quantization.py",),
    ),
    Mutation(
        "m13-silu-epilogue-pairs-swapped", "m13's SiLU * up epilogue takes W's up row as the gate and the gate row "
        "as up", "milestones/m13_quantization/gemv_epilogues.py",
        (("    return pair + (lanes % 2) * N, pair < N", "    return pair + (1 - lanes % 2) * N, pair < N"),),
        ("tests/test_m13_quantization.py::test_gemv_epilogues_finish_what_m12s_kernels_would",),
    ),
    Mutation(
        "m13-norm-epilogue-count-kept", "m13's add + norm epilogue never sets its count back to zero: the next "
        "launch's last block is never the last", "milestones/m13_quantization/gemv_epilogues.py",
        (("        tl.atomic_xchg(count_ptr, 0, sem=\"relaxed\")  # ready for the next launch (or graph replay)",
          "        pass"),),
        ("tests/test_m13_quantization.py::test_gemv_epilogues_finish_what_m12s_kernels_would",),
    ),
    Mutation(
        "m13-fp8-decode-drops-v-scale", "m08's decode kernel reads an FP8 cache but never multiplies by V's scale",
        "milestones/m08_triton_kernel/paged_decode_kernel.py",
        (("        out = out * tl.load(v_scale_ptr)", "        out = out"),),
        ("tests/test_m13_quantization.py",),
    ),
    Mutation(
        "m13-slices-added-in-reverse", "the readers of a GEMV's slices add them last slice first: other float32 "
        "sums than the GEMV's own", "milestones/m13_quantization/sliced_sums.py",
        (("    total = tl.load(first_slice, mask=mask, other=0.0)",
          "    total = tl.load(first_slice + (SLICES - 1) * stride_slice, mask=mask, other=0.0)"),
         ("        total += tl.load(first_slice + s * stride_slice, mask=mask, other=0.0)",
          "        total += tl.load(first_slice + (SLICES - 1 - s) * stride_slice, mask=mask, other=0.0)")),
        ("tests/test_m13_integer_dots.py::test_the_readers_add_the_slices_in_slice_order",),
    ),
    Mutation(
        "m13-rope-writes-padding-rows", "RoPE writing K/V into the cache ignores a padding row's slot of -1: it "
        "writes one slot before the cache", "milestones/m13_quantization/kv_at_rope.py",
        (("    keep = first < tl.where(slot >= 0, HALF, 0)", "    keep = first < HALF"),),
        ("tests/test_m13_kv_at_rope.py::test_rope_leaves_the_cache_as_the_store_after_it_does",),
    ),
    Mutation(
        "tp-workers-take-placeholder-ids", "m14's rank 0 never broadcasts the input ids it filled from the previous "
        "step's samples: the workers compute decodes from placeholders", "milestones/m14_tensor_parallel/engine.py",
        (("if self.parallel is not None and self.step_ids_on_device:", "if False:"),),
        ("tests/test_m14_tensor_parallel.py::"
         "test_tokens_equal_transformers_under_chunking_prefix_hits_and_preemption",),
    ),
    Mutation(
        "tp-random-shards-seeded-per-rank", "each rank draws a random preset from its own seed: TP=2 no longer holds "
        "TP=1's weights", "milestones/m14_tensor_parallel/sharded_loader.py",
        (("source = RandomShards(seed, ", "source = RandomShards(seed + rank, "),),
        ("tests/test_m14_tensor_parallel.py::"
         "test_a_random_presets_shards_are_tp1s_weights_and_collection_stops_the_workers",),
    ),
)


def apply(mutation: Mutation, root: Path) -> None:
    path = root / mutation.path
    text = path.read_text()
    for original, buggy in mutation.edits:
        count = text.count(original)
        if count != 1:
            raise ValueError(f"{mutation.name}: expected the text once in {mutation.path}, found it {count} times: "
                             f"{original.strip()[:70]!r}")
        text = text.replace(original, buggy)
    path.write_text(text)


def scratch_copy(destination: Path) -> None:
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, destination / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy(source, destination / name)


def failing_tests(mutation: Mutation, quick: bool = False) -> list[str]:
    """Run the mutation's tests on a mutated scratch copy; return the ids of the tests that failed or errored."""
    with tempfile.TemporaryDirectory(prefix=f"mutation-{mutation.name}-") as scratch:
        root = Path(scratch)
        scratch_copy(root)
        apply(mutation, root)
        where = subprocess.run([sys.executable, "-c", "import milestones; print(milestones.__file__)"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
        if not Path(where).is_relative_to(root):  # the checkout's code would be tested, not the mutant
            raise RuntimeError(f"the scratch copy imports milestones from {where}, not from {root}")
        result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE",
                                 *(["-x"] if quick else []), *mutation.tests], cwd=root, capture_output=True, text=True)
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", result.stdout, flags=re.MULTILINE)
    if result.returncode not in (0, 1) or (result.returncode == 1 and not failed):
        raise RuntimeError(f"{mutation.name}: pytest could not run (exit {result.returncode}):\n{result.stdout[-2000:]}"
                           f"{result.stderr[-2000:]}")
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help="mutations to check (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--quick", action="store_true", help="stop each mutation's run at its first failing test")
    args = parser.parse_args(argv)
    by_name = {m.name: m for m in MUTATIONS}
    if args.list:
        for m in MUTATIONS:
            print(f"{m.name:28} {m.bug}")
        return 0
    unknown = [n for n in args.names if n not in by_name]
    if unknown:
        parser.error(f"unknown mutation(s) {', '.join(unknown)}; see --list")
    uncaught = []
    for mutation in [by_name[n] for n in args.names] or MUTATIONS:
        failed = failing_tests(mutation, args.quick)
        print(f"{mutation.name}: {mutation.bug}")
        print(f"  caught by {len(failed)} test(s)" if failed else "  NOT CAUGHT")
        for test in failed:
            print(f"    {test}")
        if not failed:
            uncaught.append(mutation.name)
    if uncaught:
        print(f"uncaught: {', '.join(uncaught)}")
    return 1 if uncaught else 0


if __name__ == "__main__":
    sys.exit(main())
