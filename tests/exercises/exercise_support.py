"""What the build-it exercises' tests share: where the stubs, references and page answers are, and how each
is loaded as a *solution* module (see ``conftest.py`` in this directory)."""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
STUBS = {"m05": "exercises/m05_block_manager.py", "m06": "exercises/m06_prefix_cache.py",
         "m07": "exercises/m07_chunked_prefill.py"}
REFERENCES = {"m05": "milestones.m05_paged_blocks.block_manager", "m06": "milestones.m06_prefix_cache.block_manager",
              "m07": "milestones.m07_chunked_prefill.scheduler"}
PAGES = {"m05": "docs/m05-paged-blocks.md", "m06": "docs/m06-prefix-cache.md", "m07": "docs/m07-chunked-prefill.md"}


def load_file(path: Path, name: str) -> ModuleType:
    """Import the Python file at ``path`` as a module called ``name``."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def page_answer_source(exercise: str) -> str:
    """The reference answer folded under the page's "Build it" heading: its first ```python block."""
    page = (REPO / PAGES[exercise]).read_text(encoding="utf-8")
    section = page.split("\n## Build it", 1)[1].split("\n## ", 1)[0]
    answer = section.split("<details>", 1)[1]
    return re.search(r"^```python\n(.*?)^```", answer, re.S | re.M).group(1)


def solution_module(kind: str, exercise: str, tmp_dir: Path) -> ModuleType:
    """``reference`` (the milestone's module), ``page answer``, ``stub``, or a learner's file path."""
    if kind == "reference":
        return importlib.import_module(REFERENCES[exercise])
    if kind == "page answer":
        path = tmp_dir / f"{exercise}_page_answer.py"
        path.write_text(page_answer_source(exercise), encoding="utf-8")
        return load_file(path, f"exercise_{exercise}_page_answer")
    if kind == "stub":
        return load_file(REPO / STUBS[exercise], f"exercise_{exercise}_stub")
    return load_file(Path(kind).resolve(), f"exercise_{exercise}_learner")


def declared_exercise(path: Path) -> str | None:
    """The exercise a file answers, from its ``EXERCISE = "mNN"`` line (None without one)."""
    match = re.search(r"""^EXERCISE\s*=\s*["'](m\d\d)["']""", path.read_text(encoding="utf-8"), re.M)
    return match.group(1) if match and match.group(1) in STUBS else None


class Checks(list):
    """The checks of one exercise, in order; ``@CHECKS`` on a test function adds it."""

    def __call__(self, check):
        self.append(check)
        return check


def assert_stub_fails(check, stub_module: ModuleType) -> None:
    """``check(stub_module)`` must fail: an exercise that the bare stub passes teaches nothing."""
    try:
        check(stub_module)
    except (AssertionError, NotImplementedError):
        return
    raise AssertionError(f"{check.__name__} passes on the bare stub: it does not check the exercise")
