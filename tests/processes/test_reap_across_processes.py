"""`createos-langflow reap` run from one process (another server's operator, `make run`'s
shell, a cron job) leaves another process's live work alone with its default options: the
guests of B's runs in flight (a CreateOS Sandbox run on its own guest, one on its reused guest,
a backend run on a guest taken from B's warm pool) and B's pooled guests waiting for runs stay
running, and each of B's runs then ends as if no reap had happened. Fails when the default reap
takes running guests (`reap-takes-running` in tests/mutations/mutations.toml)."""

from __future__ import annotations

import subprocess
import sys

from keeper_child import every_id, wait_gone

from langflow_sandbox_createos.local.testing import LocalControlPlane

from .conftest import USER_ID, in_flight, release, started_in, statuses, tag


def test_reap_from_one_process_leaves_another_process_runs_and_pool(
    plane: LocalControlPlane, start_driver
) -> None:
    before = every_id(plane)
    b = start_driver("server-b", CREATEOS_SANDBOX_WARM_POOL="2")
    b.ask("pool")
    fresh, reused, backend = tag(), tag(), tag()
    node = {"flow_id": f"reap-{fresh}", "user_id": USER_ID}
    for t, mode, node_id in (
        (fresh, "off", "CreateOSSandbox-rp001"),
        (reused, "flow", "CreateOSSandbox-rp002"),
    ):
        b.ask("component", tag=t, code=in_flight(t), mode=mode, component_id=node_id, **node)
    b.ask("backend", tag=backend, code=in_flight(backend))
    running = started_in(plane, [fresh, reused, backend])
    pooled = b.ask("pool")["pool"]  # refilled after the backend run took one
    assert len(pooled) == 2 and not set(pooled) & set(running.values()), (pooled, running)
    b_guests = {*running.values(), *pooled}

    reap = subprocess.run(
        [sys.executable, "-m", "langflow_sandbox_createos.cli", "reap", "--yes"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert reap.returncode == 0, reap.stdout + reap.stderr
    assert statuses(plane, b_guests) == dict.fromkeys(b_guests, "running"), reap.stdout
    assert "Kept " in reap.stdout, reap.stdout  # it saw B's running guests and left them

    for t, guest in running.items():
        release(plane, guest, t)
    for t in (fresh, reused, backend):
        outcome = b.result(t)
        assert outcome["result"] == f"released {t}" and outcome["exit_code"] == 0, outcome
    assert statuses(plane, pooled) == dict.fromkeys(pooled, "running")
    assert b.exit() == 0
    reused_guest = running[reused]
    wait_gone(plane, (every_id(plane) - before) - {reused_guest})  # B's own deletes, the pool's at exit
    plane.delete_sandbox(reused_guest)  # Guest Reuse keeps it by design
