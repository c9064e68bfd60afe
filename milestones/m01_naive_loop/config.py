"""``EngineConfig``: which model, on which device, in which dtype. Later milestones subclass it to add knobs.

Every field is checked when a config is built, by one rule read from its type annotation (``check_fields``):

* ``int``: an integer >= 1 (``True`` is no integer here, although Python says ``True == 1``);
* ``float``: a finite number (again not a bool); ``bool``: True or False; ``str``: a string;
* ``X | None``: also None, which means "the engine decides" (each field's docstring says how);
* the field's ``metadata`` narrows that: ``range_of(at_least=0)``, ``range_of(above=0, at_most=1)``,
  ``one_of("auto", "torch")``.

A later milestone adds fields and gets their checks for free; its own ``__post_init__`` adds only the rules that
tie fields together. A bad field is one ``ValueError`` line that names it: ``max_num_seqs must be an integer >= 1,
got True``.
"""

from __future__ import annotations

import math
import numbers
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def range_of(at_least: float | None = None, above: float | None = None, at_most: float | None = None,
             below: float | None = None) -> dict:
    """Field metadata: the bounds a number must keep (an ``int`` without any is ``at_least=1``)."""
    return {"range": {k: v for k, v in dict(at_least=at_least, above=above, at_most=at_most, below=below).items()
                      if v is not None}}


def one_of(*choices: str) -> dict:
    """Field metadata: the values a string may take."""
    return {"choices": choices}


def _describe_range(bounds: dict) -> str:
    """``" >= 1"``, ``" in (0, 1]"``, ``" < 1"``, or ``""`` for no bounds."""
    if len(bounds) == 2:  # an interval: one bound below, one above
        low = f"[{bounds['at_least']}" if "at_least" in bounds else f"({bounds['above']}"
        high = f"{bounds['at_most']}]" if "at_most" in bounds else f"{bounds['below']})"
        return f" in {low}, {high}"
    words = {"at_least": ">=", "above": ">", "at_most": "<=", "below": "<"}
    return "".join(f" {words[key]} {value}" for key, value in bounds.items())


def _in_range(value: float, bounds: dict) -> bool:
    return (value >= bounds.get("at_least", -math.inf) and value > bounds.get("above", -math.inf)
            and value <= bounds.get("at_most", math.inf) and value < bounds.get("below", math.inf))


def check_value(name: str, value: object, annotation: object, metadata: Mapping = types.MappingProxyType({})) -> None:
    """Raise a one-line ``ValueError`` naming ``name`` unless ``value`` fits ``annotation`` and ``metadata``."""
    kinds = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
    optional = type(None) in kinds
    kind = next(k for k in kinds if k is not type(None))
    if value is None and optional:
        return
    bounds = metadata.get("range", {"at_least": 1} if kind is int else {})
    if kind is bool:
        ok, what = isinstance(value, bool), "True or False"
    elif kind is int:
        ok = isinstance(value, numbers.Integral) and not isinstance(value, bool) and _in_range(value, bounds)
        what = "an integer" + _describe_range(bounds)
    elif kind is float:
        ok = (isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
              and _in_range(value, bounds))
        what = ("a number" if bounds else "a finite number") + _describe_range(bounds)
    elif "choices" in metadata:
        ok, what = value in metadata["choices"], "one of " + ", ".join(map(str, metadata["choices"]))
    else:
        ok, what = isinstance(value, kind), "a string" if kind is str else f"a {kind.__name__}"
    if not ok:
        raise ValueError(f"{name} must be {what}{' or None' if optional else ''}, got {value!r}")


def check_fields(config: object) -> None:
    """``check_value`` for every dataclass field of ``config``, its subclasses' fields included."""
    hints = typing.get_type_hints(type(config))
    for f in fields(config):
        check_value(f.name, getattr(config, f.name), hints[f.name], f.metadata)


@dataclass
class EngineConfig:
    """Settings shared by every milestone's engine.

    * ``model``: a preset (``tiny``, ``qwen3-0.6b-random``), a checkpoint directory, or a hub id.
    * ``device``: ``auto`` (CUDA when present, else CPU), ``cpu``, ``cuda``, ``cuda:1`` ...
    * ``dtype``: ``auto`` (bfloat16 on CUDA, float32 on CPU), ``float32``, ``bfloat16``, ``float16``.
    * ``max_model_len``: longest prompt + output accepted; None: the model's ``max_position_embeddings``.
    * ``seed``: seeds random preset weights and the sampler of requests that bring no seed of their own.
    """

    model: str = "tiny"
    device: str = "auto"
    dtype: str = "auto"
    max_model_len: int | None = None
    seed: int = field(default=0, metadata=range_of(at_least=0))

    def __post_init__(self) -> None:
        check_fields(self)

    def resolve_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        try:
            device = torch.device(self.device)
        except RuntimeError as error:
            raise ValueError(f"unknown device {self.device!r}: use auto, cpu, cuda or cuda:N") from error
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {self.device!r} asked for, but torch sees no CUDA GPU here")
        return device

    def resolve_dtype(self, device: torch.device) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if device.type == "cuda" else torch.float32
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}: use auto, {', '.join(DTYPES)}")
        return DTYPES[self.dtype]
