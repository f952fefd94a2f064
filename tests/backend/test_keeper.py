"""No guest of the sandbox backend outlives its process: a run's guest (cold or taken from the
warm pool) is held in the pool keeper from its create until its delete is reported, so a
process killed mid-run leaves it to the keeper; a run that ends releases it."""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import pytest
from keeper_child import KEEPER_LINE, WAYS, every_id, run_child, wait_exited, wait_gone

from langflow_sandbox_createos.backend.engine import CreateOSBackend
from langflow_sandbox_createos.core import connection, pool_keeper

from .conftest import sandbox_view

IN_FLIGHT = """
import threading
from langflow_sandbox_createos.backend.engine import create_backend
from langflow_sandbox_createos.core import connection
backend = create_backend()
pooled = bool(os.environ.get("CREATEOS_SANDBOX_WARM_POOL"))
if pooled:
    backend.run("print('warm-up')")  # goes cold and starts the pool
    assert backend._pool.wait_full(20)
client = connection.endpoints.get().client
LIVE = ("creating", "running")
ready = set(backend._pool.ready_ids())
before = {row["id"] for row in client.list(prefix="lf-") if row["status"] in LIVE}
threading.Thread(target=backend.run, args=("import time\\ntime.sleep(120)",), daemon=True).start()
deadline = time.monotonic() + 30
while time.monotonic() < deadline:  # the run's guest, as the pool or the control plane sees it
    if pooled:
        ours = ready - set(backend._pool.ready_ids())
    else:
        ours = {row["id"] for row in client.list(prefix="lf-") if row["status"] in LIVE} - before
    if ours:
        break
    time.sleep(0.05)
if pooled:
    assert backend._pool.wait_full(20)  # no create of a refill in flight at the kill
wait_held(ours)  # the create has returned
time.sleep(1.0)  # the exec is under way
report(run=sorted(ours))
die(HOW)
"""

CASES = [("cold", how) for how in WAYS] + [("pooled", "SIGKILL")]


@pytest.mark.parametrize(("source", "how"), CASES)
def test_a_killed_process_leaves_no_guest_of_a_run_in_flight(backend_env: Any, source: str, how: str) -> None:
    """The benchmark's case, for the backend: a run in flight when the process died."""
    env = dict(os.environ)
    if source == "pooled":
        env["CREATEOS_SANDBOX_WARM_POOL"] = "1"
    before = every_id(backend_env)
    report, stderr = run_child(IN_FLIGHT, how, env)
    (guest,) = report["run"]
    assert guest in report["held"], report
    assert KEEPER_LINE in stderr, stderr
    assert sandbox_view(backend_env, guest)["name"].startswith("lf-w-" if source == "pooled" else "lf-")
    created = every_id(backend_env) - before
    assert guest in created
    wait_gone(backend_env, created)  # the run's guest, and any pooled one
    wait_exited(report["keeper"])


CLEAN = """
from langflow_sandbox_createos.backend.engine import create_backend
backend = create_backend()
result = backend.run("print('done')")
assert result.stdout == "done\\n", result
backend.shutdown()  # waits for the background delete and collects its outcome
report(run=[])
die(HOW)
"""


def test_a_clean_run_leaves_the_keeper_nothing_to_do(backend_env: Any) -> None:
    before = every_id(backend_env)
    report, stderr = run_child(CLEAN, "exit", dict(os.environ))
    assert report["held"] == []  # the run's guest was released once its delete was reported
    wait_exited(report["keeper"])
    assert KEEPER_LINE not in stderr, stderr
    wait_gone(backend_env, every_id(backend_env) - before)


def test_a_run_holds_its_guest_only_while_it_is_in_flight(backend: CreateOSBackend, backend_env: Any) -> None:
    before = pool_keeper.keepers.held_ids()
    thread = threading.Thread(target=backend.run, args=("import time\ntime.sleep(3)",))
    thread.start()
    deadline = time.monotonic() + 30
    while not pool_keeper.keepers.held_ids() - before:
        assert thread.is_alive() and time.monotonic() < deadline
        time.sleep(0.01)
    (guest,) = pool_keeper.keepers.held_ids() - before
    assert sandbox_view(backend_env, guest)["status"] == "running"
    thread.join(60)
    backend.shutdown()  # collects the background delete's outcome
    assert guest not in pool_keeper.keepers.held_ids()
    assert sandbox_view(backend_env, guest)["status"] in ("destroying", "destroyed")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX fork")
def test_a_fork_child_holds_and_deletes_only_its_own_guests(
    backend: CreateOSBackend, backend_env: Any
) -> None:
    """A fork child starts with nothing held: its keeper, when it dies, never deletes the
    parent's guest of a run in flight."""
    before = pool_keeper.keepers.held_ids()
    thread = threading.Thread(target=backend.run, args=("import time\ntime.sleep(20)",))
    thread.start()
    while not pool_keeper.keepers.held_ids() - before:
        assert thread.is_alive()
        time.sleep(0.01)
    (parent_guest,) = pool_keeper.keepers.held_ids() - before
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one run of its own, then die without atexit
        code = 1
        try:
            inherited = sorted(pool_keeper.keepers.held_ids())
            threading.Thread(target=backend.run, args=("import time\ntime.sleep(20)",), daemon=True).start()
            while not pool_keeper.keepers.held_ids():
                time.sleep(0.01)
            keeper = pool_keeper.keepers.for_endpoint(connection.endpoints.get()).pid
            own = sorted(pool_keeper.keepers.held_ids())
            os.write(write_fd, json.dumps({"inherited": inherited, "own": own, "keeper": keeper}).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    _, code = os.waitpid(pid, 0)
    with os.fdopen(read_fd) as pipe:
        report = json.loads(pipe.read() or "{}")
    assert os.waitstatus_to_exitcode(code) == 0, report
    assert report["inherited"] == []
    (child_guest,) = report["own"]
    wait_gone(backend_env, [child_guest])  # the child's keeper deleted the child's guest...
    wait_exited(report["keeper"])
    assert sandbox_view(backend_env, parent_guest)["status"] == "running"  # ...and only it
    assert parent_guest in pool_keeper.keepers.held_ids()
    thread.join(60)
