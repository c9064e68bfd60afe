"""The measuring instrument: seeded workloads, runners for every milestone and for transformers baselines, a
harness that times one run, interleaved comparisons, a float32 correctness gate, and one-call GPU suites.
See ``docs/benchmarks.md``; from a shell: ``python -m benchmarks.run --milestone m02 --workload single``.
"""

from .compare import Member, run_comparison
from .harness import run_benchmark, run_many, save_result
from .workloads import WORKLOADS, get_workload

__all__ = ["WORKLOADS", "Member", "get_workload", "run_benchmark", "run_comparison", "run_many", "save_result"]
