"""The correctness gate: before a GPU call measures an engine, the engine must give transformers' greedy tokens.

Each engine is built in float32 and runs a few requests of the workload (``gate_workload``) driven as the measured
run drives it; its tokens are compared with transformers' greedy ``generate`` in float32 on the same device and
weights. Verdicts per request: ``match``, ``near-tie`` (the first differing token is within ``NEAR_TIE`` of
transformers' top-1 logit: reported, not a failure) or ``diverged`` (the gate fails). docs/benchmarks.md, "The
correctness gate".
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, replace

import torch

from .harness import ensure_tokenizer, free_memory, jsonable, record_failure, time_limit
from .runners import cannot_run, kv_tokens_needed, make_runner, registered_runners
from .workloads import Phase, RequestSpec, Slice, Workload, get_workload, milestone_key

NUM_REQUESTS = 4
OUTPUT_CAP = 24
NEAR_TIE = 1e-4
GATE_DTYPE = "float32"


@dataclass(frozen=True)
class GateItem:
    """One engine (with its config overrides) on one workload."""

    engine: str
    workload: str
    overrides: tuple[tuple[str, object], ...] = ()
    tag: str | None = None

    @property
    def label(self) -> str:
        return f"{milestone_key(self.engine)}{'+' + self.tag if self.tag else ''}:{self.workload}"


def gate_workload(workload: Workload, num_requests: int = NUM_REQUESTS, output_cap: int = OUTPUT_CAP) -> Workload:
    """A few of ``workload``'s requests, in workload order: the first of every group (so ``chunked`` keeps a
    long prompt to inject), then the earliest others; outputs capped at ``output_cap`` tokens."""
    specs = workload.requests
    firsts: dict[str, int] = {}
    for i, spec in enumerate(specs):
        firsts.setdefault(spec.group, i)
    chosen = list(firsts.values())[:num_requests]  # sweeps: one group per length, the shortest first
    chosen += [i for i in range(len(specs)) if i not in chosen][:num_requests - len(chosen)]

    def capped(spec: RequestSpec) -> RequestSpec:  # the length the request is credited: where the client stops it
        length = "max_tokens" if spec.stop_after is None else "stop_after"
        return replace(spec, **{length: min(getattr(spec, length), output_cap)})

    requests = tuple(capped(specs[i]) for i in sorted(chosen))
    reason = f"correctness gate: {len(requests)} requests, outputs capped at {output_cap} tokens"
    return replace(workload, phases=(Phase(f"{workload.name} (gate)", requests),), slice=Slice(len(requests), reason),
                   num_requests_total=workload.num_requests_total, kv_budget_gib=None)


def compare_tokens(ours: list[int], reference: list[int], logits: torch.Tensor) -> dict:
    """Our tokens against transformers' (``logits``: its ``[steps, vocab]`` float32 logits)."""
    if ours == reference:
        return {"verdict": "match"}
    position = next((p for p, (a, b) in enumerate(zip(ours, reference)) if a != b), None)
    if position is None:  # one is a prefix of the other: a length bug, never a tie
        return {"verdict": "diverged", "first_divergence": min(len(ours), len(reference)),
                "note": f"{len(ours)} tokens against transformers' {len(reference)}"}
    row = logits[position].float()
    top = row.topk(2)
    gap_top2 = float(top.values[0] - top.values[1])
    gap_ours = float(row[reference[position]] - row[ours[position]])
    return {"verdict": "near-tie" if gap_ours < NEAR_TIE else "diverged", "first_divergence": position,
            "ours": ours[position], "reference": reference[position], "reference_second": int(top.indices[1]),
            "logit_gap_top2": gap_top2, "logit_gap_ours": gap_ours}


