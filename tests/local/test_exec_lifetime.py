"""What ties an exec's processes to the server, now that an exec's bwrap joins the guest's
PID namespace without ``--die-with-parent`` (see ``GuestRunner._bwrap_argv``: with
``--pidns`` that flag could SIGKILL the command at its start on a loaded host).

The guest's PID 1 still dies with the server, and the kernel then ends every process of the
namespace: a foreground exec, a process it left in the background, and the guest's PID 1
itself are all gone once the server is SIGKILLed.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import httpx
from cp_helpers import SHAPE, SandboxFactory, data, make_client, run, sh

from langflow_sandbox_createos.local.testing import LocalControlPlane


def _pids_running(argv: bytes) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "cmdline").read_bytes() == argv:
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _until(predicate: object, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


PDEATHSIG_PROBE = (
    "import ctypes\n"
    "sig = ctypes.c_int(-1)\n"
    "assert ctypes.CDLL(None, use_errno=True).prctl(2, ctypes.byref(sig), 0, 0, 0) == 0\n"  # PR_GET_PDEATHSIG
    "print(sig.value)"
)


def test_the_command_of_an_exec_carries_no_parent_death_signal(
    client: httpx.Client, sandbox_factory: SandboxFactory
) -> None:
    """bwrap execs the command itself, and a parent-death signal survives execve: python3
    run as the exec's command reads the one bwrap armed. With ``--die-with-parent`` it was 9
    (SIGKILL), tied to whichever process was the parent at that moment."""
    sid = sandbox_factory()["id"]
    sh(client, sid, "true")  # the guest's PID 1 runs: later execs join its namespaces
    result = run(client, sid, "python3", "-c", PDEATHSIG_PROBE)
    assert (result["exit_code"], result["stdout"]) == (0, "0\n"), result


def test_every_guest_process_dies_with_a_sigkilled_server() -> None:
    # Unique argv values: the host's /proc finds exactly this test's processes.
    stamp = str(os.getpid() % 1000 + 7000)
    background = f"sleep {stamp}1".encode().replace(b" ", b"\0") + b"\0"
    foreground = f"sleep {stamp}2".encode().replace(b" ", b"\0") + b"\0"
    plane = LocalControlPlane().start()
    try:
        with make_client(plane) as c:
            sid = data(c.post("/v1/sandboxes", json={"shape": SHAPE}))["id"]
            started = sh(c, sid, f"sleep {stamp}1 >/dev/null 2>&1 & echo started")
            assert started["stdout"] == "started\n", started

            def long_exec() -> None:
                try:
                    with make_client(plane) as other:
                        sh(other, sid, f"sleep {stamp}2")
                except (httpx.HTTPError, AssertionError):
                    pass  # the server dies under it

            waiter = threading.Thread(target=long_exec, daemon=True)
            waiter.start()
            assert _until(lambda: _pids_running(foreground) and _pids_running(background), 20)
            assert plane.process is not None
            plane.process.kill()
            plane.process.wait(10)
            gone = _until(lambda: not _pids_running(foreground) and not _pids_running(background), 15)
            assert gone, {"foreground": _pids_running(foreground), "background": _pids_running(background)}
            waiter.join(15)
    finally:
        plane.stop()
