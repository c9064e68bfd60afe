"""The milestones, found on disk: every package ``milestones/mNN_<idea>/``, in order, with what it says of itself.

Nothing here imports a milestone: the idea comes from the package docstring read with ``ast``, so the list
works even while a new milestone is half-written (``changes.py`` imports them, because it needs the classes).

A milestone is named two ways, and both are accepted everywhere: its full package name (``m06_prefix_cache``)
and its short name, the part before the first underscore (``m06``).
"""

from __future__ import annotations

import ast
import pkgutil
import re
from dataclasses import dataclass
from pathlib import Path

MILESTONES_DIR = Path(__file__).resolve().parents[1]
REPO_ROOT = MILESTONES_DIR.parent
DOCS_DIR = REPO_ROOT / "docs"
PACKAGE_NAME = re.compile(r"m\d{2}_\w+")


class UnknownMilestone(ValueError):
    """A name that is no milestone; the message is one line and lists the valid names."""


@dataclass(frozen=True)
class Milestone:
    """One milestone package. ``name`` is the full package name, e.g. ``m02_kv_cache``."""

    name: str
    path: Path  # the package directory
    docstring: str  # of its __init__.py; "" when it has none

    @property
    def key(self) -> str:
        """The short name: ``m02``."""
        return self.name.split("_", 1)[0]

    @property
    def module(self) -> str:
        return f"milestones.{self.name}"

    @property
    def idea(self) -> str:
        """The docstring's first sentence without the ``mNN_name:`` prefix or reST markup, on one line."""
        return one_line_summary(self.docstring, prefix=self.name) or "(no docstring in __init__.py)"

    @property
    def demo_command(self) -> str | None:
        return f"python -m {self.module}" if (self.path / "__main__.py").is_file() else None

    @property
    def doc_page(self) -> str | None:
        """``docs/mNN-*.md`` relative to the repository root, or None while the page is not written."""
        pages = sorted(DOCS_DIR.glob(f"{self.key}-*.md"))
        return pages[0].relative_to(REPO_ROOT).as_posix() if pages else None

    def source_files(self) -> list[Path]:
        """Every ``.py`` file of the package, subpackages included, in path order."""
        return sorted(p for p in self.path.rglob("*.py") if "__pycache__" not in p.parts)


def one_line_summary(docstring: str | None, prefix: str | None = None) -> str:
    """The first sentence of ``docstring``'s first paragraph, joined onto one line.

    ``prefix`` (e.g. ``m02_kv_cache``) is dropped when the docstring starts with ``prefix:``; reST literals
    (````x````) lose their backticks and the final full stop goes.
    """
    if not docstring:
        return ""
    paragraph = " ".join(docstring.strip().split("\n\n", 1)[0].split())
    if prefix and paragraph.startswith(f"{prefix}:"):
        paragraph = paragraph[len(prefix) + 1:].strip()
    sentence = re.split(r"(?<=[.!?])\s", paragraph, maxsplit=1)[0]
    return sentence.replace("``", "").rstrip(".")


def discover() -> list[Milestone]:
    """Every ``mNN_<idea>`` package under ``milestones/``, in order (the names sort by their number)."""
    found = []
    for info in pkgutil.iter_modules([str(MILESTONES_DIR)]):
        if info.ispkg and PACKAGE_NAME.fullmatch(info.name):
            path = MILESTONES_DIR / info.name
            init = path / "__init__.py"
            docstring = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) if init.is_file() else None
            found.append(Milestone(info.name, path, docstring or ""))
    return sorted(found, key=lambda m: m.name)


def resolve(name: str, milestones: list[Milestone]) -> Milestone:
    """The milestone called ``name`` (full or short, any case); ``UnknownMilestone`` lists the valid names."""
    wanted = name.strip().lower()
    for milestone in milestones:
        if wanted in (milestone.name, milestone.key):
            return milestone
    valid = ", ".join(m.name for m in milestones)
    raise UnknownMilestone(f"unknown milestone {name!r}: choose from {valid} (or the short names "
                           f"{milestones[0].key}..{milestones[-1].key})" if milestones else
                           f"unknown milestone {name!r}: there are no milestone packages under {MILESTONES_DIR}")


def between(old: Milestone, new: Milestone, milestones: list[Milestone]) -> list[Milestone]:
    """The milestones after ``old`` up to and including ``new``: each one is a step to show."""
    names = [m.name for m in milestones]
    return milestones[names.index(old.name) + 1:names.index(new.name) + 1]
