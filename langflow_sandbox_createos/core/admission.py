"""Admission control: at most N guests in flight per process and surface; the rest wait in line.

Without it a server that receives 20 executor runs at once starts 20 cold guests at once;
on a small bed none of them finishes in time (issue 30: 16 of 20 runs timed out). With it
the runs beyond the limit wait, first come first served, and each says so once (in its own
events and in the log) before it waits. A run that waits longer than its surface's
``*_MAX_WAIT_SECONDS`` leaves the line with :class:`WaitedTooLong`: its caller has most likely
given up by then, and a run nobody reads only makes the runs behind it later.

The executor's warm pool boots its guests through the same line (:meth:`Line.try_enter_spare`):
a refill takes a slot only while no run waits and fewer than the limit are in flight, and holds
it until its guest is warm. Runs and refills together never boot more guests at once than the
limit, and a refill never makes a run wait.

A line is shared by every event loop and thread of the process: a run waits on a future of
its own loop, which the run that leaves hands its slot to (``call_soon_threadsafe``), so a
waiting run costs no thread and no polling. A run cancelled while waiting leaves the line;
one cancelled in the instant its slot arrived passes the slot on.

**Load shedding (issue 45).** A run is refused, with :class:`Shed`, as soon as the line
expects that it could not be served within its ``max_wait``: its wait for a slot plus a run's
usual hold of it (its guest's boot, its run and the delete) would pass the deadline. Rather
than a caller's silence until the deadline (or an answer after its caller gave up), a prompt
refusal it can act on (retry later). The estimate is the line's own: each run that gives its
slot back reports how long it held it (:meth:`Line.observe_hold`), the line keeps an
exponentially weighted mean of those hold times (weight :data:`HOLD_WEIGHT` for the newest),
and a run behind ``ahead`` waiting runs with ``limit`` slots busy needs ``ahead + 1`` of them
to free, which ``limit`` slots do in about ``(ahead + 1) * mean / limit`` seconds
(:func:`expected_wait`). The line judges a run when it arrives, and again each time a slot is
given back (the estimate and its place have changed): a burst that arrived before any hold
was observed is judged once the first run ends, not at its deadline. With no hold observed
yet, or no deadline, nothing is refused; the deadline stays the backstop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from langflow_sandbox_createos.core import hooks


def resolve(future: asyncio.Future[None]) -> None:
    """Wake the coroutine waiting on `future` (scheduled on its loop from another thread),
    unless it was cancelled or woken already."""
    if not future.done():
        future.set_result(None)


# The weight of the newest hold time in the line's moving mean (the older ones share the rest).
HOLD_WEIGHT = 0.2


def moving_mean(previous: float | None, seconds: float) -> float:
    """A hold time's moving mean with ``seconds`` observed (weight :data:`HOLD_WEIGHT`)."""
    return seconds if previous is None else previous + HOLD_WEIGHT * (seconds - previous)


def expected_wait(mean_hold: float | None, ahead: int, limit: int) -> float | None:
    """How long a run arriving behind ``ahead`` waiting runs, with all ``limit`` slots busy,
    should expect to wait: ``ahead + 1`` slots must free, and ``limit`` slots free one every
    ``mean_hold / limit`` seconds on average. None while no hold time was observed."""
    return None if mean_hold is None else _slots_wait(mean_hold, ahead + 1, limit)


def _slots_wait(mean_hold: float, slots: int, limit: int) -> float:
    """How long ``limit`` busy slots take to free ``slots`` of them, one every ``mean_hold /
    limit`` seconds on average."""
    return slots * mean_hold / max(1, limit)


class WaitedTooLong(Exception):
    """A run waited in line longer than it may; it left the line without a slot."""

    def __init__(self, waited: float, ahead: int, in_flight: int, expected: float | None = None) -> None:
        super().__init__(f"waited {waited:.0f} s in line")
        self.waited = waited
        self.ahead = ahead  # runs still ahead of it when it gave up
        self.in_flight = in_flight
        self.expected = expected  # the line's estimate of the wait still ahead of it (None: unknown)


