"""Two processes with warm pools and guest keepers (two Langflow workers, or two servers on one
account), each with a run in flight; one ends, normally (its pool deletes its guests at exit)
or by SIGKILL (its keeper deletes them). All of its guests go, none of the other's: the other's
run goes on to its end, its pooled guests stay and still serve, and once it ends too nothing of
either is left. Fails when a keeper deletes guests it does not hold (`keeper-takes-pools` in
tests/mutations/mutations.toml)."""

from __future__ import annotations

import pytest
from keeper_child import every_id, wait_exited, wait_gone

from langflow_sandbox_createos.local.testing import LocalControlPlane

from .conftest import in_flight, release, started_in, statuses, tag


@pytest.mark.parametrize("how", ["exit", "SIGKILL"])
def test_one_process_ending_leaves_the_other_its_runs_and_guests(
    plane: LocalControlPlane, start_driver, how: str
) -> None:
    before = every_id(plane)
    a = start_driver("worker-a", CREATEOS_SANDBOX_WARM_POOL="2")
    b = start_driver("worker-b", CREATEOS_SANDBOX_WARM_POOL="2")
    a.ask("pool")
    b.ask("pool")
    ta, tb = tag(), tag()
    a.ask("backend", tag=ta, code=in_flight(ta))
    b.ask("backend", tag=tb, code=in_flight(tb))
    running = started_in(plane, [ta, tb])
    a_state, b_state = a.ask("pool"), b.ask("pool")  # both pools refilled
    # what each keeper holds: its run's guest, its pool, any guest of an earlier run still being
    # deleted in the background
    a_guests = set(a_state["held"])
    b_guests = {running[tb], *b_state["pool"]}  # B's live guests
    assert running[ta] in a_guests and b_guests <= set(b_state["held"]), (running, a_state, b_state)
    assert len(b_guests) == 3 and not a_guests & set(b_state["held"])

    if how == "exit":
        release(plane, running[ta], ta)
        assert a.result(ta)["result"] == f"released {ta}"
        assert a.exit() == 0
    else:
        a.kill()
    wait_gone(plane, a_guests)  # by its own run and pool, or by its keeper
    wait_exited(a_state["keeper"])
    assert statuses(plane, b_guests) == dict.fromkeys(b_guests, "running")

    release(plane, running[tb], tb)
    assert b.result(tb)["result"] == f"released {tb}"
    after = tag()
    b.ask("backend", tag=after, code=f"print('after {after}')")  # B's pool still serves
    assert b.result(after)["result"] == f"after {after}"
    assert b.exit() == 0
    wait_gone(plane, every_id(plane) - before)
    wait_exited(b_state["keeper"])
