"""Fixtures for the sandbox backend: a clean settings environment pointed at createos-local.

Builds on the project fixtures in tests/conftest.py: ``cp`` (function-scoped local control
plane handle that clears faults and, after the test, asserts no live guest is left) and
``createos_env`` (CREATEOS_SANDBOX_API_KEY and CREATEOS_SANDBOX_BASE_URL pointed at it).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from langflow_sandbox_createos.backend.engine import CreateOSBackend, create_backend
from langflow_sandbox_createos.core import connection, settings

# Every variable the backend reads, so a developer's shell cannot leak into a test.
# every variable the backend's settings read, plus the key and the local-isolation consent
BACKEND_VARS = (*settings.BACKEND_VARIABLES, "CREATEOS_API_KEY", "CREATEOS_SANDBOX_ACCEPT_LOCAL_ISOLATION")


def clean_backend_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # lfx's settings service reads the environment once per process and keeps it, so a value a
    # previous test exported would outlive that test as the fallback. Here only the
    # environment decides; the fallback itself is covered by the subprocess tests.
    monkeypatch.setattr(settings, "_lfx_sandbox_settings", lambda: None)
    for name in BACKEND_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS", "true")
    monkeypatch.setenv("CREATEOS_SANDBOX_ACCEPT_LOCAL_ISOLATION", "true")  # createos-local
    monkeypatch.setenv("LANGFLOW_SANDBOX_TIMEOUT_SECONDS", "30")


@pytest.fixture
def backend_env(cp: Any, createos_env: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The control plane, with the backend's settings reset to a runnable baseline."""
    clean_backend_env(monkeypatch)
    return cp


@pytest.fixture
def backend(backend_env: Any) -> Iterator[CreateOSBackend]:
    """A backend whose shutdown (which waits for queued deletes) runs before ``cp`` checks
    that no guest is left."""
    instance = create_backend()
    yield instance
    instance.shutdown()


@pytest.fixture
def fresh_endpoints() -> Iterator[None]:
    """Forget the process-wide clients, whoami latches and shape catalogs, before and after."""
    connection.endpoints.clear()
    yield
    create_backend().shutdown()  # let queued deletes finish before their clients close
    connection.endpoints.clear()


def sandbox_ids(cp: Any) -> set[str]:
    """Every sandbox the control plane has ever seen, deleted ones included."""
    return {row["id"] for row in cp.sandboxes()}


def closed_port_url() -> str:
    """A loopback URL nothing listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def sandbox_view(cp: Any, sandbox_id: str) -> dict[str, Any]:
    """The control plane's own view of one sandbox (GET /v1/sandboxes/{id}), deleted or not."""
    import httpx

    response = httpx.get(f"{cp.url}/v1/sandboxes/{sandbox_id}", headers={"X-Api-Key": cp.api_key}, timeout=10)
    response.raise_for_status()
    return response.json()["data"]


def new_guests(cp: Any, before: set[str]) -> list[dict[str, Any]]:
    return [sandbox_view(cp, sid) for sid in sorted(sandbox_ids(cp) - before)]


def undeleted_guests(cp: Any) -> list[dict[str, Any]]:
    """Guests whose DELETE the control plane has not accepted yet (``destroying`` counts as
    deleted: the control plane finishes it on its own)."""
    return [sb for sb in cp.live_sandboxes() if sb["status"] != "destroying"]


def lfx_process_env(cp: Any, tmp_path: Path) -> dict[str, str]:
    """The environment of a fresh lfx (or Langflow) process with the backend switched on against
    `cp`: only what an operator would set, plus what a process needs to start at all."""
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "SYSTEMROOT", "TMPDIR")}
    env.update(
        HOME=str(tmp_path),
        # Not named "langflow": a directory of that name on sys.path would shadow the
        # (uninstalled) langflow package and break lfx's settings.
        LANGFLOW_CONFIG_DIR=str(tmp_path / "lf-config"),
        LANGFLOW_SANDBOX_BACKEND_PLUGINS="createos",
        LANGFLOW_SANDBOX_BACKEND="createos",
        CREATEOS_SANDBOX_API_KEY=cp.api_key,
        CREATEOS_SANDBOX_BASE_URL=cp.url,
        LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS="true",
        CREATEOS_SANDBOX_ACCEPT_LOCAL_ISOLATION="true",  # createos-local
    )
    return env