class Shed(WaitedTooLong):
    """A run refused because the line expected it could not be served within ``max_wait``:
    ``expected`` seconds more in line, and a run's usual ``hold`` after it. ``waited`` is 0 for
    a run refused at arrival (it never stood in line)."""

    def __init__(
        self, expected: float, max_wait: float, ahead: int, in_flight: int, hold: float, waited: float = 0.0
    ) -> None:
        super().__init__(waited, ahead, in_flight, expected)
        self.max_wait = max_wait
        self.hold = hold
        self.args = (
            f"would wait about {expected:.0f} s more in line and then hold its guest about {hold:.0f} s, "
            f"past {max_wait:g} s",
        )


def gave_up_text(what: str, exc: WaitedTooLong, limit_setting: str, limit: int, wait_setting: str) -> str:
    """The error a run that gave up in line, or was refused at once, raises (every surface
    says it the same way)."""
    if isinstance(exc, Shed):
        when = "at once" if exc.waited == 0 else f"after {exc.waited:.0f} s in line"
        return (
            f"{what} was refused {when}: every slot is taken ({exc.in_flight} run(s) in flight, the limit "
            f"{limit_setting}={limit}; {exc.ahead} run(s) waiting ahead of it), and at the recent pace it "
            f"would wait about {exc.expected:.0f} s more for a guest and then hold it about {exc.hold:.0f} s, "
            f"past {wait_setting}={exc.max_wait:g}. Nothing of it ran; retry in about {exc.expected:.0f} s. "
            f"Raise {limit_setting} if the control plane boots more guests at once, or {wait_setting} "
            f"(0: no deadline) to let runs wait longer."
        )
    return (
        f"{what} waited {exc.waited:.0f} s in line for a guest ({exc.in_flight} run(s) in flight, the limit "
        f"{limit_setting}={limit}; {exc.ahead} run(s) still ahead of it) and gave up at {wait_setting}. "
        f"Nothing of it ran. Raise {limit_setting} if the control plane boots more guests at once, or "
        f"{wait_setting} (0: no deadline) to let runs wait longer."
    )


logger = logging.getLogger("langflow_sandbox_createos.admission")


class _Counts:
    """What both lines count: runs holding a slot, and those that had to wait or gave up."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock: threading.Lock | threading.Condition = threading.Lock()
        self._in_flight = 0
        self.waited = 0  # runs that had to wait (introspection, tests, benchmarks)
        self.gave_up = 0  # runs that left the line at their wait deadline
        self.shed = 0  # runs refused at arrival (their expected wait was past their deadline)
        self._mean_hold: float | None = None  # the moving mean of slot hold times (seconds)

    def observe_hold(self, seconds: float) -> None:
        """A run gave its slot back after holding it ``seconds``: the estimate's one input."""
        seconds = max(0.0, seconds)
        with self._lock:
            self._mean_hold = moving_mean(self._mean_hold, seconds)

    @property
    def mean_hold(self) -> float | None:
        with self._lock:
            return self._mean_hold

    def _shed_locked(
        self, ahead: int, limit: int, max_wait: float | None, waited: float = 0.0, freeing: bool = False
    ) -> Shed | None:
        """The refusal of a run behind ``ahead`` others that has waited ``waited`` seconds, if
        the line expects it could not be served within ``max_wait`` (called with the lock held;
        ``freeing``: a slot is being given back now, the first of those runs takes it)."""
        hold = self._mean_hold
        if not max_wait or hold is None:
            return None
        expected = _slots_wait(hold, ahead if freeing else ahead + 1, limit)
        if expected + hold <= max_wait - waited:
            return None
        self.shed += 1
        return Shed(expected, max_wait, ahead, self._in_flight, hold, waited)

    def expected_wait_locked(self, ahead: int, limit: int) -> float | None:
        return expected_wait(self._mean_hold, ahead, limit)

    @property
    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    @property
    def waiting(self) -> int:
        with self._lock:
            return self._waiting_locked()

    def _waiting_locked(self) -> int:
        raise NotImplementedError


class _Waiter:
    """A run waiting in a :class:`Line`: its loop and future, when it arrived, its deadline."""

    __slots__ = ("future", "granted", "loop", "max_wait", "started")

    def __init__(self, loop: asyncio.AbstractEventLoop, max_wait: float | None) -> None:
        self.loop = loop
        self.future: asyncio.Future[None] = loop.create_future()
        self.started = time.monotonic()
        self.max_wait = max_wait
        self.granted = False  # handed a slot (set with the line's lock held)


