"""The state machine: pause, resume, fork, delete, auto-pause and transition delays."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from cp_helpers import SandboxFactory, data, failure, make_client, sandbox_factory_for, sh
from waiting import wait_status

from langflow_sandbox_createos.local.testing import LocalControlPlane

PAUSED = "sandbox is paused; resume it before accessing files"


def test_pause_freezes_and_resume_continues(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    sid = sandbox["id"]
    client.put(f"/v1/sandboxes/{sid}/files", params={"path": "/workspace/keep.txt"}, content=b"kept")
    assert data(client.post(f"/v1/sandboxes/{sid}/pause"))["status"] in ("pausing", "paused")
    view = wait_status(client, sid, "paused")
    assert "paused_at" in view

    for response in (
        client.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "true"}),
        client.get(f"/v1/sandboxes/{sid}/files", params={"path": "/workspace/keep.txt"}),
        client.put(f"/v1/sandboxes/{sid}/files", params={"path": "/workspace/x"}, content=b"x"),
    ):
        assert failure(response, 409)["message"] == PAUSED
    assert failure(client.post(f"/v1/sandboxes/{sid}/pause"), 409)

    assert data(client.post(f"/v1/sandboxes/{sid}/resume"))["status"] in ("resuming", "running")
    view = wait_status(client, sid, "running")
    assert "last_resumed_at" in view
    assert failure(client.post(f"/v1/sandboxes/{sid}/resume"), 409)
    assert sh(client, sid, "cat /workspace/keep.txt")["stdout"] == "kept"


@pytest.fixture(scope="module")
def plane_without_cgroups() -> Iterator[LocalControlPlane]:
    """No isolation and no memory limits: no cgroup at all, so pause falls back to signals."""
    plane = LocalControlPlane(isolation=False, extra_args=["--no-memory-limit"])
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


@pytest.mark.parametrize("freezer", ["cgroup", "signals"])
def test_pause_freezes_a_running_guest(
    request: pytest.FixtureRequest, cp: LocalControlPlane, freezer: str
) -> None:
    """A command running during pause stops making progress until resume, with the cgroup
    freezer and with the SIGSTOP/SIGCONT fallback of a plane that has no cgroups."""
    plane = cp if freezer == "cgroup" else request.getfixturevalue("plane_without_cgroups")
    if plane.stats()["freezer"] != freezer:
        pytest.skip(f"this plane pauses with {plane.stats()['freezer']} (no writable cgroup freezer here)")
    script = "i=0; while [ $i -lt 200 ]; do i=$((i+1)); echo $i > tick; sleep 0.01; done; echo done"
    with make_client(plane) as client:
        sid = data(client.post("/v1/sandboxes", json={"shape": "s-2vcpu-4gb"}))["id"]
        wait_status(client, sid, "running")
        tick = plane.guest_file(sid, "/workspace/tick")
        try:
            with (
                make_client(plane) as streamer,
                streamer.stream(
                    "POST",
                    f"/v1/sandboxes/{sid}/exec?stream=true",
                    json={"cmd": "sh", "args": ["-c", script], "stream": True},
                ) as response,
            ):
                time.sleep(0.5)
                data(client.post(f"/v1/sandboxes/{sid}/pause"))
                wait_status(client, sid, "paused")
                time.sleep(0.2)
                frozen_at = tick.read_text()
                time.sleep(0.5)
                assert tick.read_text() == frozen_at
                data(client.post(f"/v1/sandboxes/{sid}/resume"))
                body = response.read().decode()
            final_tick = tick.read_text().strip()  # before the delete removes the workspace
        finally:
            client.delete(f"/v1/sandboxes/{sid}")
    assert '"exit_code":0' in body and "done" in body
    assert final_tick == "200"


def test_fork_copies_a_paused_guest(client: httpx.Client, sandbox_factory: SandboxFactory) -> None:
    parent = sandbox_factory(envs={"K": "v"})
    pid = parent["id"]
    assert failure(client.post(f"/v1/sandboxes/{pid}/fork"), 409)  # must be paused
    sh(client, pid, "echo parent-data > /workspace/state.txt; mkdir -p /workspace/d; echo t > /tmp/t")
    data(client.post(f"/v1/sandboxes/{pid}/pause"))
    wait_status(client, pid, "paused")

    child = data(client.post(f"/v1/sandboxes/{pid}/fork", json={}))
    try:
        assert child["id"] != pid and child["forked_from"] == pid
        assert child["envs"] == ["K"]
        wait_status(client, child["id"], "running")
        result = sh(
            client, child["id"], "cat /workspace/state.txt /tmp/t; echo $K; test -d /workspace/d && echo dir"
        )
        assert result["stdout"] == "parent-data\nt\nv\ndir\n"
        # the child's writes do not reach the parent
        sh(client, child["id"], "echo child > /workspace/state.txt")
        paused_child = data(client.post(f"/v1/sandboxes/{pid}/fork", json={"start_paused": True}))
        assert paused_child["status"] == "paused"
        data(client.delete(f"/v1/sandboxes/{paused_child['id']}"))
    finally:
        client.delete(f"/v1/sandboxes/{child['id']}")
    data(client.post(f"/v1/sandboxes/{pid}/resume"))
    wait_status(client, pid, "running")
    assert sh(client, pid, "cat /workspace/state.txt")["stdout"] == "parent-data\n"


def test_delete_paused_and_running(client: httpx.Client, sandbox_factory: SandboxFactory) -> None:
    paused = sandbox_factory()
    data(client.post(f"/v1/sandboxes/{paused['id']}/pause"))
    wait_status(client, paused["id"], "paused")
    assert data(client.delete(f"/v1/sandboxes/{paused['id']}"))["status"] == "destroyed"
    running = sandbox_factory()
    data(client.delete(f"/v1/sandboxes/{running['id']}"))
    wait_status(client, running["id"], "destroyed")
    assert failure(client.post(f"/v1/sandboxes/{running['id']}/exec", json={"cmd": "true"}), 409)


def test_delete_kills_a_running_exec(
    client: httpx.Client, cp: LocalControlPlane, sandbox: dict[str, Any]
) -> None:
    sid = sandbox["id"]
    with (
        make_client(cp) as streamer,
        streamer.stream(
            "POST",
            f"/v1/sandboxes/{sid}/exec?stream=true",
            json={"cmd": "sleep", "args": ["60"], "stream": True},
        ) as response,
    ):
        time.sleep(0.3)
        data(client.delete(f"/v1/sandboxes/{sid}"))
        started = time.monotonic()
        body = response.read().decode()
    assert time.monotonic() - started < 5
    assert '"exit_code":137' in body
    wait_status(client, sid, "destroyed")
    assert not (cp.state_dir / "sandboxes" / sid).exists()


# -- a control plane with slow transitions and a fast auto-pause clock ---------------------
@pytest.fixture(scope="module")
def slow_plane() -> Iterator[LocalControlPlane]:
    with LocalControlPlane(
        boot_delay_ms=300, transition_delay_ms=400, streaming=False, extra_args=["--auto-pause-unit-ms", "20"]
    ) as plane:
        yield plane


@pytest.fixture
def slow(slow_plane: LocalControlPlane) -> Iterator[tuple[httpx.Client, SandboxFactory]]:
    with make_client(slow_plane) as c:
        yield from ((c, make) for make in sandbox_factory_for(c))


def test_transitions_are_observable(slow: tuple[httpx.Client, SandboxFactory]) -> None:
    c, make = slow
    started = time.monotonic()
    sb = make(name="slow-one")
    assert time.monotonic() - started >= 0.3  # create is synchronous over the boot delay
    assert sb["status"] == "running"
    sid = sb["id"]
    assert data(c.post(f"/v1/sandboxes/{sid}/pause"))["status"] == "pausing"
    assert failure(c.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "true"}), 409)["message"] == PAUSED
    wait_status(c, sid, "paused")
    assert data(c.post(f"/v1/sandboxes/{sid}/resume"))["status"] == "resuming"
    wait_status(c, sid, "running")
    assert data(c.delete(f"/v1/sandboxes/{sid}"))["status"] == "destroying"
    # the name stays reserved while destroying
    assert failure(c.post("/v1/sandboxes", json={"shape": "s-1vcpu-256mb", "name": "slow-one"}), 409)
    wait_status(c, sid, "destroyed")


def test_create_shows_creating_while_booting(
    slow_plane: LocalControlPlane, slow: tuple[httpx.Client, SandboxFactory]
) -> None:
    import threading

    _c, make = slow
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.update(make(name="booting")))
    thread.start()
    time.sleep(0.15)
    states = {row["name"]: row["status"] for row in slow_plane.sandboxes()}
    thread.join()
    assert states.get("booting") == "creating"
    assert result["status"] == "running"


def test_auto_pause_after_idle_and_exec_touches_clock(slow: tuple[httpx.Client, SandboxFactory]) -> None:
    c, make = slow
    sb = make(auto_pause_after_seconds=60)  # 60 "seconds" of 20 ms = 1.2 s
    sid = sb["id"]
    assert sb["auto_pause_after_seconds"] == 60
    for _ in range(4):  # execs keep it awake past the idle limit
        time.sleep(0.5)
        assert data(c.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "true"}))["result"]["exit_code"] == 0
    assert data(c.get(f"/v1/sandboxes/{sid}"))["status"] == "running"
    # reads do not count as activity
    deadline = time.monotonic() + 5
    while data(c.get(f"/v1/sandboxes/{sid}"))["status"] == "running" and time.monotonic() < deadline:
        time.sleep(0.1)
    wait_status(c, sid, "paused")


def test_no_streaming_flag_answers_404(
    slow_plane: LocalControlPlane, slow: tuple[httpx.Client, SandboxFactory]
) -> None:
    c, make = slow
    sid = make()["id"]
    assert slow_plane.stats()["streaming"] is False
    streamed = c.post(f"/v1/sandboxes/{sid}/exec?stream=true", json={"cmd": "true", "stream": True})
    assert "not supported" in failure(streamed, 404)["message"]
    assert data(c.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "true"}))["result"]["exit_code"] == 0
