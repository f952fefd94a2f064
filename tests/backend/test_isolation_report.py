"""What the backend tells lfx about isolation is true for the control plane in use (issue 27).

createos-local says in its whoami that its guests are Linux namespaces on a shared kernel.
The backend reports that to lfx (whose dispatcher then refuses, quoting the setting that
accepts it) and refuses runs itself, unless CREATEOS_SANDBOX_ACCEPT_LOCAL_ISOLATION=true.
"""

from __future__ import annotations

from typing import Any

import pytest
from lfx.utils.sandbox.base import SandboxUnavailableError

from langflow_sandbox_createos.backend.engine import create_backend
from langflow_sandbox_createos.core import connection


@pytest.fixture
def unaccepted(backend_env: Any, fresh_endpoints: None, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.delenv("CREATEOS_SANDBOX_ACCEPT_LOCAL_ISOLATION")
    return backend_env


def test_createos_local_is_reported_as_what_it_is_and_refused(unaccepted: Any) -> None:
    backend = create_backend()
    try:
        # nothing known before the control plane was asked; the run asks, then refuses
        assert backend.capabilities().isolation == "hardware-virtualized"
        with pytest.raises(
            SandboxUnavailableError, match="CREATEOS_SANDBOX_ACCEPT_LOCAL_ISOLATION=true"
        ) as exc:
            backend.run("print(1)")
        assert "'namespaces' isolation on a shared kernel" in str(exc.value)
        assert unaccepted.live_sandboxes() == []  # refused before any guest
        reported = backend.capabilities().isolation
        assert reported.startswith("namespaces (") and "CREATEOS_SANDBOX_ACCEPT_LOCAL_ISOLATION" in reported
        assert connection.endpoints.get().isolation == "namespaces"
    finally:
        backend.shutdown()


def test_lfx_refuses_it_quoting_the_setting(unaccepted: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through lfx's own dispatcher, as the Python Interpreter calls it."""
    import lfx.utils.sandbox as dispatch
    from lfx.utils.sandbox import registry

    if "createos" not in registry.known_sandbox_backends():
        registry.register_sandbox_backend("createos", create_backend)
    for module in (registry, dispatch):
        monkeypatch.setattr(module, "get_sandbox_backend", lambda: "createos")
    with pytest.raises(SandboxUnavailableError):  # the first run learns what the plane is
        dispatch.run_code_in_sandbox("print(1)")
    with pytest.raises(SandboxUnavailableError, match="not a hardware-virtualized boundary") as exc:
        dispatch.run_code_in_sandbox("print(1)")
    assert "CREATEOS_SANDBOX_ACCEPT_LOCAL_ISOLATION=true accepts it" in str(exc.value)


def test_accepted_it_runs_and_reports_what_lfx_needs(backend_env: Any, fresh_endpoints: None) -> None:
    backend = create_backend()
    try:
        assert backend.run("print(6 * 7)").stdout.strip() == "42"
        assert connection.endpoints.get().isolation == "namespaces"  # known, and accepted
        assert backend.capabilities().isolation == "hardware-virtualized"
    finally:
        backend.shutdown()


def test_the_real_service_names_no_isolation_and_is_microvms() -> None:
    assert connection.plane_isolation({"user_id": "u"}) == "hardware-virtualized"
    assert connection.plane_isolation({"isolation": "namespaces"}) == "namespaces"
    assert connection.plane_isolation({"isolation": "name\x1b[31mspaces"}) == "name31mspaces"  # no escapes