def _refuse(future: asyncio.Future[None], shed: Shed) -> None:
    if not future.done():
        future.set_exception(shed)


class Line(_Counts):
    """One surface's line. ``limit`` is read at each entry (a setting may change)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._waiters: deque[_Waiter] = deque()
        self._on_spare: list[Callable[[], None]] = []
        self._limit = 1  # the latest entry's

    def _waiting_locked(self) -> int:
        return len(self._waiters)

    async def enter(
        self, limit: int, on_wait: Callable[[int, int], None], max_wait: float | None = None
    ) -> None:
        """Take a slot, waiting in line if ``limit`` runs hold one; every enter needs a leave.
        Raises :class:`Shed` as soon as the line expects the run could not be served within
        ``max_wait`` (at once, or when a slot is given back), and :class:`WaitedTooLong` after
        ``max_wait`` seconds in line (None: no deadline)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            self._limit = limit
            if self._in_flight < limit and not self._waiters:
                self._in_flight += 1
                return
            shed = self._shed_locked(len(self._waiters), limit, max_wait)
            if shed is not None:
                raise shed
            waiter = _Waiter(loop, max_wait)
            self._waiters.append(waiter)
            ahead = len(self._waiters) - 1
            self.waited += 1
            in_flight = self._in_flight
        on_wait(ahead, in_flight)
        try:
            if max_wait:
                await asyncio.wait_for(waiter.future, max_wait)
            else:
                await waiter.future
        except asyncio.CancelledError:
            self._step_out(waiter)
            raise
        except asyncio.TimeoutError:
            ahead, in_flight = self._step_out(waiter)
            with self._lock:
                self.gave_up += 1
                expected = self.expected_wait_locked(ahead, limit)
            raise WaitedTooLong(time.monotonic() - waiter.started, ahead, in_flight, expected) from None

    def _step_out(self, waiter: _Waiter) -> tuple[int, int]:
        """A waiter gives up: it leaves the line, or passes on the slot handed to it in that
        instant. Returns (runs that were ahead of it, runs in flight)."""
        with self._lock:
            granted, ahead = waiter.granted, 0
            if waiter in self._waiters:  # not handed a slot, nor refused
                ahead = self._waiters.index(waiter)
                self._waiters.remove(waiter)
            in_flight = self._in_flight
        if granted:
            self.leave()
        return ahead, in_flight

    def _rejudge_locked(self) -> list[tuple[_Waiter, Shed]]:
        """Each waiting run judged again (a slot was given back: the estimate and its place
        have changed); those the line now expects could not be served in time leave it."""
        if self._mean_hold is None:
            return []
        now = time.monotonic()
        refused: list[tuple[_Waiter, Shed]] = []
        kept: deque[_Waiter] = deque()
        for waiter in self._waiters:
            waited = now - waiter.started
            shed = self._shed_locked(len(kept), self._limit, waiter.max_wait, waited, freeing=True)
            if shed is None:
                kept.append(waiter)
            else:
                refused.append((waiter, shed))
        self._waiters = kept
        return refused

    def try_enter_spare(self, limit: int) -> bool:
        """Take a slot only if one is free and no run waits for it (never waits): how the warm
        pool boots a guest ahead of need without making a run wait. A True needs a leave."""
        with self._lock:
            if self._in_flight < max(1, limit) and not self._waiters:
                self._in_flight += 1
                return True
            return False

    def has_spare(self, limit: int) -> bool:
        with self._lock:
            return self._in_flight < max(1, limit) and not self._waiters

    def when_spare(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (from the leaving thread, no lock held) whenever a slot frees that
        no waiting run takes."""
        with self._lock:
            self._on_spare.append(callback)

    def leave(self) -> None:
        with self._lock:
            refused = self._rejudge_locked()
            handed = False
            while self._waiters:
                waiter = self._waiters.popleft()
                if waiter.loop.is_closed() or waiter.future.done():
                    continue
                # The slot passes on: in_flight stays the same. A future cancelled after it
                # was chosen: its run's CancelledError handler (in enter) passes the slot on.
                waiter.granted = True
                waiter.loop.call_soon_threadsafe(resolve, waiter.future)
                handed = True
                break
            if not handed:
                self._in_flight -= 1
            listeners = [] if handed else list(self._on_spare)
        for waiter, shed in refused:
            if not waiter.loop.is_closed():
                waiter.loop.call_soon_threadsafe(_refuse, waiter.future, shed)
        for callback in listeners:
            try:
                callback()
            except Exception:  # a listener's failure must not fail the run that left
                logger.debug("admission: a spare-slot listener failed", exc_info=True)

    def forget_after_fork(self) -> None:
        """In a fork child: the parent's runs and waiters are not ours (their loops are the
        parent's); the listeners stay (the objects that registered them were copied too)."""
        self._lock = threading.Lock()
        self._in_flight = 0
        self._waiters = deque()

    @asynccontextmanager
    async def slot(
        self, limit: int, on_wait: Callable[[int, int], None], max_wait: float | None = None
    ) -> AsyncIterator[None]:
        """Hold one of ``limit`` slots for the body; ``on_wait(ahead, in_flight)`` is called
        once, before waiting, only when the run has to wait."""
        await self.enter(max(1, limit), on_wait, max_wait)
        try:
            yield
        finally:
            self.leave()


class SyncLine(_Counts):
    """The same line for blocking callers (the sandbox backend and the component engine run in
    worker threads): tickets served in order; a caller interrupted while it waits (Ctrl-C, a
    timeout of lfx's) gives its ticket up, and the line moves past it."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._cond = self._lock = threading.Condition(threading.Lock())
        self._issued = 0  # next ticket to hand out
        self._serving = 0  # the ticket whose turn it is
        self._abandoned: set[int] = set()

    def _waiting_locked(self) -> int:
        return self._issued - self._serving - len(self._abandoned)

    def _skip_abandoned_locked(self) -> None:
        while self._serving in self._abandoned:
            self._abandoned.discard(self._serving)
            self._serving += 1

    def enter(self, limit: int, on_wait: Callable[[int, int], None], max_wait: float | None = None) -> None:
        """Take a slot, waiting in line; raises :class:`Shed` at once if the line expects the
        wait to pass ``max_wait``, :class:`WaitedTooLong` after ``max_wait`` seconds in line
        (None: no deadline). Every enter that returns needs a leave."""
        limit = max(1, limit)
        with self._cond:
            ticket = self._issued
            self._issued += 1
            if ticket == self._serving and self._in_flight < limit:
                self._serving += 1
                self._in_flight += 1
                return
            shed = self._shed_locked(ticket - self._serving - len(self._abandoned), limit, max_wait)
            if shed is not None:
                self._issued -= 1  # the last ticket issued: the line is as it was
                raise shed
            self.waited += 1
            ahead, in_flight = ticket - self._serving, self._in_flight
        on_wait(ahead, in_flight)
        started = time.monotonic()
        with self._cond:
            try:
                while not (ticket == self._serving and self._in_flight < limit):
                    waited = time.monotonic() - started
                    ahead = ticket - self._serving - sum(1 for t in self._abandoned if t < ticket)
                    shed = self._shed_locked(ahead, limit, max_wait, waited)
                    if shed is not None:  # judged again: a slot was given back
                        raise shed
                    left = None if not max_wait else started + max_wait - time.monotonic()
                    if left is not None and left <= 0:
                        self.gave_up += 1
                        ahead = ticket - self._serving
                        raise WaitedTooLong(
                            time.monotonic() - started,
                            ahead,
                            self._in_flight,
                            self.expected_wait_locked(ahead, limit),
                        )
                    self._cond.wait(left)
            except BaseException:
                self._abandoned.add(ticket)
                self._skip_abandoned_locked()
                self._cond.notify_all()
                raise
            self._serving += 1
            self._in_flight += 1
            self._skip_abandoned_locked()
            self._cond.notify_all()

    def leave(self) -> None:
        with self._cond:
            self._in_flight -= 1
            self._cond.notify_all()

    def forget_after_fork(self) -> None:
        """In a fork child: the parent's callers are not ours (their threads did not fork)."""
        self._cond = self._lock = threading.Condition(threading.Lock())
        self._in_flight = self._issued = self._serving = 0
        self._abandoned = set()


backend_line = SyncLine("backend")
component_line = SyncLine("component")
executor_line = Line("executor")


def _forget_lines_after_fork() -> None:
    for line in (backend_line, component_line, executor_line):
        line.forget_after_fork()


hooks.after_fork("admission lines", _forget_lines_after_fork)
