"""An FP8 K/V cache: one byte per cached value instead of two, and a float32 scale per layer for K and for V.

float8 e4m3 (``torch.float8_e4m3fn``: 1 sign, 4 exponent, 3 mantissa bits) holds magnitudes from 2^-9 to 448
with a relative step of 1/8 to 1/16: about two significant digits, the precision of the softmax's inputs
after a few thousand keys are summed anyway. Each layer keeps a scale for K and one for V::

    stored = fp8(clamp(x / scale, -448, 448))        (store: m08's store kernel, or ``write`` here)
    read   = float(stored) * scale                    (m08's decode kernel: K's scale multiplies the scores,
                                                       V's the output; the prompt path: ``gather`` here)

Scales are 1.0 unless ``calculate_kv_scales`` asks for them to be set from the first prompt the engine runs
(``max |k| / 200``, ``max |v| / 100``, vLLM's divisors: values up to 2.2x / 4.5x the first prompt's largest still
fit below 448). They live on the device as tensors, so a CUDA graph captured before they are set still reads the
new values when it replays.

**Every reader and writer asks the cache.** m05's torch paths call ``write`` and ``gather``, m08's and m10's
Triton paths pass ``kernel_scales(layer)`` to the kernels: so the FP8 cache is this one class, and the rest of
the engine (scheduler, block manager, graphs) does not know K/V is stored in fewer bits. The block manager
does see more blocks: the same memory budget buys twice the tokens (``kv_bytes_per_token`` halves).
"""

from __future__ import annotations

import torch

from milestones.m05_paged_blocks.paged_attention import PagedKVCache

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
K_SCALE_DIVISOR = 200.0  # calculate_kv_scales: scale = max |k| / 200 (vLLM's K_SCALE_CONSTANT)
V_SCALE_DIVISOR = 100.0  # and max |v| / 100 (vLLM's V_SCALE_CONSTANT)


def to_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x / scale`` as float8_e4m3fn, clamped to +-448 and rounded to nearest (what m08's store kernel does)."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def from_fp8(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (x.float() * scale).to(dtype)


def fp8_unsupported_reason(device: torch.device, attention_backend: str) -> str | None:
    """Why an FP8 K/V cache cannot run on ``device`` with ``attention_backend``, or None if it can."""
    try:
        torch.ones(2, device=device).to(FP8_DTYPE).float()
    except (RuntimeError, TypeError) as error:
        return f"torch {torch.__version__} cannot convert to float8_e4m3fn on {device} ({error})"
    if device.type == "cuda" and attention_backend == "triton":
        capability = torch.cuda.get_device_capability(device)
        if capability < (8, 9):
            return (f"Triton converts float8_e4m3 in hardware from compute capability 8.9 (Ada, Hopper) on; "
                    f"{torch.cuda.get_device_name(device)} is {capability[0]}.{capability[1]} (use "
                    "attention_backend='torch')")
    return None


class FP8PagedKVCache(PagedKVCache):
    """m05's paged cache with its values in float8_e4m3fn; ``dtype`` is the model's (what K/V are read back as).

    ``k_scale`` / ``v_scale``: ``[num_layers]`` float32 on the device; ``k_scales[layer]`` is a one-element view
    (made once, so a step passes a kernel its scale without slicing a tensor per layer).
    """

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        super().__init__(num_layers, num_blocks, block_size, num_kv_heads, head_dim, FP8_DTYPE, device)
        self.compute_dtype = dtype
        # Each layer's scale 16 bytes from the next: a pointer's 16-byte alignment is part of a compiled kernel's
        # signature, so scales 4 bytes apart would compile every kernel twice (aligned and unaligned layers).
        self.k_scale = torch.ones(num_layers, 4, dtype=torch.float32, device=device)[:, 0]
        self.v_scale = torch.ones(num_layers, 4, dtype=torch.float32, device=device)[:, 0]
        self.k_scales = [self.k_scale[i:i + 1] for i in range(num_layers)]
        self.v_scales = [self.v_scale[i:i + 1] for i in range(num_layers)]
        self.layers_without_scales: set[int] = set()

    def calculate_scales_on_first_write(self) -> None:
        """``calculate_kv_scales``: each layer's scales are set from the first K/V ``write`` stores for it."""
        self.layers_without_scales = set(range(len(self.k_scales)))

    @property
    def needs_scales(self) -> bool:
        """True until every layer's scales were calculated (``calculate_kv_scales``)."""
        return bool(self.layers_without_scales)

    def calculate_scales(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """This layer's scales from the K and V about to be stored (once per layer: ``calculate_kv_scales``)."""
        tiny = torch.finfo(torch.float32).tiny
        self.k_scale[layer_idx] = k.detach().abs().amax().float().clamp(min=tiny) / K_SCALE_DIVISOR
        self.v_scale[layer_idx] = v.detach().abs().amax().float().clamp(min=tiny) / V_SCALE_DIVISOR
        self.layers_without_scales.discard(layer_idx)

    def write(self, layer_idx: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """m05's torch store, quantizing (as bytes: ``index_copy_`` has no float8 kernel on a CPU)."""
        if layer_idx in self.layers_without_scales:
            self.calculate_scales(layer_idx, k, v)
        slots = slot_mapping.reshape(-1)
        rows = (slots.shape[0], *self.k.shape[-2:])
        k8 = to_fp8(k.reshape(rows), self.k_scales[layer_idx])
        v8 = to_fp8(v.reshape(rows), self.v_scales[layer_idx])
        self.k[layer_idx].view(torch.uint8).index_copy_(0, slots, k8.view(torch.uint8))
        self.v[layer_idx].view(torch.uint8).index_copy_(0, slots, v8.view(torch.uint8))

    def gather(self, layer_idx: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """m05's gather, dequantized to the model's dtype (the prompt path attends in that dtype)."""
        k, v = super().gather(layer_idx, slots)
        return (from_fp8(k, self.k_scales[layer_idx], self.compute_dtype),
                from_fp8(v, self.v_scales[layer_idx], self.compute_dtype))

    def kernel_scales(self, layer_idx: int) -> dict:
        return {"k_scale": self.k_scales[layer_idx], "v_scale": self.v_scales[layer_idx]}
