"""Reliability suites: fault matrix, soak, hostile guests, configuration abuse.

Each suite starts its own createos-local planes (with the distinctive key of
``harness.API_KEY``), so nothing here depends on, or disturbs, the session-wide plane of
the other suites.
"""

from __future__ import annotations

from typing import Any

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
