"""An exec's output is never cut when its main process exits before the server has read it.

createos-local stops reading an exec's pipes once its main process has exited and the pipes
hold nothing unread (a background process may keep them open). The "nothing unread" check
must see the pipe on the loop the server really runs: uvicorn runs uvloop, whose pipe
transports expose the descriptor as ``socket``, not ``pipe``. Reading it as absent made the
check pass at once, and output still in the kernel pipe was dropped: the soak's ~1 in 1,000
runs that returned exit code 3 with empty stdout and stderr.

Here the race is forced: the pipes are paused (nothing is read) until well after the process
has exited, so the output is guaranteed to be unread when the exit is reaped.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from langflow_sandbox_createos.local.jailer import GuestProcess, _unread_bytes, pipe_fd, spawn

uvloop = pytest.importorskip("uvloop")

LOOPS: dict[str, Callable[[Coroutine[Any, Any, Any]], Any]] = {
    "asyncio": asyncio.run,
    "uvloop": uvloop.run,
}

PAYLOAD = b"o" * 60_000  # held in the kernel pipe (64 KiB) while nothing reads it


async def _exec_with_unread_output(release_after: float) -> tuple[dict[str, bytes], int, bool]:
    proc, exited = await spawn(
        "sh",
        "-c",
        f"sleep 0.1; head -c {len(PAYLOAD)} /dev/zero | tr '\\0' o; echo err >&2; exit 3",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    pipes = [proc._transport.get_pipe_transport(fd) for fd in (1, 2)]  # type: ignore[attr-defined]
    for pipe in pipes:
        pipe.pause_reading()  # the server is busy: nothing is read until released
    guest = GuestProcess(proc, exited, isolation=True, registry=set())
    guest.begin(None)
    exited_unread = False

    async def release() -> None:
        nonlocal exited_unread
        await exited
        await asyncio.sleep(release_after)
        exited_unread = not any(p.is_closing() for p in pipes)
        for pipe in pipes:
            with contextlib.suppress(Exception):
                pipe.resume_reading()

    releaser = asyncio.create_task(release())
    out = {"stdout": b"", "stderr": b""}
    while (item := await asyncio.wait_for(guest.next_chunk(), 10)) is not None:
        name, chunk = item
        out[name] += chunk
    code = await guest.wait()
    await releaser
    return out, code, exited_unread


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_output_unread_at_exit_is_delivered(loop: str) -> None:
    out, code, exited_unread = LOOPS[loop](_exec_with_unread_output(release_after=0.3))
    assert code == 3
    assert exited_unread, "the pipes were closed while their output was still unread"
    assert out == {"stdout": PAYLOAD, "stderr": b"err\n"}


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_unread_bytes_are_seen_on_both_loops(loop: str) -> None:
    """uvloop hands a subprocess a socketpair, asyncio a pipe: the count works on both."""

    async def probe() -> int:
        proc, _ = await spawn(
            "sh", "-c", "sleep 0.1; printf abcde; exec sleep 30", stdout=asyncio.subprocess.PIPE
        )
        transport = proc._transport.get_pipe_transport(1)  # type: ignore[attr-defined]
        transport.pause_reading()
        try:
            await asyncio.sleep(0.5)
            fd = pipe_fd(transport)
            assert fd is not None
            return _unread_bytes(fd)
        finally:
            proc.kill()
            transport.resume_reading()
            await proc.wait()

    assert LOOPS[loop](probe()) == 5
