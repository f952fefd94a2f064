"""Every refusal fails closed with SandboxUnavailableError, names its setting, and creates no guest."""

from __future__ import annotations

from typing import Any

import pytest
from lfx.utils.sandbox.base import SandboxExecutionError, SandboxUnavailableError

from langflow_sandbox_createos.backend.engine import CreateOSBackend

from .conftest import closed_port_url, new_guests, sandbox_ids


def _refused(backend: CreateOSBackend, cp: Any) -> str:
    before = sandbox_ids(cp)
    with pytest.raises(SandboxUnavailableError) as info:
        backend.run("open('/tmp/ran', 'w').write('ran')\nprint('ran')\n")
    assert sandbox_ids(cp) == before, "a refused run created a guest"
    return str(info.value)


def test_domain_allowlist_is_refused(backend: CreateOSBackend, backend_env: Any, monkeypatch) -> None:
    monkeypatch.setenv("LANGFLOW_SANDBOX_ALLOWED_DOMAINS", "pypi.org, files.pythonhosted.org")
    message = _refused(backend, backend_env)
    assert "LANGFLOW_SANDBOX_ALLOWED_DOMAINS" in message
    assert "pypi.org" in message
    assert "exec-sandbox" in message


def test_domain_allowlist_is_refused_even_with_network_on(backend, backend_env, monkeypatch) -> None:
    monkeypatch.setenv("LANGFLOW_SANDBOX_ALLOW_NETWORK", "true")
    monkeypatch.setenv("LANGFLOW_SANDBOX_ALLOWED_DOMAINS", "example.com")
    assert "LANGFLOW_SANDBOX_ALLOWED_DOMAINS" in _refused(backend, backend_env)


def test_egress_off_needs_the_acknowledgement(backend, backend_env, monkeypatch) -> None:
    monkeypatch.delenv("LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS")
    message = _refused(backend, backend_env)
    assert "169.254.0.0/16" in message
    assert "LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS=true" in message


def test_egress_on_needs_no_acknowledgement(backend, backend_env, monkeypatch) -> None:
    monkeypatch.delenv("LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS")
    monkeypatch.setenv("LANGFLOW_SANDBOX_ALLOW_NETWORK", "true")
    before = sandbox_ids(backend_env)
    assert backend.run("print('open')").stdout == "open\n"
    (row,) = new_guests(backend_env, before)
    assert row["egress"] == ["*"]


def test_missing_key_is_refused(backend, backend_env, monkeypatch) -> None:
    monkeypatch.delenv("CREATEOS_SANDBOX_API_KEY")
    message = _refused(backend, backend_env)
    assert "CREATEOS_SANDBOX_API_KEY" in message


def test_bad_setting_value_is_refused(backend, backend_env, monkeypatch) -> None:
    monkeypatch.setenv("LANGFLOW_SANDBOX_TIMEOUT_SECONDS", "soon")
    assert "LANGFLOW_SANDBOX_TIMEOUT_SECONDS='soon'" in _refused(backend, backend_env)


def test_pinned_shape_missing_from_catalog(backend, backend_env, monkeypatch) -> None:
    monkeypatch.setenv("CREATEOS_SANDBOX_SHAPE", "s-64vcpu-1tb")
    message = _refused(backend, backend_env)
    assert "CREATEOS_SANDBOX_SHAPE='s-64vcpu-1tb' is not in the CreateOS shape catalog" in message


def test_pinned_shape_below_memory_setting(backend, backend_env, monkeypatch) -> None:
    monkeypatch.setenv("LANGFLOW_SANDBOX_MEMORY_MB", "8192")
    monkeypatch.setenv("CREATEOS_SANDBOX_SHAPE", "s-2vcpu-4gb")
    message = _refused(backend, backend_env)
    assert "below LANGFLOW_SANDBOX_MEMORY_MB=8192" in message


def test_no_shape_big_enough(backend, backend_env, monkeypatch) -> None:
    monkeypatch.setenv("LANGFLOW_SANDBOX_MEMORY_MB", "1048576")
    message = _refused(backend, backend_env)
    assert "No CreateOS shape has at least 1048576 MiB" in message


