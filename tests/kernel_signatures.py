"""One compiled Triton kernel per kernel variant: record every launch, captured or eager, and compare signatures.

Triton compiles a kernel per *signature* (each pointer's dtype and whether its address is a multiple of 16 bytes,
each integer's being 1 or a multiple of 16) and per value of its constexprs. Capturing CUDA graphs compiles only
what the graphs launch, so an eager step that hands a kernel another signature compiles a new kernel in the middle
of serving. ``TritonLaunches`` records, for each launch at ``DeviceKernel.__getitem__``, the kernel, whether it ran
inside what a GPU records in a graph, its constexprs (the *variant*: a tile size, split or direct, an FP8 cache) and
its signature; ``differing`` lists the arguments whose signature differs within one variant. Two variants are two
kernels by design (the split regime chosen from a context bound, say), whatever their arguments.

Used by tests/test_m10_cuda_graphs.py, tests/test_m12_async_scheduling.py and tests/test_m13_quantization.py.
"""

from __future__ import annotations

import pytest
import torch


def triton_signature(kernel, args: tuple, kwargs: dict) -> tuple:
    """What Triton's launcher keys a compiled kernel on, besides the constexprs: for each argument a tensor's dtype
    and whether its address is a multiple of 16 bytes, an integer's being 1 or a multiple of 16 (unless the kernel
    opts out: ``do_not_specialize``, ``do_not_specialize_on_alignment``), else the argument's type."""
    bound = dict(zip((p.name for p in kernel.params), args)) | kwargs
    signature = []
    for param in kernel.params:
        value = bound.get(param.name)
        if param.is_constexpr:  # the wrapper's launch configuration (a tile size, split or not), not a type
            continue
        if isinstance(value, torch.Tensor):
            aligned = None if param.do_not_specialize_on_alignment else value.data_ptr() % 16 == 0
            signature.append((param.name, value.dtype, aligned))
        elif isinstance(value, int) and not isinstance(value, bool) and not param.do_not_specialize:
            signature.append((param.name, "int", value == 1, value % 16 == 0))
        else:
            signature.append((param.name, type(value).__name__))
    return tuple(signature)


def triton_variant(kernel, args: tuple, kwargs: dict) -> tuple:
    """The constexprs of a launch (``TILE``, ``SPLIT``, ``KV_FP8``, ...): one compiled kernel each, by design."""
    bound = dict(zip((p.name for p in kernel.params), args)) | kwargs
    return tuple((p.name, bound.get(p.name)) for p in kernel.params if p.is_constexpr)


class TritonLaunches:
    """Every Triton launch of a test, as ``launched[kernel name][variant] = {(where, signature), ...}``, ``where``
    being "captured" inside a method patched by ``in_graphs`` (what a GPU records in a graph) and "eager" elsewhere.

    Skips the test under ``TRITON_INTERPRET=1``: the kernels are then interpreters, which Triton never specialises.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import triton

        from milestones.m08_triton_kernel.device_kernel import DeviceKernel

        if triton.knobs.runtime.interpret:
            pytest.skip("TRITON_INTERPRET=1: the kernels are interpreters, which Triton never specialises")
        self.monkeypatch, self.captured = monkeypatch, 0
        self.launched: dict[str, dict[tuple, set]] = {}
        original = DeviceKernel.__getitem__

        def launching(kernel, grid):
            launch = original(kernel, grid)

            def recording(*args, **kwargs):
                where = "captured" if self.captured else "eager"
                variants = self.launched.setdefault(kernel.__name__, {})
                variants.setdefault(triton_variant(kernel.compiled, args, kwargs), set()).add(
                    (where, triton_signature(kernel.compiled, args, kwargs)))
                return launch(*args, **kwargs)

            return recording

        monkeypatch.setattr(DeviceKernel, "__getitem__", launching)

    def in_graphs(self, cls, name: str) -> None:
        """Launches inside ``cls.name`` count as captured (on a GPU that method is what a graph records)."""
        method = getattr(cls, name)

        def recording(*args, **kwargs):
            self.captured += 1
            try:
                return method(*args, **kwargs)
            finally:
                self.captured -= 1

        self.monkeypatch.setattr(cls, name, recording)

    def differing(self) -> dict[str, list]:
        """kernel -> for each argument whose signature differs within a variant: (where, its entry) of every launch."""
        found = {}
        for name, variants in self.launched.items():
            for launches in variants.values():
                wheres, signatures = zip(*launches)
                for entries in zip(*signatures):  # one argument at a time
                    if len(set(entries)) > 1:
                        found.setdefault(name, []).append(sorted(set(zip(wheres, entries)), key=str))
        return found

    def in_both(self) -> set[str]:
        """The kernels with a variant launched both from the graphs and eagerly (so the check compared them)."""
        return {name for name, variants in self.launched.items()
                if any({"captured", "eager"} <= {where for where, _ in launches} for launches in variants.values())}

    def wheres(self, name: str) -> dict[tuple, set[str]]:
        """For each variant of a kernel: where it was launched."""
        return {variant: {where for where, _ in launches} for variant, launches in self.launched.get(name, {}).items()}
