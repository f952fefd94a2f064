"""Signalling guest processes by pidfd, never by a number that may have been handed on.

A PID names a process only while that process (or, for a process group, one of its
members) exists; once it is reaped the kernel may give the number to any new process. A
soak starts tens of thousands of processes on a host with ``pid_max`` 32768, so a kill
aimed at a guest that is already gone can reach a neighbour's exec. So:

- processes we did not spawn (a guest's PID 1, the members of a cgroup) are held by a pidfd
  (``pidfd_open(2)``) and signalled through it (``pidfd_send_signal(2)``): a pidfd always
  means the process it was opened for, and signals to it fail once that process is gone;
- our own children (the launchers) are signalled by number only while ``returncode`` is
  still None, checked in the same loop turn as the kill: a child that has not been reaped
  keeps its number, so that number (and the process group it leads) is still ours.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
from collections.abc import Callable


def open_pidfd(pid: int) -> int | None:
    """A pidfd for ``pid``, or None when no such process exists."""
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return None


def has_exited(pidfd: int) -> bool:
    """A pidfd polls readable once its process has exited (zombies included)."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


def send(pidfd: int, sig: int) -> None:
    """Signal the pidfd's process; nothing happens if it is gone."""
    with contextlib.suppress(ProcessLookupError):
        signal.pidfd_send_signal(pidfd, sig)


def signal_own_group(proc: asyncio.subprocess.Process, sig: int) -> None:
    """Signal the process group our child ``proc`` leads (it was started with
    ``start_new_session``), but only while that child is unreaped: after the reap its number
    may already lead someone else's group."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)


def signal_members(read_pids: Callable[[], list[int]], sig: int) -> int:
    """Signal every process ``read_pids`` lists (a cgroup's ``cgroup.procs``) without racing
    PID reuse: pin each listed process with a pidfd, list again, and signal the pinned
    processes whose number is still listed. A process that left between the two readings is
    not signalled; one that took a listed number is pinned only if it is listed itself.
    Returns how many were signalled."""
    pinned: list[tuple[int, int]] = []
    try:
        for pid in read_pids():
            pidfd = open_pidfd(pid)
            if pidfd is not None:
                pinned.append((pid, pidfd))
        if not pinned:
            return 0
        still = set(read_pids())
        sent = 0
        for pid, pidfd in pinned:
            if pid in still and not has_exited(pidfd):
                send(pidfd, sig)
                sent += 1
        return sent
    finally:
        for _, pidfd in pinned:
            os.close(pidfd)
