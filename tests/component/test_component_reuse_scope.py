"""Whose reused guest a run gets (per Langflow user, and per session in `session` mode), and
how long an idle one lives (CREATEOS_SANDBOX_REUSE_IDLE_SECONDS), run by lfx in a real Graph
against createos-local with real guest processes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from waiting import wait_status

from langflow_sandbox_createos.component import engine, reuse
from langflow_sandbox_createos.core import network, pool_keeper
from langflow_sandbox_createos.local.testing import LocalControlPlane

from .conftest import REUSE_PREFIX, client, run_flow

ALICE = "00000000-0000-4000-8000-00000000a11c"
BOB = "00000000-0000-4000-8000-0000000000b0"

# Leaves a file named after the run's user, then lists what the guest's /workspace holds.
VISIT = (
    "import os, pathlib, sys\n"
    "pathlib.Path('/workspace', sys.argv[1] if len(sys.argv) > 1 else 'visitor-' + {who!r}).write_text('secret')\n"
    "print(' '.join(sorted(n for n in os.listdir('/workspace') if n.startswith('visitor-'))))\n"
)


def visit(component_cls: type, who: str, mode: str = "flow", **kw: Any) -> dict[str, Any]:
    return run_flow(component_cls, session_mode=mode, python_code=VISIT.format(who=who), **kw).results


@pytest.fixture
def scoped(reuse_env: LocalControlPlane) -> Iterator[LocalControlPlane]:
    reuse.sweeper.reset()
    yield reuse_env
    reuse.sweeper.reset()


def test_end_users_of_one_served_flow_get_their_own_guest(
    component_cls: type, scoped: LocalControlPlane
) -> None:
    """Issue 27: Langflow serves a flow to end users under the flow owner's user id, stamping
    `graph.end_user_id`; reuse was keyed on the owner, so every end user landed on one guest."""
    carol = visit(component_cls, "carol", user_id=ALICE, end_user_id="carol@gateway")
    dave = visit(component_cls, "dave", user_id=ALICE, end_user_id="dave@gateway")
    assert carol["sandbox_id"] != dave["sandbox_id"], (carol, dave)
    assert dave["result"] == "visitor-dave"  # not Carol's file
    again = visit(component_cls, "carol", user_id=ALICE, end_user_id="carol@gateway")
    assert again["sandbox_id"] == carol["sandbox_id"] and again["result"] == "visitor-carol"
    owner = visit(component_cls, "alice", user_id=ALICE)  # the owner on the canvas: a guest of her own
    assert owner["sandbox_id"] not in (carol["sandbox_id"], dave["sandbox_id"])
    # an anonymous end user (Langflow's random anon:: session) never reuses, never shares
    for _ in range(2):
        anon = visit(component_cls, "anon", user_id=ALICE, session_id="anon::5f1d0c")
        assert anon["reused_guest"] is False and "no Langflow user id" in anon["reuse_notice"], anon
        assert anon["result"] == "visitor-anon"


def _paused_and_idle(sandbox_id: str, seconds: float) -> None:
    """Pause the guest (what auto-pause does after its window) and let `seconds` pass."""
    client().pause(sandbox_id)
    wait_status(client(), sandbox_id, "paused")
    while (reuse.idle_seconds(client().get(sandbox_id)) or 0.0) <= seconds:
        time.sleep(0.2)


def test_two_users_of_one_flow_get_their_own_guest_and_files(
    component_cls: type, scoped: LocalControlPlane
) -> None:
    alice = visit(component_cls, "alice", user_id=ALICE)
    bob = visit(component_cls, "bob", user_id=BOB)
    assert alice["sandbox_id"] != bob["sandbox_id"]
    assert alice["result"] == "visitor-alice"
    assert bob["result"] == "visitor-bob"  # Alice's file is not in Bob's guest
    again = visit(component_cls, "alice", user_id=ALICE)
    assert again["sandbox_id"] == alice["sandbox_id"] and again["reused_guest"] is True
    assert again["result"] == "visitor-alice"  # and Bob's is not in Alice's
    names = {sb["name"] for sb in scoped.live_sandboxes() if sb["name"].startswith(REUSE_PREFIX)}
    assert names == {
        reuse.reuse_name("flow-test", "CreateOSSandbox-t0001", network.DENY_ALL, (f"user:{u}",))
        for u in (ALICE, BOB)
    }


def test_session_mode_is_per_user_and_session(component_cls: type, scoped: LocalControlPlane) -> None:
    a1 = visit(component_cls, "a1", "session", user_id=ALICE, session_id="s1")
    a2 = visit(component_cls, "a2", "session", user_id=ALICE, session_id="s2")
    b1 = visit(component_cls, "b1", "session", user_id=BOB, session_id="s1")  # Bob picks Alice's session id
    assert len({a1["sandbox_id"], a2["sandbox_id"], b1["sandbox_id"]}) == 3
    assert [a1["result"], a2["result"], b1["result"]] == ["visitor-a1", "visitor-a2", "visitor-b1"]
    again = visit(component_cls, "a1", "session", user_id=ALICE, session_id="s1")
    assert again["sandbox_id"] == a1["sandbox_id"] and again["result"] == "visitor-a1"


def test_owner_parts_cannot_be_forged_through_the_session_id() -> None:
    deny = network.DENY_ALL
    name = reuse.reuse_name("f", "c", deny, ("user:a", "session:b"))
    assert name != reuse.reuse_name("f", "c", deny, ("user:a:session:b",))
    assert name != reuse.reuse_name("f", "c", deny, ("user:a",))
    assert engine.reuse_owner("session", "a", "") is None
    assert engine.reuse_owner("flow", "", "s") is None
    assert engine.reuse_owner("off", None, None) == ()


@pytest.mark.parametrize(("mode", "user", "session"), [("flow", None, None), ("session", ALICE, "")])
def test_no_identity_runs_on_a_fresh_guest(
    component_cls: type, scoped: LocalControlPlane, mode: str, user: str | None, session: str
) -> None:
    results = visit(component_cls, "nobody", mode, user_id=user, session_id=session)
    assert results["exit_code"] == 0 and results["reused_guest"] is False
    assert "no Langflow user id" in results["reuse_notice"]
    assert scoped.wait_until_no_live(timeout=10.0) == []  # the fresh guest was deleted, none kept


def alice_idle_past_lifetime(component_cls: type, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Alice's reused guest, paused longer than a lifetime of 1 s."""
    alice = visit(component_cls, "alice", user_id=ALICE)
    monkeypatch.setenv("CREATEOS_SANDBOX_REUSE_IDLE_SECONDS", "1")
    _paused_and_idle(alice["sandbox_id"], 1.0)
    return alice


