"""Time budgets: one value for how long a run may take, in named phases.

A :class:`TimeBudget` is what the guest spends, phase by phase (the component's wait for its
turn on a reused guest, a pooled executor runner's wait for its run spec, the program itself, the
component's archive step), and the grace the host adds on top before it gives up on the exec
stream (the network, the guest's process start, the teardown). The host's deadline for the
exec (:meth:`TimeBudget.exec_timeout`) and the guest's auto-pause budget
(:meth:`TimeBudget.auto_pause_seconds`) are both read from it, never summed by hand. One type
for the three surfaces; each surface's grace is named here once.
"""

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

# A guest's auto-pause budget: at least this long, and this much longer than one run's time in
# the guest (its activity clock is touched only when an exec is accepted), at most a day.
AUTO_PAUSE_MIN_SECONDS = 60
AUTO_PAUSE_MARGIN_SECONDS = 120
AUTO_PAUSE_MAX_SECONDS = 86400

PROGRAM = "program"  # the program itself, under its timeout inside the guest
LOCK_WAIT = "lock wait"  # the component: a run's wait for its turn on a reused guest
ARCHIVE = "archive"  # the component: the archive of the files a run returns
SPEC_WAIT = "spec wait"  # the executor: a pooled runner's wait for its run spec


def auto_pause_seconds(busy_seconds: float) -> int:
    """Longer than one execution: the activity clock is touched only when an exec is accepted."""
    return min(
        AUTO_PAUSE_MAX_SECONDS, max(AUTO_PAUSE_MIN_SECONDS, int(busy_seconds) + AUTO_PAUSE_MARGIN_SECONDS)
    )


@dataclass(frozen=True)
class TimeBudget:
    """``phases``: (name, seconds) in the order the guest spends them; ``grace_seconds``: the
    host's margin on top of them all."""

    phases: tuple[tuple[str, float], ...]
    grace_seconds: float

    @property
    def guest_seconds(self) -> float:
        """The time the guest may spend, every phase together."""
        return sum(seconds for _, seconds in self.phases)

    def phase(self, name: str) -> float:
        return sum(seconds for phase, seconds in self.phases if phase == name)

    def exec_timeout(self) -> float:
        """The host's deadline for one exec stream."""
        return self.guest_seconds + self.grace_seconds

    def auto_pause_seconds(self) -> int:
        """The auto-pause budget of a guest that serves runs of this budget."""
        return auto_pause_seconds(self.guest_seconds)


def backend(timeout_seconds: float) -> TimeBudget:
    return TimeBudget(((PROGRAM, float(timeout_seconds)),), BACKEND_GRACE_SECONDS)


def component(timeout_seconds: float, *, lock_wait: float = 0, archive: float = 0) -> TimeBudget:
    return TimeBudget(
        ((LOCK_WAIT, float(lock_wait)), (PROGRAM, float(timeout_seconds)), (ARCHIVE, float(archive))),
        COMPONENT_GRACE_SECONDS,
    )


def executor(timeout_seconds: float, *, spec_wait: float = 0) -> TimeBudget:
    return TimeBudget(
        ((SPEC_WAIT, float(spec_wait)), (PROGRAM, float(timeout_seconds))), EXECUTOR_GRACE_SECONDS
    )
