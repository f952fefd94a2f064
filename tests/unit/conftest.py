"""Fixtures for the unit tests of the repository's scripts (benchmarks/run.py, tests/mutations/run.py,
scripts/code_metrics.py): each loaded as a module, since they are scripts, not package code."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_script(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench_run() -> ModuleType:
    return load_script(ROOT / "benchmarks" / "run.py", "bench_run_under_test")


@pytest.fixture(scope="module")
def cm() -> ModuleType:
    return load_script(ROOT / "scripts" / "code_metrics.py", "code_metrics")


@pytest.fixture(scope="module")
def mutations() -> ModuleType:
    return load_script(ROOT / "tests" / "mutations" / "run.py", "mutations_run")
