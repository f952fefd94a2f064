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


class WaitedTooLong(Exception):
    """A run waited in line longer than it may; it left the line without a slot."""

    def __init__(self, waited: float, ahead: int, in_flight: int) -> None:
        super().__init__(f"waited {waited:.0f} s in line")
        self.waited = waited
        self.ahead = ahead  # runs still ahead of it when it gave up
        self.in_flight = in_flight


def gave_up_text(what: str, exc: WaitedTooLong, limit_setting: str, limit: int, wait_setting: str) -> str:
    """The error a run that gave up in line raises (every surface says it the same way)."""
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


class Line(_Counts):
    """One surface's line. ``limit`` is read at each entry (a setting may change)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()
        self._on_spare: list[Callable[[], None]] = []

    def _waiting_locked(self) -> int:
        return len(self._waiters)

    async def enter(
        self, limit: int, on_wait: Callable[[int, int], None], max_wait: float | None = None
    ) -> None:
        """Take a slot, waiting in line if ``limit`` runs hold one; every enter needs a leave.
        Raises :class:`WaitedTooLong` after ``max_wait`` seconds in line (None: no deadline)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._in_flight < limit and not self._waiters:
                self._in_flight += 1
                return
            future: asyncio.Future[None] = loop.create_future()
            waiter = (loop, future)
            self._waiters.append(waiter)
            ahead = len(self._waiters) - 1
            self.waited += 1
            in_flight = self._in_flight
        on_wait(ahead, in_flight)
        started = time.monotonic()
        try:
            if max_wait:
                await asyncio.wait_for(future, max_wait)
            else:
                await future
        except asyncio.CancelledError:
            self._step_out(waiter)
            raise
        except asyncio.TimeoutError:
            ahead, in_flight = self._step_out(waiter)
            with self._lock:
                self.gave_up += 1
            raise WaitedTooLong(time.monotonic() - started, ahead, in_flight) from None

    def _step_out(self, waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]) -> tuple[int, int]:
        """A waiter gives up: it leaves the line, or passes on the slot handed to it in that
        instant. Returns (runs that were ahead of it, runs in flight)."""
        with self._lock:
            granted = waiter not in self._waiters
            ahead = 0 if granted else self._waiters.index(waiter)
            if not granted:
                self._waiters.remove(waiter)
            in_flight = self._in_flight
        if granted:
            self.leave()
        return ahead, in_flight

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
            while self._waiters:
                loop, future = self._waiters.popleft()
                if loop.is_closed() or future.done():
                    continue
                # The slot passes on: in_flight stays the same. A future cancelled after it
                # was chosen: its run's CancelledError handler (in enter) passes the slot on.
                loop.call_soon_threadsafe(resolve, future)
                return
            self._in_flight -= 1
            listeners = list(self._on_spare)
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
        """Take a slot, waiting in line; raises :class:`WaitedTooLong` after ``max_wait``
        seconds in line (None: no deadline). Every enter that returns needs a leave."""
        limit = max(1, limit)
        with self._cond:
            ticket = self._issued
            self._issued += 1
            if ticket == self._serving and self._in_flight < limit:
                self._serving += 1
                self._in_flight += 1
                return
            self.waited += 1
            ahead, in_flight = ticket - self._serving, self._in_flight
        on_wait(ahead, in_flight)
        started = time.monotonic()
        with self._cond:
            try:
                while not (ticket == self._serving and self._in_flight < limit):
                    left = None if not max_wait else started + max_wait - time.monotonic()
                    if left is not None and left <= 0:
                        self.gave_up += 1
                        raise WaitedTooLong(
                            time.monotonic() - started, ticket - self._serving, self._in_flight
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
