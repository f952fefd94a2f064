"""The one way the tests end a process that holds guests and watch its pool keeper delete them.

A child Python process (``run_child``) runs a script against the test's createos-local that
starts guests, prints one JSON line (the guests' ids and its keeper's pid, ``report``) and
then calls ``die(how)``: ``SIGKILL`` or ``SIGQUIT`` (the default action: the process dies on
the spot), ``os._exit`` (no atexit, as gunicorn's workers end) or ``exit`` (a clean end, atexit
runs). The test then waits for the guests to be gone (``wait_gone``) and for the keeper to
exit (``wait_exited``). Importable from every suite: ``tests/`` is on ``sys.path``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
WAYS = ("SIGKILL", "SIGQUIT", "os._exit")  # how a Langflow worker dies without atexit
GONE = ("destroying", "destroyed")
KEEPER_LINE = "ended without deleting"  # the keeper's stderr line when it had guests to delete

PRELUDE = textwrap.dedent(
    """
    import json, os, signal, sys, time

    def report(**fields):
        from langflow_sandbox_createos.core import connection, pool_keeper

        keeper = pool_keeper.keepers.for_endpoint(connection.endpoints.get())
        fields.update(keeper=keeper.pid, held=sorted(pool_keeper.keepers.held_ids()))
        print(json.dumps(fields), flush=True)

    def wait_held(ids, seconds=60):
        # a guest seen on the control plane may still be inside its create call (it is held
        # once the create returns): wait for that, or give up and let the test's assert say it
        from langflow_sandbox_createos.core import pool_keeper

        deadline = time.monotonic() + seconds
        while not set(ids) <= pool_keeper.keepers.held_ids() and time.monotonic() < deadline:
            time.sleep(0.05)

    def die(how):
        if how == "exit":
            return
        if how == "os._exit":
            os._exit(0)
        signum = getattr(signal, how)
        # the default action, as a gunicorn worker has it: a process started from a `cmd &` of
        # a non-interactive shell inherits SIGQUIT (and SIGINT) ignored, and would live on
        if signum != signal.SIGKILL:
            signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        time.sleep(60)
        print(f"{how} did not end the child", file=sys.stderr, flush=True)
        os._exit(3)
    """
)


def run_child(
    script: str, how: str, env: dict[str, str], timeout: float = 280.0
) -> tuple[dict[str, Any], str]:
    """Run ``script`` (which ends with ``die(HOW)``) in a fresh interpreter of this worktree;
    its last JSON line and its stderr."""
    source = PRELUDE + textwrap.dedent(script).replace("HOW", repr(how))
    done = subprocess.run(
        [sys.executable, "-c", source], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout
    )
    if how in ("SIGKILL", "SIGQUIT"):  # it died of the signal, not of anything after it
        assert done.returncode == -getattr(signal, how), (done.returncode, done.stderr[-4000:])
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"the child printed no report (exit {done.returncode}):\n{done.stderr[-4000:]}"
    return json.loads(lines[-1]), done.stderr


def every_id(cp: Any) -> set[str]:
    """Every sandbox the control plane has seen, deleted ones included: what a child created
    is the difference before and after it."""
    return {row["id"] for row in cp.sandboxes()}


def status(cp: Any, sandbox_id: str) -> str:
    """The control plane's own view of one sandbox's status, deleted or not."""
    answer = httpx.get(f"{cp.url}/v1/sandboxes/{sandbox_id}", headers={"X-Api-Key": cp.api_key}, timeout=10)
    answer.raise_for_status()
    return str(answer.json()["data"]["status"])


def wait_gone(cp: Any, ids: set[str] | list[str], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        left = {sid: status(cp, sid) for sid in ids}
        if all(state in GONE for state in left.values()):
            return
        assert time.monotonic() < deadline, f"still there after {timeout:g} s: {left}"
        time.sleep(0.2)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (not yet reaped by init) has exited
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def wait_exited(pid: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while alive(pid):
        assert time.monotonic() < deadline, f"keeper {pid} still running after {timeout:g} s"
        time.sleep(0.1)
