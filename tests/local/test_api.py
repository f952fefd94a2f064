"""Routes, envelopes, auth, validation and pagination of createos-local."""

from __future__ import annotations

import httpx
from cp_helpers import SHAPE, SandboxFactory, data, failure

from langflow_sandbox_createos.local.testing import LocalControlPlane

CANONICAL_SHAPES = {
    "s-1vcpu-256mb",
    "s-1vcpu-1gb",
    "s-2vcpu-2gb",
    "s-2vcpu-4gb",
    "s-4vcpu-4gb",
    "s-4vcpu-8gb",
    "s-4vcpu-16gb",
}


def test_health_and_ready_are_public(cp: LocalControlPlane) -> None:
    with httpx.Client(base_url=cp.url) as anon:
        assert data(anon.get("/healthz")) == {"up": True}
        assert data(anon.get("/readyz")) == {"ready": True}
        assert anon.get("/healthz").headers["x-request-id"].startswith("req-")


def test_shapes_are_public_and_paginated(cp: LocalControlPlane) -> None:
    with httpx.Client(base_url=cp.url) as anon:
        page = data(anon.get("/v1/shapes"))
    assert {s["id"] for s in page["data"]} == CANONICAL_SHAPES
    assert page["pagination"] == {"total": 7, "limit": 50, "offset": 0, "count": 7}
    small = next(s for s in page["data"] if s["id"] == "s-1vcpu-256mb")
    assert small == {"id": "s-1vcpu-256mb", "vcpu": 1, "mem_mib": 256, "default_disk_mib": 10240}


def test_rootfs_is_public_and_not_paginated(cp: LocalControlPlane) -> None:
    with httpx.Client(base_url=cp.url) as anon:
        body = data(anon.get("/v1/rootfs"))
    assert body["default"] == "devbox:1"
    assert "devbox:1" in body["rootfs"]
    assert body["entries"][0]["name"] == "devbox:1"


def test_auth_missing_and_wrong_key(cp: LocalControlPlane) -> None:
    with httpx.Client(base_url=cp.url) as anon:
        assert failure(anon.get("/v1/whoami"), 401)["message"] == "missing api key"
        wrong = anon.get("/v1/sandboxes", headers={"X-Api-Key": "nope"})
        assert failure(wrong, 401)["code"] == "unauthorized"
        assert failure(anon.post("/v1/sandboxes", json={"shape": SHAPE}), 401)


def test_whoami_counts(client: httpx.Client, sandbox_factory: SandboxFactory) -> None:
    before = data(client.get("/v1/whoami"))
    assert before["user_id"]
    sandbox_factory()
    after = data(client.get("/v1/whoami"))
    assert after["stats"]["running"] == before["stats"]["running"] + 1
    assert after["stats"]["total"] == before["stats"]["total"] + 1


def test_create_get_list_patch_delete(client: httpx.Client) -> None:
    created = data(
        client.post(
            "/v1/sandboxes",
            json={"shape": SHAPE, "name": "api-crud", "envs": {"SECRET": "v"}, "egress": ["pypi.org"]},
        )
    )
    sid = created["id"]
    assert sid.startswith("sb-")
    assert created["status"] == "running"
    assert created["name"] == "api-crud"
    assert created["mem_mib"] == 256 and created["vcpu"] == 1 and created["disk_mib"] == 10240
    assert created["egress"] == ["pypi.org"]
    assert created["envs"] == ["SECRET"]  # names only, never values
    assert "ip" in created and "spawn_ms" in created and created["rootfs"] == "devbox:1"

    view = data(client.get(f"/v1/sandboxes/{sid}"))
    assert view["id"] == sid and view["status"] == "running" and "created_at" in view

    listed = data(client.get("/v1/sandboxes", params={"status": "running"}))
    assert sid in {row["id"] for row in listed["data"]}

    patched = data(client.patch(f"/v1/sandboxes/{sid}", json={"auto_pause_after_seconds": 120}))
    assert patched["auto_pause_after_seconds"] == 120
    patched = data(
        client.patch(f"/v1/sandboxes/{sid}", json={"disable_auto_pause": True, "ingress_enabled": True})
    )
    assert "auto_pause_after_seconds" not in patched
    assert patched["ingress_enabled"] is True and "<port>" in patched["ingress_url_template"]
    failure(client.patch(f"/v1/sandboxes/{sid}", json={"auto_pause_after_seconds": 5}), 400)

    gone = data(client.delete(f"/v1/sandboxes/{sid}"))
    assert gone["id"] == sid and gone["status"] in ("destroying", "destroyed")
    for _ in range(100):
        if data(client.get(f"/v1/sandboxes/{sid}"))["status"] == "destroyed":
            break
    view = data(client.get(f"/v1/sandboxes/{sid}"))
    assert view["status"] == "destroyed" and "destroyed_at" in view
    # idempotent on the wire, and the terminal row stays listed
    assert data(client.delete(f"/v1/sandboxes/{sid}"))["status"] == "destroyed"
    destroyed = data(client.get("/v1/sandboxes", params={"status": "destroyed", "limit": 500}))
    assert sid in {row["id"] for row in destroyed["data"]}


