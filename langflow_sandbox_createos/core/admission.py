"""Admission control: at most N guests in flight per process and surface; the rest wait in line.

Without it a server that receives 20 executor runs at once starts 20 cold guests at once;
on a small bed none of them finishes in time (issue 30: 16 of 20 runs timed out). With it
the runs beyond the limit wait, first come first served, and each says so once (in its own
events and in the log) before it waits.

A line is shared by every event loop and thread of the process: a run waits on a future of
its own loop, which the run that leaves hands its slot to (``call_soon_threadsafe``), so a
waiting run costs no thread and no polling. A run cancelled while waiting leaves the line;
one cancelled in the instant its slot arrived passes the slot on.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager


class Line:
    """One surface's line. ``limit`` is read at each entry (a setting may change)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._in_flight = 0
        self._waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()
        self.waited = 0  # runs that had to wait (introspection, tests, benchmarks)

    @property
    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    @property
    def waiting(self) -> int:
        with self._lock:
            return len(self._waiters)

    async def enter(self, limit: int, on_wait: Callable[[int, int], None]) -> None:
        """Take a slot, waiting in line if ``limit`` runs hold one; every enter needs a leave."""
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
        try:
            await future
        except asyncio.CancelledError:
            with self._lock:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                    raise
            # the slot was handed to us as we were cancelled: pass it on
            self.leave()
            raise

    def leave(self) -> None:
        with self._lock:
            while self._waiters:
                loop, future = self._waiters.popleft()
                if loop.is_closed() or future.done():
                    continue
                # the slot passes on: in_flight stays the same
                loop.call_soon_threadsafe(self._grant, future)
                return
            self._in_flight -= 1

    def _grant(self, future: asyncio.Future[None]) -> None:
        # A future cancelled after it was chosen: its run's CancelledError handler (in enter)
        # passes the slot on, so nothing to do here.
        if not future.done():
            future.set_result(None)

    @asynccontextmanager
    async def slot(self, limit: int, on_wait: Callable[[int, int], None]) -> AsyncIterator[None]:
        """Hold one of ``limit`` slots for the body; ``on_wait(ahead, in_flight)`` is called
        once, before waiting, only when the run has to wait."""
        await self.enter(max(1, limit), on_wait)
        try:
            yield
        finally:
            self.leave()


class SyncLine:
    """The same line for blocking callers (the sandbox backend and the component engine run in
    worker threads): tickets served in order; a caller interrupted while it waits (Ctrl-C, a
    timeout of lfx's) gives its ticket up, and the line moves past it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._cond = threading.Condition(threading.Lock())
        self._in_flight = 0
        self._issued = 0  # next ticket to hand out
        self._serving = 0  # the ticket whose turn it is
        self._abandoned: set[int] = set()
        self.waited = 0

    @property
    def in_flight(self) -> int:
        with self._cond:
            return self._in_flight

    @property
    def waiting(self) -> int:
        with self._cond:
            return self._issued - self._serving - len(self._abandoned)

    def _skip_abandoned_locked(self) -> None:
        while self._serving in self._abandoned:
            self._abandoned.discard(self._serving)
            self._serving += 1

    def enter(self, limit: int, on_wait: Callable[[int, int], None]) -> None:
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
        with self._cond:
            try:
                while not (ticket == self._serving and self._in_flight < limit):
                    self._cond.wait()
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


backend_line = SyncLine("backend")
component_line = SyncLine("component")
executor_line = Line("executor")
