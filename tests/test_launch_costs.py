"""benchmarks/launch_costs.py: the parts of one eager launch. The timings are not checked (never time a test):
only that the CPU parts run and the file says what was and was not measured."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import launch_costs


def test_the_cpu_parts_run_and_the_rest_is_marked_not_measured(tmp_path, capsys):
    assert launch_costs.main(["--device", "cpu", "--iterations", "5", "--rounds", "1", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "cpu" / "launch_costs.json").read_text())
    parts = result["parts"]
    assert all(parts[name] > 0 for name in ("python_call_us", "torch_op_us", "module_op_us"))
    assert set(result["not_measured"]) == {"raw_launch_us", "triton_launch_us", "graph_kernel_us"}
    assert result["env"]["gpu_slug"] == "cpu" and "not measured" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_cuda_without_a_gpu_is_one_error_line(tmp_path, capsys):
    assert launch_costs.main(["--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.count("error:") == 1 and not list(tmp_path.iterdir())


def test_bad_counts_are_refused(tmp_path, capsys):
    assert launch_costs.main(["--device", "cpu", "--iterations", "0", "--out", str(tmp_path)]) == 2
    assert "--iterations" in capsys.readouterr().err