def test_list_pagination_and_filters(client: httpx.Client, sandbox_factory: SandboxFactory) -> None:
    for _ in range(3):
        sandbox_factory()
    page = data(client.get("/v1/sandboxes", params={"limit": 2, "offset": 1}))
    assert page["pagination"]["limit"] == 2 and page["pagination"]["offset"] == 1
    assert page["pagination"]["count"] == len(page["data"]) == 2
    assert page["pagination"]["total"] >= 3
    assert data(client.get("/v1/sandboxes", params={"limit": 100000}))["pagination"]["limit"] == 500
    assert data(client.get("/v1/sandboxes"))["pagination"]["limit"] == 50
    assert "status" in failure(client.get("/v1/sandboxes", params={"status": "paused"}), 400)
    failure(client.get("/v1/sandboxes", params={"limit": "abc"}), 400)


def test_create_validation(client: httpx.Client) -> None:
    post = client.post
    assert "shape" in failure(post("/v1/sandboxes", json={}), 400)
    assert failure(post("/v1/sandboxes", json={"shape": "s-99"}), 400)["code"] == "unknown_shape"
    bad_rootfs = post("/v1/sandboxes", json={"shape": SHAPE, "rootfs": "nope:1"})
    assert failure(bad_rootfs, 400)["code"] == "unknown_rootfs"
    for name in ("x" * 23, "Upper", "under_score", "-lead", ""):
        assert "name" in failure(post("/v1/sandboxes", json={"shape": SHAPE, "name": name}), 400), name
    assert failure(post("/v1/sandboxes", json={"shape": SHAPE, "auto_pause_after_seconds": 59}), 400)
    assert failure(post("/v1/sandboxes", json={"shape": SHAPE, "auto_pause_after_seconds": 86401}), 400)
    assert failure(post("/v1/sandboxes", json={"shape": SHAPE, "bandwidth_quota_bytes": 5}), 400)
    assert failure(post("/v1/sandboxes", json={"shape": SHAPE, "envs": {"1BAD": "x"}}), 400)
    assert failure(post("/v1/sandboxes", json={"shape": SHAPE, "egress": "pypi.org"}), 400)
    malformed = post("/v1/sandboxes", content=b"{not json", headers={"Content-Type": "application/json"})
    assert "malformed JSON" in failure(malformed, 400)["message"]
    assert failure(post("/v1/sandboxes", json=["shape"]), 400)


def test_names_unique_among_live_sandboxes(client: httpx.Client, sandbox_factory: SandboxFactory) -> None:
    first = sandbox_factory(name="dup-name")
    assert failure(client.post("/v1/sandboxes", json={"shape": SHAPE, "name": "dup-name"}), 409)["name"]
    data(client.delete(f"/v1/sandboxes/{first['id']}"))
    for _ in range(200):
        if data(client.get(f"/v1/sandboxes/{first['id']}"))["status"] == "destroyed":
            break
    again = sandbox_factory(name="dup-name")
    assert again["id"] != first["id"]


def test_generated_names_fit_the_budget(sandbox_factory: SandboxFactory) -> None:
    sb = sandbox_factory()
    assert 0 < len(sb["name"]) <= 22


def test_unknown_ids_routes_and_methods(client: httpx.Client) -> None:
    assert failure(client.get("/v1/sandboxes/sb-nope"), 404)["message"] == "sandbox not found"
    assert failure(client.post("/v1/sandboxes/sb-nope/pause"), 404)
    assert failure(client.get("/v1/nothing-here"), 404)
    assert "not allowed" in failure(client.put("/v1/sandboxes"), 405)["message"]
    assert failure(client.post("/v1/shapes"), 405)


def test_egress_get_and_put(client: httpx.Client, sandbox_factory: SandboxFactory) -> None:
    sb = sandbox_factory(egress=["1.2.3.4:443", "pypi.org"])
    sid = sb["id"]
    assert data(client.get(f"/v1/sandboxes/{sid}/egress")) == {
        "id": sid,
        "egress": ["1.2.3.4:443", "pypi.org"],
    }
    put = client.put(f"/v1/sandboxes/{sid}/egress", json={"egress": ["240.0.0.0/4"]})
    assert data(put) == {"id": sid, "egress": ["240.0.0.0/4"]}
    assert data(client.put(f"/v1/sandboxes/{sid}/egress", json={"egress": None}))["egress"] == []
    assert failure(client.put(f"/v1/sandboxes/{sid}/egress", json={"egress": [1]}), 400)
    assert failure(client.get("/v1/sandboxes/sb-missing/egress"), 404)


def test_stats_report_routes_and_sandboxes(cp: LocalControlPlane, sandbox_factory: SandboxFactory) -> None:
    sb = sandbox_factory(name="stats-probe")
    stats = cp.stats()
    assert stats["requests"]["create"] >= 1
    assert stats["live"] >= 1 and stats["sandboxes_by_state"]["running"] >= 1
    assert stats["connections_opened"] >= 1 and stats["bytes_sent"] > 0
    assert stats["memory_enforced"] in ("cgroup", "rlimit")
    assert stats["isolation"] == "bwrap"
    assert {"id": sb["id"], "name": "stats-probe", "status": "running"}.items() <= next(
        row for row in stats["sandboxes"] if row["id"] == sb["id"]
    ).items()
    with httpx.Client(base_url=cp.url) as anon:
        response = anon.get("/_local/stats")  # the admin routes need the key too
        assert failure(response, 401)["message"] == "missing api key"


def test_connections_are_counted_per_tcp_connection(cp: LocalControlPlane) -> None:
    before = cp.stats()["connections_opened"]
    with httpx.Client(base_url=cp.url) as one:
        for _ in range(5):
            one.get("/healthz")  # keep-alive: one connection
    with httpx.Client(base_url=cp.url) as two:
        two.get("/healthz")
    # +2 for the test's connections, +1 for the stats call itself
    assert cp.stats()["connections_opened"] - before == 3
