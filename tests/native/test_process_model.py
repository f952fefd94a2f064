"""Fork safety and Ctrl-C: the two ways a process model can break a native client."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from langflow_sandbox_createos import _createos
from langflow_sandbox_createos.local.testing import LocalControlPlane


def test_fork_while_threads_are_mid_request(
    client: _createos.Client, sandbox: dict, cp: LocalControlPlane
) -> None:
    sid = sandbox["id"]
    client.whoami()  # the engine and its connections exist before the fork
    results: list[str] = []
    errors: list[BaseException] = []
    started = threading.Barrier(5)

    def busy(n: int) -> None:
        try:
            started.wait()
            r = client.exec(sid, "bash", ["-c", f"sleep 0.8; echo parent-{n}"], timeout=30)
            results.append(r.stdout)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=busy, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    started.wait()
    time.sleep(0.3)  # the four execs are in flight on inherited sockets
    pid = os.fork()
    if pid == 0:  # child: must work, without touching the parent's connections
        code = 1
        try:
            ok = client.whoami()["user_id"] == "local-user"
            r = client.exec(sid, "echo", ["child"], timeout=20)
            code = 0 if ok and r.stdout == "child\n" and r.streamed else 2
        except BaseException:
            code = 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    for t in threads:
        t.join()
    assert os.WEXITSTATUS(status) == 0
    assert errors == []
    assert sorted(results) == [f"parent-{n}\n" for n in range(4)]
    assert client.whoami()["user_id"] == "local-user"  # parent's engine unharmed


# libc's fork() called from C: no os.register_at_fork hook runs, so only the C core's own
# fork watch (a pthread_atfork child handler, csrc/common.c) can tell the child that the
# engine it holds is its parent's. Run in a fresh process with one thread, where a raw fork
# through ctypes is safe.
_RAW_FORK_CHILD = """
import ctypes, os, sys
from langflow_sandbox_createos import _createos
c = _createos.Client(sys.argv[1], sys.argv[2], connect_timeout=5.0, control_timeout=20.0)
c.whoami()
parent = c.stats()
pid = ctypes.CDLL(None).fork()
if pid == 0:
    code = 3
    try:
        ok = c.whoami()["user_id"] == "local-user"
        s = c.stats()
        # its own engine: one request, on a connection of its own
        code = 0 if ok and s["requests"] == 1 and s["connections_opened"] == 1 else 2
        if code:
            os.write(2, f"child stats {s}\\n".encode())
    finally:
        os._exit(code)
_, status = os.waitpid(pid, 0)
assert c.whoami()["user_id"] == "local-user"
after = c.stats()
assert after["requests"] == parent["requests"] + 1, (parent, after)
assert after["connections_opened"] == parent["connections_opened"], (parent, after)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_a_fork_python_does_not_see_leaves_the_parents_connections_alone(cp: LocalControlPlane) -> None:
    """A child made by fork() in C (no Python fork hook) must not use the parent's engine:
    its first call opens a connection of its own, and the parent's go on unharmed."""
    r = subprocess.run(
        [sys.executable, "-c", _RAW_FORK_CHILD, cp.url, cp.api_key],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])


def _wait_child(pid: int, seconds: float) -> int:
    """The child's exit status; a child still running after `seconds` is killed (-9)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return -9


def test_a_callback_that_forks_leaves_the_call_to_the_parent(client: _createos.Client, sandbox: dict) -> None:
    """A fork inside on_output happens mid-call: the child's copy of the call must not
    drive the parent's connections (it would read the parent's bytes off the shared
    socket). The child's call fails at once naming the fork; the parent's goes on."""
    parent = os.getpid()
    children: list[int] = []

    def on_output(stream: str, text: str) -> None:
        if not children and os.getpid() == parent:
            children.append(os.fork())

    try:
        r = client.exec(
            sandbox["id"], "bash", ["-c", "echo one; sleep 1; echo two"], timeout=30, on_output=on_output
        )
    except BaseException as exc:
        if os.getpid() != parent:  # the child: the named refusal, then a call of its own
            code = 2
            with contextlib.suppress(BaseException):
                if isinstance(exc, _createos.UnavailableError) and "forked during the call" in str(exc):
                    code = 0 if client.whoami()["user_id"] == "local-user" else 4
            os._exit(code)
        raise
    if os.getpid() != parent:
        os._exit(3)  # the child finished the parent's call on the parent's connection
    assert children and _wait_child(children[0], 30) == 0
    assert r.exit_code == 0 and r.stdout == "one\ntwo\n"
    assert client.exec(sandbox["id"], "echo", ["after"], timeout=10).stdout == "after\n"


@pytest.fixture
def sigint_raises() -> object:
    """Python's own Ctrl-C handler for the test. A process started with SIGINT ignored (any
    `cmd &` job of a non-interactive shell, as CI runners may be) keeps SIG_IGN, and the
    signal these tests send would then be dropped instead of raising KeyboardInterrupt."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are delivered to the main thread only")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


# The calls below would block for 30 s; returning well under that proves the interrupt
# cut them short. The bound is loose because these machines are shared and noisy.
PROMPT_SECONDS = 10.0


def test_keyboard_interrupt_during_long_exec(client: _createos.Client, sandbox: dict, sigint_raises) -> None:
    timer = threading.Timer(0.5, os.kill, args=(os.getpid(), signal.SIGINT))
    t0 = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        client.exec(sandbox["id"], "sleep", ["30"], timeout=60)
    elapsed = time.monotonic() - t0
    timer.join()
    assert elapsed < PROMPT_SECONDS, elapsed
    assert client.exec(sandbox["id"], "echo", ["after"], timeout=10).stdout == "after\n"
    assert client.stats()["cancelled"] >= 1


def test_keyboard_interrupt_during_run_program_still_deletes(
    client: _createos.Client, cp: LocalControlPlane, sigint_raises
) -> None:
    timer = threading.Timer(0.7, os.kill, args=(os.getpid(), signal.SIGINT))
    timer.start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        client.run_program({"shape": "s-1vcpu-256mb"}, "sleep", ["30"], timeout=60)
    assert time.monotonic() - t0 < PROMPT_SECONDS
    timer.join()
    outcomes = client.drain_deletes(timeout=10)
    assert len(outcomes) == 1 and outcomes[0][1] == 200
