"""No guest of the CreateOS Sandbox component outlives its process: a run's own guest is held
in the pool keeper from its create until its delete succeeded, and a reused guest (Guest
Reuse) for as long as it is kept, so whatever way the process ends, the keeper deletes them."""

from __future__ import annotations

import os
from typing import Any

from keeper_child import KEEPER_LINE, every_id, run_child, status, wait_exited, wait_gone

from langflow_sandbox_createos.local.testing import LocalControlPlane

from .conftest import USER_ID

RUN = """
import threading
from langflow_sandbox_createos.component import engine

def request(program, session_mode="off"):
    fields = {"python_code": program, "session_mode": session_mode, "timeout_seconds": 150}
    return engine.build_request(fields, component_id="keeper-node", flow_id=FLOW, user_id=USER, session_id=None)
"""

IN_FLIGHT = (
    RUN
    + """
from langflow_sandbox_createos.core import connection
client = connection.endpoints.get().client
LIVE = ("creating", "running")
before = {row["id"] for row in client.list(prefix="lf-c-") if row["status"] in LIVE}
threading.Thread(target=engine.run, args=(request("import time\\ntime.sleep(120)"),), daemon=True).start()
deadline = time.monotonic() + 30
while time.monotonic() < deadline:  # the run's guest, as the control plane sees it
    ours = {row["id"] for row in client.list(prefix="lf-c-") if row["status"] in LIVE} - before
    if ours:
        break
    time.sleep(0.05)
wait_held(ours)  # the create has returned
time.sleep(1.0)  # the exec is under way
report(run=sorted(ours))
die(HOW)
"""
)

KEPT = (
    RUN
    + """
outcome = engine.run(request("print('kept')", session_mode="flow"))
assert outcome.stdout == "kept\\n" and outcome.reused_guest is False, outcome
report(run=[outcome.sandbox_id])
die(HOW)
"""
)

CLEAN = (
    RUN
    + """
outcome = engine.run(request("print('done')"))
assert outcome.stdout == "done\\n", outcome
report(run=[outcome.sandbox_id])
die(HOW)
"""
)


def script(body: str, flow: str) -> str:
    return body.replace("FLOW", repr(flow)).replace("USER", repr(USER_ID))


def in_child(cp: LocalControlPlane, body: str, how: str, flow: str) -> tuple[str, dict[str, Any], str]:
    before = every_id(cp)
    report, stderr = run_child(script(body, flow), how, dict(os.environ))
    (guest,) = report["run"]
    assert guest in every_id(cp) - before
    return guest, report, stderr


def test_a_killed_process_leaves_no_guest_of_a_run_in_flight(env: LocalControlPlane) -> None:
    guest, report, stderr = in_child(env, IN_FLIGHT, "SIGKILL", "keeper-in-flight")
    assert guest in report["held"]
    assert KEEPER_LINE in stderr, stderr
    wait_gone(env, [guest])
    wait_exited(report["keeper"])


def test_a_kept_reused_guest_outlives_a_killed_process(reuse_env: LocalControlPlane) -> None:
    """Guest Reuse keeps the guest between runs on purpose, and other workers of the flow share
    it (the product page), so the keeper leaves it: a worker recycled while another one runs on
    the guest must not take it away. Idle expiry, the sweep, auto-pause and reap bound it."""
    guest, report, stderr = in_child(reuse_env, KEPT, "SIGKILL", "keeper-kept")
    assert guest not in report["held"]
    wait_exited(report["keeper"])
    assert KEEPER_LINE not in stderr, stderr
    [row] = [sb for sb in reuse_env.sandboxes() if sb["id"] == guest]
    assert row["status"] == "running", row
    reuse_env.delete_all()


def test_a_clean_run_leaves_the_keeper_nothing_to_do(env: LocalControlPlane) -> None:
    guest, report, stderr = in_child(env, CLEAN, "exit", "keeper-clean")
    assert report["held"] == []  # the run deleted its guest and released it
    assert status(env, guest) in ("destroying", "destroyed")
    wait_exited(report["keeper"])
    assert KEEPER_LINE not in stderr, stderr


def test_a_guest_whose_delete_failed_stays_held_for_the_keeper(env: LocalControlPlane) -> None:
    env.set_faults({"rules": [{"route": "delete", "status": 500, "times": 1}]})
    guest, report, stderr = in_child(env, CLEAN, "os._exit", "keeper-failed-delete")
    assert env.fault_hits() == [1]  # the run's own delete failed...
    assert report["held"] == [guest]  # ...so the guest stayed held...
    wait_gone(env, [guest])  # ...and the keeper deleted it
    assert "deleted 1" in stderr, stderr
    wait_exited(report["keeper"])
