"""m12's fused decoder, with each quantized matmul finishing the small kernel after it.

At batch 1 the decode step's CUDA graph launches, per layer, four GEMVs and seven small kernels; three of those
follow a GEMV directly and need only its outputs: the add + RMSNorm after ``o_proj`` and after ``down_proj``,
and SiLU * up after ``gate_up_proj``. Here those three are done by the GEMV's finishing programs
(``gemv_epilogues.py``), through m12's two seams::

    m12:  hidden = add_rms_norm(o_proj(heads), residual, norm)        two kernels
    here: hidden = quantized_add_rms_norm(heads, o_proj's W, residual, norm)   one kernel

    m12:  act = silu_and_mul(gate_up_proj(hidden))                    two kernels
    here: act = quantized_silu_and_mul(hidden, gate_up_proj's W)      one kernel

At one row, three kernels fewer per layer (108 of a Qwen3-8B step's 400); at two, one (SiLU * up: the norm
stays m12's kernel, below). Beyond the GEMV's rows (``GEMV_MAX_M``) the
same calls run the matmul and then m12's kernel; an unquantized layer, or one on the torch reference, keeps
m12's path.

Which epilogues pay was measured on the H200 (calls 57-58, ``docs/m13-quantization.md``, "A seventh guess"):
SiLU * up costs its GEMV almost nothing and saves a kernel (gate_up 22.2 µs a launch against 23.6 with m12's
kernel after it, batch 1); the norm costs the GEMV about what m12's kernel costs (its last program waits for
the count, then loads and stores a row: a chain of latencies), so it pays only in the kernel boundaries it
saves, at one row; at two rows it cost 2.3 µs a launch more, and the step keeps m12's kernel there
(``NORM_EPILOGUE_MAX_ROWS``).
"""

from __future__ import annotations

import torch
from torch import nn

from milestones.m12_async_scheduling.fused_layers import FusedCausalLM, FusedQwen3Model

from .epilogue_matmuls import quantized_add_rms_norm, quantized_silu_and_mul
from .quantize import QuantizedLinear


NORM_EPILOGUE_MAX_ROWS = 1  # the add + norm epilogue's rows of x, at most (measured: above)


def _on_triton(proj: nn.Module) -> bool:
    return isinstance(proj, QuantizedLinear) and proj.kernel == "triton" and proj.bias is None


class EpilogueQwen3Model(FusedQwen3Model):
    """``FusedQwen3Model`` whose quantized ``gate_up_proj`` finishes SiLU * up in its own kernel, and ``o_proj``
    and ``down_proj`` the add + norm at one row."""

    def project_add_norm(self, proj: nn.Module, x: torch.Tensor, residual: torch.Tensor,
                         norm: nn.Module) -> torch.Tensor:
        if not _on_triton(proj) or x.shape[0] > NORM_EPILOGUE_MAX_ROWS:
            return super().project_add_norm(proj, x, residual, norm)
        return quantized_add_rms_norm(x, proj.qweight, proj.scales, proj.method, residual, norm.weight, norm.eps)

    def gate_up_silu(self, proj: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if not _on_triton(proj):
            return super().gate_up_silu(proj, x)
        return quantized_silu_and_mul(x, proj.qweight, proj.scales, proj.method)


class EpilogueCausalLM(FusedCausalLM):
    decoder_class = EpilogueQwen3Model
