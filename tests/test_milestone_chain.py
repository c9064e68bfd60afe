"""Every milestone exports the shared API and extends the one before it (the rule AGENTS.md states)."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import milestones

PACKAGES = sorted(m.name for m in pkgutil.iter_modules(milestones.__path__) if m.name[:1] == "m" and m.ispkg)


def test_milestones_are_numbered_in_order():
    assert PACKAGES[:4] == ["m01_naive_loop", "m02_kv_cache", "m03_static_batching", "m04_continuous_batching"]


@pytest.mark.parametrize("name", PACKAGES)
def test_exports_the_shared_api(name):
    package = importlib.import_module(f"milestones.{name}")
    for symbol in ("EngineConfig", "LLMEngine", "SamplingParams", "RequestOutput"):
        assert hasattr(package, symbol), f"{name} does not export {symbol}"
    assert package.LLMEngine.milestone == name
    assert package.__doc__, f"{name}/__init__.py needs a docstring that says what it adds"


@pytest.mark.parametrize("previous, current", list(zip(PACKAGES, PACKAGES[1:])))
def test_each_milestone_extends_the_previous_one(previous, current):
    before = importlib.import_module(f"milestones.{previous}")
    after = importlib.import_module(f"milestones.{current}")
    assert issubclass(after.LLMEngine, before.LLMEngine)
    assert issubclass(after.EngineConfig, before.EngineConfig)
    assert after.SamplingParams is before.SamplingParams


@pytest.mark.parametrize("name", PACKAGES)
def test_has_a_demo_with_main(name):
    demo = importlib.import_module(f"milestones.{name}.__main__")
    assert callable(demo.main)
