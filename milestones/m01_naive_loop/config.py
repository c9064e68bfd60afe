"""``EngineConfig``: which model, on which device, in which dtype. Later milestones subclass it to add knobs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class EngineConfig:
    """Settings shared by every milestone's engine.

    * ``model``: a preset (``tiny``, ``qwen3-0.6b-random``), a checkpoint directory, or a hub id.
    * ``device``: ``auto`` (CUDA when present, else CPU), ``cpu``, ``cuda``, ``cuda:1`` ...
    * ``dtype``: ``auto`` (bfloat16 on CUDA, float32 on CPU), ``float32``, ``bfloat16``, ``float16``.
    * ``max_model_len``: longest prompt + output accepted; defaults to the model's ``max_position_embeddings``.
    * ``seed``: seeds random preset weights and the sampler of requests that bring no seed of their own.
    """

    model: str = "tiny"
    device: str = "auto"
    dtype: str = "auto"
    max_model_len: int | None = None
    seed: int = 0

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
