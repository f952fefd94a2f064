"""The native client module, imported on first use so a missing build fails there, with a clear
error, and not when lfx imports this package."""

from __future__ import annotations

from lfx.utils.sandbox.base import SandboxUnavailableError


def load_native():
    try:
        from langflow_sandbox_createos import _createos
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise SandboxUnavailableError(
            "The CreateOS native client (langflow_sandbox_createos._createos) is not built or cannot load: "
            f"{exc}. Reinstall the package; building it needs libcurl and jansson development headers."
        ) from exc
    return _createos
