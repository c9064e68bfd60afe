"""The build-it exercises of m05, m06 and m07: every check runs against a *solution*, a module that defines the
exercise's class (``BlockManager``, ``PrefixCachingBlockManager`` or ``Scheduler``).

By default (CI) the solutions are the milestone's own module and the reference answer folded on the doc page,
and every check must also FAIL on the bare stub in ``exercises/``, so that the exercise cannot be passed by
handing in the stub. A learner checks their own file instead::

    .venv/bin/python -m pytest tests/exercises -k m05 --solution exercises/m05_block_manager.py

(the file says which exercise it answers with ``EXERCISE = "m05"``; checks of other exercises are skipped).
Give the ``tests/exercises`` path as above: pytest reads this option only from a run that starts here.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from .exercise_support import REPO, STUBS, declared_exercise, solution_module


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--solution", action="append", default=[], metavar="FILE",
                     help="a learner's exercises/mNN_*.py to check instead of the reference (repeatable)")


def pytest_configure(config: pytest.Config) -> None:
    for path in config.getoption("--solution", default=[]):
        exercise_of(path)  # a missing file or one that names no exercise: a usage error before any test


def exercise_of(path: str) -> str:
    """The exercise a learner's file answers, or a usage error naming what is wrong."""
    file = Path(path)
    if not file.is_file():
        raise pytest.UsageError(f"--solution {path}: no such file")
    exercise = declared_exercise(file)
    if exercise is None:
        raise pytest.UsageError(f"--solution {path}: the file must say which exercise it answers, e.g. "
                                f"EXERCISE = \"m05\" (as {STUBS['m05']} does)")
    return exercise


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``solution``: the reference and the page's answer by default, the learner's file(s) with ``--solution``."""
    if "solution" not in metafunc.fixturenames:
        return
    exercise = metafunc.module.EXERCISE
    learner_files = metafunc.config.getoption("--solution")
    if learner_files:
        kinds = [path for path in learner_files if exercise_of(path) == exercise]
    else:
        kinds = ["reference", "page answer"]
    metafunc.parametrize("solution", kinds, indirect=True, ids=[Path(k).name for k in kinds])


@pytest.fixture
def solution(request: pytest.FixtureRequest, tmp_path: Path) -> ModuleType:
    return solution_module(request.param, request.module.EXERCISE, tmp_path)


@pytest.fixture
def stub(request: pytest.FixtureRequest) -> ModuleType:
    if request.config.getoption("--solution"):
        pytest.skip("checking a learner's file: the stub check is for the repository's own run")
    return solution_module("stub", request.module.EXERCISE, REPO)
