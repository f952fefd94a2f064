"""Reliability suites: fault matrix, soak, hostile guests, configuration abuse.

Each suite starts its own createos-local planes (with the distinctive key of
``harness.API_KEY``), so nothing here depends on, or disturbs, the session-wide plane of
the other suites.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from . import harness

# Filled by the suites, printed at the end of the session.
SUMMARY: dict[str, list[str]] = {}


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not SUMMARY:
        return
    terminalreporter.section("reliability")
    for title, lines in SUMMARY.items():
        terminalreporter.write_line(f"{title}:")
        for line in lines:
            terminalreporter.write_line(f"  {line}")


@pytest.fixture(scope="module")
def plane() -> Iterator[Any]:
    """One createos-local per test module, with the suite's own key."""
    (p,) = harness.start_planes(1)
    try:
        yield p
    finally:
        harness.forget_endpoint(p.url)
        p.stop()
