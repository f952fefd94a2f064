"""Robustness: many live sandboxes, no leaked guests, clean shutdown, the unisolated mode."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from cp_helpers import SHAPE, data, make_client, sandbox_factory_for, sh

from langflow_sandbox_createos.local.testing import LocalControlPlane


def test_two_hundred_live_sandboxes(cp: LocalControlPlane) -> None:
    with make_client(cp) as c:

        def create(i: int) -> dict[str, Any]:
            return data(c.post("/v1/sandboxes", json={"shape": SHAPE, "name": f"many-{i}"}))

        with ThreadPoolExecutor(8) as pool:
            sandboxes = list(pool.map(create, range(200)))
        try:
            assert cp.stats()["live"] >= 200
            assert len({sb["id"] for sb in sandboxes}) == 200
            # every one of them still runs commands
            for sb in sandboxes[::50]:
                assert sh(c, sb["id"], "echo $CREATEOS_SANDBOX_NAME")["stdout"].strip() == sb["name"]
            page = data(c.get("/v1/sandboxes", params={"status": "running", "limit": 500}))
            assert page["pagination"]["total"] >= 200
        finally:
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda sb: c.delete(f"/v1/sandboxes/{sb['id']}"), sandboxes))
    assert cp.wait_until_no_live(timeout=10) == []


def test_stop_kills_running_guests_and_cleans_up() -> None:
    plane = LocalControlPlane().start()
    state_dir = plane.state_dir
    marker = "4545.25"
    try:
        with make_client(plane) as c:
            for make in sandbox_factory_for(c):
                sb = make()
                with (
                    httpx.Client(base_url=plane.url, headers={"X-Api-Key": plane.api_key}, timeout=30) as s,
                    s.stream(
                        "POST",
                        f"/v1/sandboxes/{sb['id']}/exec?stream=true",
                        json={"cmd": "sleep", "args": [marker], "stream": True},
                    ),
                ):
                    time.sleep(0.5)
                    started = time.monotonic()
                    plane.stop()
                    assert time.monotonic() - started < 8
                break
    finally:
        plane.stop()
    assert not _processes_with(marker)
    assert not os.path.exists(state_dir)
    assert not any(p.startswith("createos-local-") for p in _cgroup_parents_of_dead_servers())


def _processes_with(marker: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(pid)
        except OSError:
            pass
    return found


def _cgroup_parents_of_dead_servers() -> list[str]:
    try:
        names = os.listdir("/sys/fs/cgroup/memory")
    except OSError:
        return []
    return [
        n
        for n in names
        if n.startswith("createos-local-") and not os.path.exists(f"/proc/{n.split('-')[-1]}")
    ]


def test_unisolated_mode_still_runs_guests() -> None:
    with LocalControlPlane(isolation=False) as plane, make_client(plane) as c:
        assert plane.stats()["isolation"] is False
        for make in sandbox_factory_for(c):
            sb = make(envs={"K": "v"})
            result = sh(c, sb["id"], "echo $K $CREATEOS_SANDBOX_ID; pwd")
            assert result["stdout"].split()[:2] == ["v", sb["id"]]
            assert result["stdout"].split()[2].endswith(f"{sb['id']}/fs/workspace")
            missing = data(c.post(f"/v1/sandboxes/{sb['id']}/exec", json={"cmd": "nope-binary"}))["result"]
            assert missing["exit_code"] == 0 and missing["error"]
            assert sh(c, sb["id"], "(sleep 4646.5 &); echo bg")["stdout"] == "bg\n"
        assert not _processes_with("4646.5")
