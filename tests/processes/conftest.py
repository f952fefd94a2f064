"""Several processes using the plugin at once against one createos-local, as several Langflow
workers (`langflow run --workers N`) or several Langflow servers sharing one CreateOS account
do: each process is a `driver.py` of its own, with its own pools, keeper and admission line,
told what to run by the test (see driver.py for its commands).

A run "in flight" is a program that marks itself started in its guest (``/tmp/started-TAG``)
and waits until the test uploads ``/tmp/release-TAG`` into that guest: the test sees it start
(`started_in`, reading the guest's file through createos-local) and decides when it ends.
"""

from __future__ import annotations

import json
import os
import queue
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from langflow_sandbox_createos._createos import Client
from langflow_sandbox_createos.core import settings
from langflow_sandbox_createos.local.testing import LocalControlPlane

DRIVER = Path(__file__).with_name("driver.py")
ANSWER_SECONDS = 240.0  # a command's answer (an lfx import, a pool filled on a loaded machine)
USER_ID = "00000000-0000-4000-8000-000000000045"  # the Langflow user of every node run here
# Settings a developer's shell could hold that would change what the children do
_CLEARED = (
    *settings.BACKEND_VARIABLES,
    "CREATEOS_API_KEY",
    "CREATEOS_SANDBOX_REUSE_IDLE_SECONDS",
    "CREATEOS_EXECUTOR_WARM_POOL",
)


def in_flight(tag: str) -> str:
    """A program that marks itself started, then waits (up to 200 s) to be released."""
    return (
        "import os, time\n"
        f"open('/tmp/started-{tag}', 'w').close()\n"
        "deadline = time.monotonic() + 200\n"
        f"while not os.path.exists('/tmp/release-{tag}') and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
        f"print('released {tag}' if os.path.exists('/tmp/release-{tag}') else 'never released')\n"
    )


class Driver:
    """One driver process and its line protocol."""

    def __init__(self, name: str, env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.stderr_path = log_dir / f"{name}.stderr"
        self._stderr = open(self.stderr_path, "wb")  # noqa: SIM115  (closed in close())
        self.proc = subprocess.Popen(
            [sys.executable, str(DRIVER)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            start_new_session=True,  # a signal for the test's process group is not for it
        )
        self._answers: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._answers.put(line)
        self._answers.put(None)

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-4000:]

    def send(self, **cmd: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def answer(self, timeout: float = ANSWER_SECONDS) -> dict[str, Any]:
        try:
            line = self._answers.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"{self.name}: no answer within {timeout:g} s\n{self.stderr()}") from None
        assert line is not None, (
            f"{self.name} ended (exit {self.proc.poll()}) without answering\n{self.stderr()}"
        )
        got: dict[str, Any] = json.loads(line)
        assert got["ok"], f"{self.name}: {got.get('error')}\n{got.get('traceback', '')}\n{self.stderr()}"
        return got

    def ask(self, op: str, **fields: Any) -> dict[str, Any]:
        self.send(op=op, **fields)
        return self.answer()

    def result(self, tag: str) -> dict[str, Any]:
        outcome: dict[str, Any] = self.ask("result", tag=tag)["outcome"]
        assert "raised" not in outcome, (
            f"{self.name} run {tag}: {outcome['raised']}\n{outcome.get('traceback')}"
        )
        return outcome

    def exit(self) -> int:
        """End it normally (atexit runs), and wait for it."""
        self.ask("exit")
        return self.proc.wait(60)

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        self._stderr.close()


@pytest.fixture
def plane(cp: LocalControlPlane, createos_env: LocalControlPlane) -> LocalControlPlane:
    """The session's createos-local, checked for leftovers after the test (``cp``)."""
    return cp


@pytest.fixture
def start_driver(plane: LocalControlPlane, tmp_path: Path) -> Iterator[Any]:
    """Start driver processes (``start_driver(name, **env)``); any still running at the end is
    killed (its keeper then deletes what it held)."""
    made: list[Driver] = []
    base = {k: v for k, v in os.environ.items() if k not in _CLEARED}
    base.update(
        LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS="true",
        CREATEOS_SANDBOX_ACCEPT_LOCAL_ISOLATION="true",
        LANGFLOW_SANDBOX_TIMEOUT_SECONDS="300",  # a run in flight waits for the test's word
    )

    def start(name: str, **env: str) -> Driver:
        driver = Driver(name, {**base, **env}, tmp_path)
        made.append(driver)
        return driver

    yield start
    for driver in made:
        driver.close()


def tag() -> str:
    return secrets.token_hex(4)


def started_in(plane: LocalControlPlane, tags: list[str], timeout: float = 180.0) -> dict[str, str]:
    """The guest each run in flight (`in_flight(tag)`) started in, once all have started."""
    found: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    while len(found) < len(tags):
        for sb in plane.live_sandboxes():
            for t in tags:
                if t not in found and plane.guest_file(sb["id"], f"/tmp/started-{t}").exists():
                    found[t] = sb["id"]
        assert time.monotonic() < deadline, f"not started within {timeout:g} s: {set(tags) - set(found)}"
        time.sleep(0.1)
    return found


def release(plane: LocalControlPlane, sandbox_id: str, t: str) -> None:
    """Let the run in flight `t` in that guest end (an upload through the control plane)."""
    Client(plane.url, plane.api_key).upload(sandbox_id, f"/tmp/release-{t}", b"go")


def statuses(plane: LocalControlPlane, ids: list[str] | set[str]) -> dict[str, str]:
    rows = {sb["id"]: sb["status"] for sb in plane.sandboxes()}
    return {i: rows.get(i, "absent") for i in ids}
