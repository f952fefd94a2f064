"""Where one executor run's time goes: a debug timeline, off unless asked for.

With the logger ``langflow_sandbox_createos.executor.timeline`` at DEBUG, each run notes when
it passed each of its steps on the host (seconds since ``execute()`` began), and the guest
runner's own durations for the steps it took (the `done` frame's ``phases``), and logs them
as one line when the run ends; the record carries them as ``timeline`` (a dict) for tools
(``benchmarks/executor_pool_breakdown.py``). A run whose guest is deleted after it ended logs
a second line when the delete returned. Disabled, a mark costs one attribute test.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger("langflow_sandbox_createos.executor.timeline")


class Timeline:
    """One run's marks, appended (atomic in CPython) from the run's event loop and from its
    exec and delete threads."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.marks: list[tuple[str, float]] | None = [] if logger.isEnabledFor(logging.DEBUG) else None
        self.guest: dict[str, float] = {}

    @property
    def enabled(self) -> bool:
        return self.marks is not None

    def mark(self, name: str) -> None:
        if self.marks is not None:
            self.marks.append((name, round(time.monotonic() - self.started, 4)))

    def mark_once(self, name: str) -> None:
        if self.marks is not None and all(existing != name for existing, _ in self.marks):
            self.mark(name)

    def guest_phases(self, phases: Any) -> None:
        """The guest's own durations (the `done` frame's `phases`), numbers only."""
        if self.marks is not None and isinstance(phases, Mapping):
            self.guest = {
                str(k)[:40]: round(float(v), 4)
                for k, v in list(phases.items())[:32]
                if isinstance(v, (int, float)) and not isinstance(v, bool)
            }

    def log(self, what: str, sandbox_id: str | None) -> None:
        """Log the marks so far."""
        if self.marks is None:
            return
        steps = ", ".join(f"{name} {at * 1000:.1f}" for name, at in self.marks)
        inside = ", ".join(f"{name} {spent * 1000:.1f}" for name, spent in self.guest.items())
        logger.debug(
            "CreateOS executor timeline (%s, guest %s), ms since execute(): %s%s",
            what,
            sandbox_id or "(none)",
            steps,
            f"; in the guest, ms per step: {inside}" if inside else "",
            extra={
                "timeline": {
                    "what": what,
                    "sandbox_id": sandbox_id,
                    "started": self.started,
                    "marks": list(self.marks),
                    "guest": dict(self.guest),
                }
            },
        )
