"""Fixtures for the unit tests of the benchmark harness."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

RUN_PY = Path(__file__).resolve().parents[2] / "benchmarks" / "run.py"


@pytest.fixture(scope="module")
def bench_run() -> ModuleType:
    """benchmarks/run.py, loaded as a module (it is a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location("bench_run_under_test", RUN_PY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
