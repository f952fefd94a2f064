"""Shared fixtures: a real createos-local control plane for every suite."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from langflow_sandbox_createos.local.images import TEMPLATE_NAME
from langflow_sandbox_createos.local.testing import LocalControlPlane

# Sandboxes whose names start with this are deliberately kept between tests (reused guests).
KEEP_PREFIX = "lf-c-"


@pytest.fixture(scope="session")
def control_plane() -> Iterator[LocalControlPlane]:
    """One createos-local for the whole session (boot delay 0)."""
    with LocalControlPlane(boot_delay_ms=0) as plane:
        yield plane


@pytest.fixture
def cp(control_plane: LocalControlPlane) -> Iterator[LocalControlPlane]:
    """The session control plane with no faults; fails the test if it leaves a live sandbox
    behind (names starting with ``lf-c-`` excepted)."""
    control_plane.clear_faults()
    yield control_plane
    control_plane.clear_faults()
    leaked = control_plane.wait_until_no_live(timeout=5.0, ignore_prefix=KEEP_PREFIX)
    if leaked:
        for sb in leaked:
            control_plane.delete_sandbox(sb["id"])
        pytest.fail(f"test left live sandboxes behind: {leaked}")


@pytest.fixture
def createos_env(monkeypatch: pytest.MonkeyPatch, control_plane: LocalControlPlane) -> LocalControlPlane:
    """Point the plugin at the local control plane through its environment variables; the
    executor's guests use createos-local's lfx template, as a deployment uses its template
    (``devbox:1`` is a plain image without lfx)."""
    monkeypatch.setenv("CREATEOS_SANDBOX_API_KEY", control_plane.api_key)
    monkeypatch.setenv("CREATEOS_SANDBOX_BASE_URL", control_plane.url)
    monkeypatch.setenv("CREATEOS_EXECUTOR_ROOTFS", TEMPLATE_NAME)
    # createos-local's guests are namespaces, not microVMs: the backend refuses them unless
    # told that is accepted (tests/backend/test_isolation_report.py checks the refusal)
    monkeypatch.setenv("CREATEOS_SANDBOX_ACCEPT_LOCAL_ISOLATION", "true")
    return control_plane
