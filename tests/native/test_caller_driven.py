"""Who drives a transfer: the calling thread, woken by its own sockets.

A call made while no other thread drives the client's engine runs on the caller's thread from
start to end (no thread is handed the request, none is started for it), and its wait ends when
its transfer needs the caller, not in 100 ms slices. Background work no caller waits for (a
background delete) goes to one helper thread, started the first time it is needed. (With
libcurl older than 7.87 the helper drives every transfer, as the I/O thread did.)"""

from __future__ import annotations

import os
import resource
import threading
import time
from typing import Any

import pytest

from langflow_sandbox_createos import _createos
from langflow_sandbox_createos.local.testing import LocalControlPlane

from .conftest import SHAPE

# libcurl before 7.87 joins a stuck resolver thread, and one without an asynchronous resolver
# resolves inside the transfer: there the helper drives every transfer
pytestmark = pytest.mark.skipif(
    not _createos.callers_drive,
    reason="callers drive only with CURLOPT_QUICK_EXIT and an asynchronous resolver",
)


def _threads() -> set[str]:
    return set(os.listdir("/proc/self/task"))


def test_a_call_alone_runs_on_the_callers_thread(cp: LocalControlPlane) -> None:
    before = _threads()
    c = _createos.Client(cp.url, cp.api_key, control_timeout=20.0)
    try:
        c.whoami()
        guest = c.create({"shape": SHAPE})
        r = c.exec(guest["id"], "echo", ["hi"], timeout=20, on_output=lambda s, t: None)
        assert r.stdout == "hi\n"
        c.run_program({"shape": SHAPE}, "true", timeout=20, delete="wait")
        c.delete(guest["id"])
        assert _threads() == before, "a call alone started or used another thread"
        # a background delete has no caller waiting: the helper drives it
        c.run_program({"shape": SHAPE}, "true", timeout=20, delete="background")
        assert c.drain_deletes(timeout=20)[0][2] is None
        assert len(_threads() - before) == 1
    finally:
        c.close()
    assert _threads() == before  # close() joined the helper


def _voluntary_switches_during(call: Any) -> int:
    start = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
    call()
    return resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw - start


def test_a_wait_ends_on_its_transfer_not_in_slices(client: _createos.Client, sandbox: dict) -> None:
    """A 2 s exec that prints nothing: the calling thread sleeps in poll until the answer comes.
    Waiting in 100 ms slices (the old I/O-thread hand-off) woke it 20 times or more."""

    def quiet_exec() -> None:
        r = client.exec(sandbox["id"], "sleep", ["2"], timeout=20, stream=True)
        assert r.exit_code == 0

    quiet_exec()  # connection up, easy handle pooled
    counts: list[int] = []
    worker = threading.Thread(target=lambda: counts.append(_voluntary_switches_during(quiet_exec)))
    t0 = time.monotonic()
    worker.start()
    worker.join()
    assert time.monotonic() - t0 >= 2.0
    # the main thread also looks at signals once a second while it drives (a signal that
    # landed outside its poll): a few more wake-ups, still far from 20
    counts.append(_voluntary_switches_during(quiet_exec))
    assert all(n < 10 for n in counts), counts


def test_a_quiet_wait_past_the_first_second_sleeps(client: _createos.Client, sandbox: dict) -> None:
    """A worker thread (it does not watch signals) waiting 4 s on an exec that prints nothing
    sleeps in poll all along. Its look at the clock every second once left the poll timeout
    negative after the first second: the thread spun, using a core until the answer came."""

    def quiet_exec() -> None:
        r = client.exec(sandbox["id"], "sleep", ["4"], timeout=20, stream=True)
        assert r.exit_code == 0

    cpu: list[float] = []

    def measured() -> None:
        start = time.thread_time()
        quiet_exec()
        cpu.append(time.thread_time() - start)

    worker = threading.Thread(target=measured)
    worker.start()
    worker.join()
    # sleeping: a few ms of CPU; spinning for 3 s gets well over 0.1 s even on a loaded machine
    assert cpu and cpu[0] < 0.1, f"the waiting thread used {cpu[0]:.3f} s of CPU in a 4 s quiet wait"
