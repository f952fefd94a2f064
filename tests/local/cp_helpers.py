"""Plain-HTTP helpers for the createos-local suite."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx

from langflow_sandbox_createos.local.testing import LocalControlPlane

SHAPE = "s-1vcpu-256mb"


def make_client(plane: LocalControlPlane, timeout: float = 60.0) -> httpx.Client:
    return httpx.Client(base_url=plane.url, headers={"X-Api-Key": plane.api_key}, timeout=timeout)


def data(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["status"] == "success", body
    return body["data"]


def failure(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    assert response.headers.get("x-request-id")
    body = response.json()
    if status >= 500:
        assert body["status"] == "error", body
        return body
    assert body["status"] == "fail", body
    return body["data"]


SandboxFactory = Callable[..., dict[str, Any]]


def sandbox_factory_for(c: httpx.Client) -> Iterator[SandboxFactory]:
    created: list[str] = []

    def make(**fields: Any) -> dict[str, Any]:
        body = {"shape": SHAPE, **fields}
        sb = data(c.post("/v1/sandboxes", json=body))
        created.append(sb["id"])
        return sb

    yield make
    for sandbox_id in created:
        c.delete(f"/v1/sandboxes/{sandbox_id}")


def run(c: httpx.Client, sandbox_id: str, cmd: str, *args: str, **extra: Any) -> dict[str, Any]:
    body = {"cmd": cmd, "args": list(args), **extra}
    return data(c.post(f"/v1/sandboxes/{sandbox_id}/exec", json=body))["result"]


def sh(c: httpx.Client, sandbox_id: str, script: str, **extra: Any) -> dict[str, Any]:
    return run(c, sandbox_id, "sh", "-c", script, **extra)
