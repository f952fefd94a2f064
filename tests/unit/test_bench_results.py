"""benchmarks/run.py names its result files so that only a full run replaces latest.md (the
table README.md and docs/performance.md quote)."""

from __future__ import annotations

from types import ModuleType

import pytest


def test_a_full_run_writes_latest(bench_run: ModuleType) -> None:
    assert bench_run.result_name(set(bench_run.ALL_SCENARIOS), quick=False) == "latest"


@pytest.mark.parametrize(
    ("only", "quick", "name"),
    [
        ({"S7"}, False, "partial-S7"),
        ({"S2", "S1"}, False, "partial-S1-S2"),
        ({"S1", "S2", "S3", "S4", "S5", "S6", "S7"}, True, "quick-S1-S2-S3-S4-S5-S6-S7"),
        ({"S9"}, False, "partial-none"),
    ],
)
def test_a_partial_or_quick_run_never_writes_latest(
    bench_run: ModuleType, only: set[str], quick: bool, name: str
) -> None:
    assert bench_run.result_name(only, quick) == name
