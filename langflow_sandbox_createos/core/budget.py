"""Time budgets: how long a guest may run, enforced inside the guest, and the grace the host
adds on top before it gives up on the exec stream (the network, the guest's process start,
the teardown). One type for the three surfaces; each surface's grace is named here once."""

from __future__ import annotations

from dataclasses import dataclass

# The backend's program runs under the guest shell's `timeout`; on top: exec start and output.
BACKEND_GRACE_SECONDS = 15.0
# The component's wrapper adds a reuse lock wait and the archive of returned files (both part
# of the guest-side budget); on top: network and process start.
COMPONENT_GRACE_SECONDS = 20.0
# The executor's runner has its own watchdog; on top: lfx's import, the graph's teardown and
# the last frames.
EXECUTOR_GRACE_SECONDS = 30.0


@dataclass(frozen=True)
class TimeBudget:
    """``guest_seconds``: the limit inside the guest; ``grace_seconds``: the host's margin."""

    guest_seconds: float
    grace_seconds: float

    def exec_timeout(self, waiting: float = 0.0) -> float:
        """The host's deadline for one exec stream; ``waiting``: time the guest spends waiting
        before the budget starts (a pooled runner waiting for its spec)."""
        return waiting + self.guest_seconds + self.grace_seconds


def backend(guest_seconds: float) -> TimeBudget:
    return TimeBudget(float(guest_seconds), BACKEND_GRACE_SECONDS)


def component(guest_seconds: float) -> TimeBudget:
    return TimeBudget(float(guest_seconds), COMPONENT_GRACE_SECONDS)


def executor(guest_seconds: float) -> TimeBudget:
    return TimeBudget(float(guest_seconds), EXECUTOR_GRACE_SECONDS)
