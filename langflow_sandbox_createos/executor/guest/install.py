"""lfx in the guest: whether it is there, its version, and the per-run install fallback
(`CREATEOS_EXECUTOR_INSTALL_LFX`) when the host asks for one.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from langflow_sandbox_createos.executor.framing import EXIT_INSTALL_FAILED, EXIT_NO_LFX, tail
from langflow_sandbox_createos.executor.guest.frames import Frames

INSTALL_TARGET = "/workspace/.createos-lfx"


def _lfx_found() -> bool:
    import importlib.util

    return importlib.util.find_spec("lfx") is not None


def _ensure_lfx(frames: Frames, request: dict[str, Any] | None = None, deadline: float = 0.0) -> bool:
    """Whether lfx had to be installed for this run (`request`: the host's install request).
    Exits with EXIT_NO_LFX after a `missing_lfx` frame when the guest has none to import."""
    if _lfx_found():
        return False
    if not request:
        frames.emit("missing_lfx", python=sys.executable)
        sys.exit(EXIT_NO_LFX)
    _install(frames, request, deadline)
    if not _lfx_found():
        frames.emit("missing_lfx", python=sys.executable, after_install=True)
        sys.exit(EXIT_NO_LFX)
    return True


def _lfx_version() -> str | None:
    """lfx's version from the dist-info beside the package (one directory listing), not
    importlib.metadata, which scans every distribution on sys.path (~0.1 s per run)."""
    import importlib.util

    spec = importlib.util.find_spec("lfx")
    origin = getattr(spec, "origin", None)
    if origin:
        site = os.path.dirname(os.path.dirname(origin))
        try:
            names = os.listdir(site)
        except OSError:
            names = []
        for name in names:
            if name.startswith("lfx-") and name.endswith(".dist-info"):
                try:
                    with open(os.path.join(site, name, "METADATA"), encoding="utf-8") as handle:
                        for line in handle:
                            if line.startswith("Version:"):
                                return line.split(":", 1)[1].strip()
                            if not line.strip():
                                break
                except OSError:
                    break
    try:
        from importlib.metadata import version

        return version("lfx")
    except Exception:
        return None


def _install(frames: Frames, request: dict[str, Any], deadline: float) -> None:
    """Per-run install fallback: pip's own exit status decides, its output tail is reported."""
    import subprocess

    packages = [str(p) for p in request.get("packages", [])]
    cmd = [
        sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
        "--target", INSTALL_TARGET, *packages,
    ]  # fmt: skip
    frames.emit("installing", packages=packages)
    started = time.monotonic()
    try:
        done = subprocess.run(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=max(1.0, deadline - time.monotonic()),
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        output = exc.output.decode("utf-8", "replace") if isinstance(exc.output, bytes) else ""
        frames.emit("install_failed", status=None, timed_out=True, tail=tail(output))
        sys.exit(EXIT_INSTALL_FAILED)
    output = done.stdout.decode("utf-8", "replace")
    if done.returncode != 0:
        frames.emit("install_failed", status=done.returncode, timed_out=False, tail=tail(output))
        sys.exit(EXIT_INSTALL_FAILED)
    sys.path.insert(0, INSTALL_TARGET)
    import importlib

    importlib.invalidate_caches()
    frames.emit("installed", seconds=round(time.monotonic() - started, 3), tail=tail(output, 1000))
