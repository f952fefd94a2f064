"""Fault injection through /_local/faults: statuses, broken bodies, resets, hangs, latency."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from cp_helpers import SHAPE, data, failure, make_client

from langflow_sandbox_createos.local.testing import LocalControlPlane


def test_fault_set_round_trip_and_validation(cp: LocalControlPlane) -> None:
    faults = {
        "latency_ms": 0,
        "boot_delay_ms": 0,
        "rules": [{"route": "create", "status": 429, "retry_after": 2}],
    }
    assert cp.set_faults(faults)["rules"] == [{"route": "create", "status": 429, "retry_after": 2}]
    assert cp.faults()["rules"][0]["route"] == "create"
    assert cp.faults()["hits"] == [0]
    assert cp.set_faults(cp.faults())["hits"] == [0]  # what GET answers can be PUT back
    cp.clear_faults()
    assert cp.faults() == {"latency_ms": 0, "boot_delay_ms": 0, "rules": [], "hits": []}
    for bad in ({"rules": [{"route": "nope"}]}, {"rules": [{"body": "weird"}]}, {"rules": "x"}, {"bogus": 1}):
        with pytest.raises(ValueError):
            cp.set_faults(bad)
    with httpx.Client(base_url=cp.url, headers={"X-Api-Key": cp.api_key}) as admin:
        malformed = admin.put("/_local/faults", content=b"{", headers={"Content-Type": "application/json"})
        assert failure(malformed, 400)


def test_rate_limit_with_retry_after_expires_after_times(cp: LocalControlPlane, client: httpx.Client) -> None:
    cp.set_faults({"rules": [{"route": "whoami", "status": 429, "retry_after": 2, "times": 2}]})
    for _ in range(2):
        limited = client.get("/v1/whoami")
        assert failure(limited, 429)["message"] == "rate limited"
        assert limited.headers["retry-after"] == "2"
    data(client.get("/v1/whoami"))
    assert cp.faults()["rules"] == []
    assert cp.fault_hits() == [2]  # a spent rule keeps its count


@pytest.mark.parametrize(
    ("route", "method", "path", "status", "message"),
    [
        ("create", "POST", "/v1/sandboxes", 503, "no host with capacity"),
        ("create", "POST", "/v1/sandboxes", 402, "insufficient credit"),
        ("list", "GET", "/v1/sandboxes", 500, "injected server fault"),
    ],
)
def test_forced_statuses(
    cp: LocalControlPlane, client: httpx.Client, route: str, method: str, path: str, status: int, message: str
) -> None:
    cp.set_faults({"rules": [{"route": route, "status": status, "times": 1}]})
    body = {"shape": SHAPE} if method == "POST" else None
    response = client.request(method, path, json=body)
    if status >= 500:
        assert failure(response, status)["message"] == message
    else:
        assert failure(response, status)["message"] == message
    assert cp.live_sandboxes() == [] or route != "create"


def test_wildcard_route_and_probability(cp: LocalControlPlane, client: httpx.Client) -> None:
    cp.set_faults({"rules": [{"route": "*", "status": 500, "probability": 0}]})
    data(client.get("/v1/whoami"))
    assert cp.fault_hits() == [0]  # matched, never fired
    cp.set_faults({"rules": [{"route": "*", "status": 503, "times": 1}]})
    failure(client.get("/v1/shapes"), 503)
    data(client.get("/v1/shapes"))
    assert cp.fault_hits() == [1]


def test_hits_count_each_rule_that_fires(cp: LocalControlPlane, client: httpx.Client) -> None:
    """Every rule that fires is counted, answering or not; one that does not match is not."""
    cp.set_faults(
        {
            "rules": [
                {"route": "whoami", "latency_ms": 1},  # fires, does not answer
                {"route": "whoami", "status": 500, "times": 2},  # answers twice, then is spent
                {"route": "shapes", "status": 503},  # never asked
                {"route": "whoami", "status": 502},  # behind the answering rule, then answers
            ]
        }
    )
    for status in (500, 500, 502):
        failure(client.get("/v1/whoami"), status)
    assert cp.fault_hits() == [3, 2, 0, 1]
    assert cp.stats()["faults"]["hits"] == [3, 2, 0, 1]


def test_non_json_and_wrong_envelope_bodies(cp: LocalControlPlane, client: httpx.Client) -> None:
    cp.set_faults({"rules": [{"route": "get", "body": "non-json", "times": 1}]})
    response = client.get("/v1/sandboxes/sb-anything")
    assert response.status_code == 502
    assert response.headers["content-type"].startswith("text/html")
    assert response.headers["x-request-id"]
    cp.set_faults({"rules": [{"route": "whoami", "body": "wrong-envelope", "times": 1}]})
    response = client.get("/v1/whoami")
    assert response.status_code == 200 and "status" not in response.json()


def test_reflect_headers_echoes_the_request_headers(cp: LocalControlPlane, client: httpx.Client) -> None:
    cp.set_faults({"rules": [{"route": "whoami", "body": "reflect-headers", "times": 1}]})
    response = client.get("/v1/whoami", headers={"X-Custom": "visible"})
    body = failure(response, 500)
    assert f"x-api-key: {cp.api_key}" in body["message"]
    assert "x-custom: visible" in body["message"]


def test_truncated_body(cp: LocalControlPlane, client: httpx.Client) -> None:
    cp.set_faults({"rules": [{"route": "get", "body": "truncated", "times": 1}]})
    with pytest.raises(httpx.RemoteProtocolError):
        client.get("/v1/sandboxes/sb-anything")
    failure(client.get("/v1/sandboxes/sb-anything"), 404)


def test_connection_reset_without_response(cp: LocalControlPlane) -> None:
    cp.set_faults({"rules": [{"route": "whoami", "reset": True, "times": 1}]})
    with make_client(cp) as c:
        with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
            c.get("/v1/whoami")
        data(c.get("/v1/whoami"))


def test_reset_mid_stream_kills_the_guest(
    cp: LocalControlPlane, client: httpx.Client, sandbox: dict[str, Any]
) -> None:
    cp.set_faults({"rules": [{"route": "exec_stream", "reset": True, "after_bytes": 30, "times": 1}]})
    body = {
        "cmd": "sh",
        "args": ["-c", "for i in 1 2 3 4 5 6 7 8 9; do echo line-$i; sleep 0.2; done"],
        "stream": True,
    }
    received = b""
    url = f"/v1/sandboxes/{sandbox['id']}/exec?stream=true"
    with (
        pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)),
        client.stream("POST", url, json=body) as response,
    ):
        assert response.status_code == 200
        for chunk in response.iter_bytes():
            received += chunk
    assert received.startswith(b'{"stdout":"line-1')
    assert b"exit_code" not in received
    deadline = time.monotonic() + 5
    while cp.stats()["guest_processes"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cp.stats()["guest_processes"] == 0


def test_hang_until_the_client_gives_up(cp: LocalControlPlane) -> None:
    cp.set_faults({"rules": [{"route": "list", "hang": True, "times": 1}]})
    with make_client(cp, timeout=0.5) as c:
        started = time.monotonic()
        with pytest.raises(httpx.ReadTimeout):
            c.get("/v1/sandboxes")
        assert time.monotonic() - started >= 0.5
        data(c.get("/v1/sandboxes"))


def test_drip_slows_the_body(cp: LocalControlPlane) -> None:
    cp.set_faults({"rules": [{"route": "healthz", "drip_bytes_per_sec": 100, "times": 1}]})
    with httpx.Client(base_url=cp.url) as anon:
        started = time.monotonic()
        response = anon.get("/healthz")
        elapsed = time.monotonic() - started
    assert response.json() == {"status": "success", "data": {"up": True}}
    assert elapsed >= 0.3


def test_latency_and_boot_delay(cp: LocalControlPlane, client: httpx.Client) -> None:
    cp.set_faults({"latency_ms": 150, "rules": [{"route": "whoami", "latency_ms": 100}]})
    started = time.monotonic()
    data(client.get("/v1/whoami"))
    assert time.monotonic() - started >= 0.25
    started = time.monotonic()
    data(client.get("/v1/shapes"))
    assert time.monotonic() - started >= 0.15
    cp.set_faults({"boot_delay_ms": 300})
    started = time.monotonic()
    sb = data(client.post("/v1/sandboxes", json={"shape": SHAPE}))
    try:
        assert time.monotonic() - started >= 0.3
        assert sb["status"] == "running"
    finally:
        client.delete(f"/v1/sandboxes/{sb['id']}")


def test_admin_routes_are_not_faulted(
    cp: LocalControlPlane, client: httpx.Client, sandbox: dict[str, Any]
) -> None:
    """Under a fault on every route, each admin route still answers itself: its status, its
    content type and its keys (an injected answer is a JSend error, or nothing at all)."""
    rules = [{"route": "*", "latency_ms": 1}, {"route": "*", "status": 500}]
    cp.set_faults({"rules": rules})
    try:
        failure(client.get("/v1/whoami"), 500)  # the faults are on: a /v1 route gets the 500
        assert cp.fault_hits() == [1, 1]
        sid = sandbox["id"]
        stats = client.get("/_local/stats")
        assert stats.status_code == 200, stats.text
        assert stats.headers["content-type"].startswith("application/json")
        assert {"pid", "requests", "responses_by_status", "live", "sandboxes", "faults"} <= set(stats.json())
        assert sid in {row["id"] for row in stats.json()["sandboxes"]}
        network = client.get(f"/_local/sandboxes/{sid}/network")
        assert network.status_code == 200, network.text
        assert network.json()["id"] == sid
        assert {"egress", "allow_all", "enforced", "not_enforced", "namespace", "nat", "rules"} <= set(
            network.json()
        )
        got = data(client.get("/_local/faults"))
        assert got["rules"] == rules and got["hits"] == [1, 1]
        again = data(client.put("/_local/faults", json={"rules": rules}))
        assert again["rules"] == rules and again["hits"] == [0, 0]
        assert data(client.get("/_local/faults"))["hits"] == [0, 0]  # no admin call fired a rule
        cleared = data(client.delete("/_local/faults"))
        assert cleared == {"latency_ms": 0, "boot_delay_ms": 0, "rules": [], "hits": []}
    finally:
        cp.clear_faults()  # before the fixtures delete the sandbox