class CorrectnessGate:
    """Checks engines against one float32 transformers model (built on first use, shared by every check)."""

    def __init__(self, model: str, device: str, seed: int = 0, log=print, num_requests: int = NUM_REQUESTS,
                 output_cap: int = OUTPUT_CAP) -> None:
        self.model, self.device, self.seed = model, device, seed
        self.num_requests, self.output_cap = num_requests, output_cap
        self.log = log or (lambda _msg: None)
        self._hf = None
        self.reference = functools.cache(self._reference)  # each (prompt, num_tokens) asked once per call

    @property
    def has_reference(self) -> bool:  # the transformers model is built (the first check pays for it)
        return self._hf is not None

    def _reference(self, prompt: tuple[int, ...], num_tokens: int) -> tuple[list[int], torch.Tensor]:
        """transformers' greedy tokens for one unpadded prompt, and its logits at every step (on the CPU)."""
        if self._hf is None:
            from milestones.m01_naive_loop.config import EngineConfig

            from .baselines import build_hf_model

            self._hf = build_hf_model(self.model, EngineConfig(device=self.device).resolve_device(), torch.float32,
                                      self.seed)
        ids = torch.tensor([list(prompt)], device=self._hf.device)
        with torch.inference_mode():
            out = self._hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=num_tokens,
                                    do_sample=False, eos_token_id=None, pad_token_id=0, output_logits=True,
                                    return_dict_in_generate=True)  # no EOS: exactly num_tokens tokens
        tokens = out.sequences[0, len(prompt):].tolist()
        return tokens, torch.stack([step[0] for step in out.logits]).float().cpu()

    def check(self, item: GateItem, time_limit_s: float | None = None) -> dict:
        """Gate one engine on one workload; returns the record that goes into ``suite.json``."""
        record = {"label": item.label, "engine": milestone_key(item.engine), "workload": item.workload,
                  "overrides": dict(item.overrides), "dtype": GATE_DTYPE, "device": self.device, "status": None,
                  "error": None, "mode": None, "requests": []}
        began = time.perf_counter()
        try:
            with time_limit(time_limit_s):
                workload = gate_workload(get_workload(item.workload), self.num_requests, self.output_cap)
                runner_cls = registered_runners().get(item.engine)
                skip = (getattr(runner_cls, "gate_skip_reason", "a registered runner: not gated") if runner_cls
                        else cannot_run(item.engine, workload, self.model))
                if skip is not None:
                    record.update(status="skipped", error=skip)
                else:
                    self._run(item, workload, record)
        except Exception as error:  # noqa: BLE001 - an engine that cannot even run fails its gate
            record_failure(record, error)
            if record["status"] == "timeout":  # a gate record is pass, near-tie, fail, error or skipped
                record.update(status="error", error="gate " + record["error"])
        finally:
            free_memory()
            record["wall_time_s"] = time.perf_counter() - began
        self.log(f"[gate {item.label}] {record['status']}" + (f": {record['error']}" if record["error"] else ""))
        return jsonable(record)

    def _run(self, item: GateItem, workload: Workload, record: dict) -> None:
        ensure_tokenizer()
        runner = make_runner(item.engine, workload, model=self.model, device=self.device, dtype=GATE_DTYPE,
                             seed=self.seed, overrides=dict(item.overrides) or None,
                             kv_tokens=kv_tokens_needed(workload))
        try:
            outputs = runner.run_phase(workload.phases[0], use_tqdm=False).outputs
            record["mode"] = runner.mode
        finally:
            runner.close()
        for index, (spec, out) in enumerate(zip(workload.requests, outputs)):
            reference, logits = self.reference(spec.prompt_token_ids, spec.output_len)
            verdict = compare_tokens(list(out.token_ids), reference, logits)
            record["requests"].append({"index": index, "group": spec.group, "prompt_len": spec.prompt_len,
                                       "output_len": spec.output_len, **verdict})
        verdicts = {r["verdict"] for r in record["requests"]}
        record["status"] = "fail" if "diverged" in verdicts else "near-tie" if "near-tie" in verdicts else "pass"

    def close(self) -> None:
        self._hf = None
        self.reference.cache_clear()
        free_memory()


def gate_failed(records: list[dict]) -> list[dict]:
    """The records that fail the call: a divergence beyond a near-tie, or an engine that could not run."""
    return [r for r in records if r.get("status") in ("fail", "error")]
