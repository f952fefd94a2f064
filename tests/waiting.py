"""The one way the tests wait for a sandbox to reach a status: it raises when it never does.

(Copies of this loop drifted: one returned silently on timeout, so the tests that used it never
proved the guest was paused.) Importable from every suite: ``tests/`` is on ``sys.path``.
"""

from __future__ import annotations

import time
from typing import Any

import httpx


def sandbox_view(source: Any, sandbox_id: str) -> dict[str, Any]:
    """``GET /v1/sandboxes/{id}`` through an httpx client of the control plane, or through
    anything else with ``get(sandbox_id)`` (the native client)."""
    if isinstance(source, httpx.Client):
        response = source.get(f"/v1/sandboxes/{sandbox_id}")
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["status"] == "success", body
        return body["data"]
    return source.get(sandbox_id)


def wait_status(
    source: Any, sandbox_id: str, status: str, timeout: float = 10.0, interval: float = 0.02
) -> dict[str, Any]:
    """Poll until the sandbox is ``status`` and return its view; AssertionError after ``timeout``
    seconds, naming the status it was left in."""
    deadline = time.monotonic() + timeout
    while True:
        view = sandbox_view(source, sandbox_id)
        if view["status"] == status:
            return view
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"{sandbox_id} is {view['status']!r}, not {status!r}, after {timeout:g} s: {view}"
            )
        time.sleep(interval)
