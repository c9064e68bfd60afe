"""Launch a Triton kernel where its tensors are: compiled for a GPU, in Triton's interpreter on a CPU.

``@triton.jit`` makes one of two objects when a kernel is *defined*: a ``JITFunction`` (compiled for the GPU
at its first launch) or, when the environment says ``TRITON_INTERPRET=1``, an ``InterpretedFunction`` (run by
numpy on the CPU: exact, and very slow, which is how the tests check the kernels on a laptop). Choosing at
definition would tie a whole process to one device, so ``device_kernel`` keeps both and chooses at *launch*,
from the device of the tensors it is given::

    @device_kernel
    @triton.jit
    def _my_kernel(x_ptr, ...): ...

    _my_kernel[grid](x, ...)   # x on CUDA: the compiled kernel; x on a CPU: the interpreter

One detail makes the interpreter work in a process where ``triton`` was imported without that variable (by
transformers, say): Triton's own helpers (``tl.max``, ``tl.sum``, ``tl.zeros``, ``tl.cdiv``) are ``@triton.jit``
functions too, and a ``JITFunction`` refuses to be called outside a compiled kernel. During an interpreted launch
they are interpreted as well, as Triton's interpreter already patches ``triton.language`` for the length of a
launch; a lock keeps interpreted launches one at a time, since both patches are process-wide.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from contextlib import contextmanager

import torch
import triton
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

_INTERPRETER_LOCK = threading.Lock()


class InterpreterUnavailable(ValueError):
    """This Triton's interpreter cannot run the kernels here (a ``ValueError``: a request the machine refuses)."""


@functools.cache
def interpreter_problem() -> str | None:
    """Why Triton's interpreter cannot run these kernels in this environment, or None.

    Triton 3.6's interpreter reads a loop bound loaded from memory (``range(start, end, TILE)``) as a 1-element
    array, which numpy 2 refuses to turn into an int; Triton 3.7 reads it as a scalar, and numpy 1 let it pass."""
    import numpy

    def numbers(text: str) -> tuple[int, ...]:
        return tuple(int(part) for part in text.split(".")[:2] if part.isdigit())

    if numbers(triton.__version__) < (3, 7) and numbers(numpy.__version__) >= (2,):
        return (f"Triton {triton.__version__}'s interpreter cannot run these kernels beside numpy "
                f"{numpy.__version__} (Triton 3.7 or later can, or numpy < 2): on a CPU use attention_backend='torch'")
    return None


_INTERPRETED: dict[int, InterpretedFunction] = {}  # id(JITFunction) -> its interpreted twin (a JITFunction's
                                                   # hash compiles its source, so it cannot be a key itself)


def _interpreted(function: JITFunction) -> InterpretedFunction:
    twin = _INTERPRETED.get(id(function))
    if twin is None:
        twin = _INTERPRETED[id(function)] = InterpretedFunction(function.fn)
    return twin


@contextmanager
def _jit_calls_interpreted():
    """Inside: calling any ``JITFunction`` (``tl.max`` inside an interpreted kernel) runs its interpreted twin."""
    with _INTERPRETER_LOCK:
        compiled_call = JITFunction.__call__
        JITFunction.__call__ = lambda self, *args, **kwargs: _interpreted(self)(*args, **kwargs)
        try:
            yield
        finally:
            JITFunction.__call__ = compiled_call


class DeviceKernel:
    """A ``@triton.jit`` kernel that launches compiled on CUDA tensors and interpreted on CPU tensors.

    ``kernel[grid](*args, **kwargs)`` reads the device of the first tensor argument. ``compiled`` is the
    ``JITFunction`` (``tests/compile_for_gpu.py`` compiles it for a GPU without one).
    """

    def __init__(self, kernel: JITFunction | InterpretedFunction) -> None:
        self.compiled = kernel
        # TRITON_INTERPRET=1 in the environment: Triton made an interpreter of it; it then runs so everywhere.
        self.always_interpreted = isinstance(kernel, InterpretedFunction)
        self.__name__ = getattr(kernel, "__name__", "kernel")

    def runs_interpreted(self, device: torch.device) -> bool:
        return self.always_interpreted or device.type != "cuda"

    def __getitem__(self, grid) -> Callable[..., None]:
        def launch(*args, **kwargs) -> None:
            # The first argument is a tensor in every kernel here; a few attribute reads per launch, no more.
            device = args[0].device if isinstance(args[0], torch.Tensor) else next(
                a.device for a in args if isinstance(a, torch.Tensor))
            if not self.runs_interpreted(device):
                self.compiled[grid](*args, **kwargs)
                return
            problem = interpreter_problem()
            if problem is not None:
                raise InterpreterUnavailable(problem)
            kernel = self.compiled if self.always_interpreted else _interpreted(self.compiled)
            with _jit_calls_interpreted():
                kernel[grid](*args, **kwargs)

        return launch


def runs_interpreted(device: torch.device) -> bool:
    """Whether a kernel launched on ``device`` runs in Triton's interpreter: off CUDA, or everywhere when the
    environment asked for the interpreter (``TRITON_INTERPRET=1``)."""
    return device.type != "cuda" or bool(triton.knobs.runtime.interpret)


def device_kernel(kernel: JITFunction | InterpretedFunction) -> DeviceKernel:
    """Decorator (above ``@triton.jit``): the kernel chooses compiled or interpreted at each launch."""
    return DeviceKernel(kernel)