def test_memory_setting_is_a_floor_never_rounded_down(backend, backend_env, monkeypatch) -> None:
    monkeypatch.setenv("LANGFLOW_SANDBOX_MEMORY_MB", "5000")
    before = sandbox_ids(backend_env)
    assert backend.run("print(1)").exit_code == 0
    (row,) = new_guests(backend_env, before)
    assert row["shape"] == "s-4vcpu-8gb"


def test_default_memory_picks_the_smallest_4_gib_shape(backend, backend_env) -> None:
    before = sandbox_ids(backend_env)
    assert backend.run("print(1)", env={"LF_A": "1"}).exit_code == 0
    (row,) = new_guests(backend_env, before)
    assert row["shape"] == "s-2vcpu-4gb"
    # The rest of the create request: deny-all egress, the image, the env declared up front.
    assert row["egress"] == ["240.0.0.0/4"]
    assert row["rootfs"] == "devbox:1"
    assert row["envs"] == ["LF_A"]
    assert row["name"].startswith("lf-") and len(row["name"]) == 22


def test_wrong_key_is_refused_as_401(backend, backend_env, monkeypatch, fresh_endpoints) -> None:
    monkeypatch.setenv("CREATEOS_SANDBOX_API_KEY", "definitely-not-the-key")
    message = _refused(backend, backend_env)
    assert "401" in message
    assert "CREATEOS_SANDBOX_API_KEY" in message


def test_unreachable_control_plane(backend, backend_env, monkeypatch, fresh_endpoints) -> None:
    url = closed_port_url()
    monkeypatch.setenv("CREATEOS_SANDBOX_BASE_URL", url)
    message = _refused(backend, backend_env)
    assert f"CreateOS control plane at {url} is unreachable" in message
    assert "CREATEOS_SANDBOX_BASE_URL" in message


def test_non_429_4xx_during_a_run_fails_closed(backend, backend_env) -> None:
    backend.run("print(0)")
    for status in (402, 403):
        backend_env.set_faults({"rules": [{"route": "create", "status": status, "times": 1}]})
        message = _refused(backend, backend_env)
        assert str(status) in message


def test_cache_refreshes_when_the_key_or_url_changes(
    backend, backend_env, monkeypatch, fresh_endpoints
) -> None:
    assert backend.run("print(1)").exit_code == 0  # whoami and shapes now cached for this endpoint
    backend_env.set_faults(
        {"rules": [{"route": "whoami", "status": 401}, {"route": "shapes", "status": 500}]}
    )
    # Same key and URL: neither whoami nor the catalog is asked again.
    assert backend.run("print(2)").exit_code == 0
    # Same server under another spelling of its URL: a new endpoint, so whoami runs again.
    url = backend_env.url.replace("127.0.0.1", "localhost")
    assert url != backend_env.url
    monkeypatch.setenv("CREATEOS_SANDBOX_BASE_URL", url)
    assert "GET /v1/whoami" in _refused(backend, backend_env)
    # Another key: whoami runs again too.
    monkeypatch.setenv("CREATEOS_SANDBOX_BASE_URL", backend_env.url)
    monkeypatch.setenv("CREATEOS_SANDBOX_API_KEY", backend_env.api_key + "-rotated")
    assert "GET /v1/whoami" in _refused(backend, backend_env)
    # Back on the first key, whoami succeeding, the new endpoint still re-reads the catalog.
    backend_env.set_faults({"rules": [{"route": "shapes", "status": 500}]})
    monkeypatch.setenv("CREATEOS_SANDBOX_BASE_URL", url)
    monkeypatch.setenv("CREATEOS_SANDBOX_API_KEY", backend_env.api_key)
    with pytest.raises(SandboxExecutionError, match="could not read the shape catalog") as failed:
        backend.run("print(0)")
    assert not isinstance(failed.value, SandboxUnavailableError)  # a 5xx is transient
    backend_env.clear_faults()
    assert backend.run("print(3)").exit_code == 0


def test_a_server_that_is_not_createos_is_refused(backend, backend_env, fresh_endpoints) -> None:
    # 200 with JSON that is not a JSend envelope: something answers, but not CreateOS.
    backend_env.set_faults({"rules": [{"route": "whoami", "body": "wrong-envelope"}]})
    message = _refused(backend, backend_env)
    assert "did not answer like a CreateOS control plane" in message
    assert "CREATEOS_SANDBOX_BASE_URL" in message
