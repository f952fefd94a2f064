"""``result.error`` (the guest could not start the command) is an error, never a success.

The session control plane's images all have /bin/sh, so this module starts its own
createos-local serving one more image, an empty directory, where /bin/sh cannot start.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from lfx.utils.sandbox.base import SandboxExecutionError

from langflow_sandbox_createos.backend.engine import create_backend
from langflow_sandbox_createos.local.testing import LocalControlPlane

from .conftest import clean_backend_env


@pytest.fixture(scope="module")
def plane_with_empty_image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalControlPlane]:
    empty = tmp_path_factory.mktemp("empty-rootfs")
    with LocalControlPlane(extra_args=["--rootfs", f"empty:1={empty}"]) as plane:
        yield plane


def test_a_command_that_cannot_start_is_an_execution_error(
    plane_with_empty_image: LocalControlPlane, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    plane = plane_with_empty_image
    clean_backend_env(monkeypatch)
    monkeypatch.setenv("CREATEOS_SANDBOX_API_KEY", plane.api_key)
    monkeypatch.setenv("CREATEOS_SANDBOX_BASE_URL", plane.url)
    monkeypatch.setenv("CREATEOS_SANDBOX_ROOTFS", "empty:1")
    backend = create_backend()
    try:
        with pytest.raises(SandboxExecutionError) as info:
            backend.run("print('never')")
    finally:
        backend.shutdown()
    message = str(info.value)
    assert type(info.value) is SandboxExecutionError
    assert "could not start the program" in message
    assert "/bin/sh" in message  # the service's own error text names the command
    assert "CREATEOS_SANDBOX_ROOTFS='empty:1'" in message
    assert plane.wait_until_no_live(timeout=5.0) == []
