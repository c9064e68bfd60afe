"""m12's fused decoder, with each quantized matmul finishing the small kernel after it.

At batch 1 the decode step's CUDA graph launches, per layer, four GEMVs and seven small kernels; three of those
follow a GEMV directly and need only its outputs: the add + RMSNorm after ``o_proj`` and after ``down_proj``,
and SiLU * up after ``gate_up_proj``. Here those three are done by the GEMV's finishing programs
(``gemv_epilogues.py``), through m12's two seams::

    m12:  hidden = add_rms_norm(o_proj(heads), residual, norm)        two kernels
    here: hidden = quantized_add_rms_norm(heads, o_proj's W, residual, norm)   one kernel

    m12:  act = silu_and_mul(gate_up_proj(hidden))                    two kernels
    here: act = quantized_silu_and_mul(hidden, gate_up_proj's W)      one kernel

Three kernels fewer per layer (108 of a Qwen3-8B step's 401). Beyond the GEMV's rows (``GEMV_MAX_M``) the
same calls run the matmul and then m12's kernel; an unquantized layer, or one on the torch reference, keeps
m12's path.
"""

from __future__ import annotations

import torch
from torch import nn

from milestones.m12_async_scheduling.fused_layers import FusedCausalLM, FusedQwen3Model

from .matmul_kernels import quantized_add_rms_norm, quantized_silu_and_mul
from .quantize import QuantizedLinear


def _on_triton(proj: nn.Module) -> bool:
    return isinstance(proj, QuantizedLinear) and proj.kernel == "triton" and proj.bias is None


class EpilogueQwen3Model(FusedQwen3Model):
    """``FusedQwen3Model`` whose quantized ``o_proj``, ``down_proj`` and ``gate_up_proj`` finish the add + norm or
    SiLU * up in their own kernel."""

    def project_add_norm(self, proj: nn.Module, x: torch.Tensor, residual: torch.Tensor,
                         norm: nn.Module) -> torch.Tensor:
        if not _on_triton(proj):
            return super().project_add_norm(proj, x, residual, norm)
        return quantized_add_rms_norm(x, proj.qweight, proj.scales, proj.method, residual, norm.weight, norm.eps)

    def gate_up_silu(self, proj: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if not _on_triton(proj):
            return super().gate_up_silu(proj, x)
        return quantized_silu_and_mul(x, proj.qweight, proj.scales, proj.method)


class EpilogueCausalLM(FusedCausalLM):
    decoder_class = EpilogueQwen3Model