def test_idle_guest_is_deleted_at_its_next_use(
    component_cls: type, scoped: LocalControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = alice_idle_past_lifetime(component_cls, monkeypatch)
    assert first["sandbox_id"] not in pool_keeper.keepers.held_ids()  # kept for other workers too
    second = visit(component_cls, "alice2", user_id=ALICE)
    assert second["sandbox_id"] != first["sandbox_id"] and second["reused_guest"] is False
    assert first["sandbox_id"] in second["reuse_notice"]
    assert second["result"] == "visitor-alice2"  # nothing of the expired guest carried over
    assert client().get(first["sandbox_id"])["status"] in ("destroying", "destroyed")
    assert second["sandbox_id"] not in pool_keeper.keepers.held_ids()


def test_a_paused_guest_within_its_lifetime_is_kept(component_cls: type, scoped: LocalControlPlane) -> None:
    first = visit(component_cls, "alice", user_id=ALICE)
    _paused_and_idle(first["sandbox_id"], 1.0)  # idle, but far below the default hour
    second = visit(component_cls, "alice2", user_id=ALICE)
    assert second["sandbox_id"] == first["sandbox_id"] and "reuse_notice" not in second


def test_reused_runs_sweep_other_idle_guests(
    component_cls: type, scoped: LocalControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Alice never comes back: Bob's next reused run deletes her idle guest."""
    alice = alice_idle_past_lifetime(component_cls, monkeypatch)
    reuse.sweeper.reset()
    bob = visit(component_cls, "bob", user_id=BOB)
    assert bob["exit_code"] == 0
    assert client().get(alice["sandbox_id"])["status"] in ("destroying", "destroyed")
    assert client().get(bob["sandbox_id"])["status"] == "running"
