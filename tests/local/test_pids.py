"""createos-local never signals a process by a number that may have been handed on.

A soak starts enough processes for PIDs to wrap (``pid_max`` 32768), and a kill aimed at a
guest that is already gone must not reach a neighbour's exec. Each test stands in for the
wrap by pointing a stale handle's number at an unrelated live process, which must survive.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from langflow_sandbox_createos.local import pids
from langflow_sandbox_createos.local.jailer import GuestInit

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pidfds are Linux-only")


@pytest.fixture
def neighbour() -> Iterator[subprocess.Popen[bytes]]:
    """An unrelated process leading its own session, as another guest's exec launcher does."""
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def _alive(proc: subprocess.Popen[bytes]) -> bool:
    return proc.poll() is None


async def _init_with_a_gone_pid1() -> tuple[GuestInit, Any]:
    """A GuestInit adopted for a real PID 1 (a child of the launcher), whose PID 1 and
    launcher have since exited and been reaped."""
    launcher = await asyncio.create_subprocess_exec(
        "/bin/sh", "-c", "sleep 60 & echo $!; wait", stdout=asyncio.subprocess.PIPE, start_new_session=True
    )
    assert launcher.stdout is not None
    child_pid = int(await launcher.stdout.readline())
    init = GuestInit.adopt(launcher, child_pid)
    assert init.alive
    os.kill(child_pid, signal.SIGKILL)
    assert await asyncio.wait_for(launcher.wait(), 10) == 0  # sh's `wait` returns, sh exits
    assert not init.alive
    return init, launcher


def test_a_stale_guest_init_cannot_kill_the_process_that_took_its_numbers(
    neighbour: subprocess.Popen[bytes],
) -> None:
    async def scenario() -> None:
        init, launcher = await _init_with_a_gone_pid1()
        # The wrap: both numbers the init knew now belong to the neighbour.
        init.child_pid = neighbour.pid
        init.proc = SimpleNamespace(pid=neighbour.pid, returncode=launcher.returncode)  # type: ignore[assignment]
        assert not init.alive
        with pytest.raises(OSError):
            init.pid_namespace()  # would join the neighbour's PID namespace
        init.kill()
        init.kill()  # idempotent

    asyncio.run(scenario())
    assert _alive(neighbour)


def test_adopt_refuses_a_process_that_is_not_the_launchers_child(neighbour: subprocess.Popen[bytes]) -> None:
    async def scenario() -> None:
        launcher = await asyncio.create_subprocess_exec("sleep", "60", start_new_session=True)
        try:
            with pytest.raises(OSError):
                GuestInit.adopt(launcher, neighbour.pid)
            with pytest.raises(OSError):
                GuestInit.adopt(launcher, 2**22 + 1)  # above any pid_max: no such process
        finally:
            launcher.kill()
            await launcher.wait()

    asyncio.run(scenario())
    assert _alive(neighbour)


def test_own_group_is_signalled_only_while_the_child_is_unreaped(neighbour: subprocess.Popen[bytes]) -> None:
    reaped = SimpleNamespace(pid=neighbour.pid, returncode=-9)
    pids.signal_own_group(reaped, signal.SIGKILL)  # type: ignore[arg-type]
    assert _alive(neighbour)
    live = SimpleNamespace(pid=neighbour.pid, returncode=None)
    pids.signal_own_group(live, signal.SIGKILL)  # type: ignore[arg-type]
    assert neighbour.wait(10) == -signal.SIGKILL


def test_cgroup_members_are_signalled_only_if_listed_before_and_after_pinning(
    neighbour: subprocess.Popen[bytes],
) -> None:
    # Listed once, gone from the group by the second reading: its number was reused.
    readings = iter([[neighbour.pid], []])
    assert pids.signal_members(lambda: next(readings), signal.SIGKILL) == 0
    assert _alive(neighbour)
    # A listed number with no process behind it is skipped.
    assert pids.signal_members(lambda: [2**22 + 1], signal.SIGKILL) == 0
    # Listed in both readings and alive: a member, signalled through its pidfd.
    assert pids.signal_members(lambda: [neighbour.pid], signal.SIGKILL) == 1
    assert neighbour.wait(10) == -signal.SIGKILL
