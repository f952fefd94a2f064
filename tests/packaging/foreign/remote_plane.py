"""A pytest plugin for tests/native run inside a Debian root under qemu-user-static
(tests/packaging/test_foreign_roots.py, `-p remote_plane`): every LocalControlPlane the tests
start is a createos-local on the host, started by plane_spawner.py (CREATEOS_PLANE_SPAWNER=
host:port), reached on the shared loopback. The guests run on the host, under its bubblewrap;
the client under test is the wheel's aarch64 extension."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path
from typing import Any

from langflow_sandbox_createos.local import testing

SPAWNER = os.environ["CREATEOS_PLANE_SPAWNER"]


def _call(path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(f"http://{SPAWNER}{path}", data=json.dumps(body).encode(), method="POST")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"plane spawner: {exc.read().decode()}") from exc


def _start(self: testing.LocalControlPlane) -> testing.LocalControlPlane:
    ca = None
    if "--tls-cert" in self._args and self._ssl is not None:
        ca = getattr(self, "_remote_ca", None)
    answer = _call("/start", {"api_key": self.api_key, "args": self._args, "ca": ca})
    self.port = answer["port"]
    self.workdir = Path(answer["workdir"])
    self._remote_pid = answer["pid"]
    return self


def _stop(self: testing.LocalControlPlane, timeout: float = 10.0) -> None:
    if self.port is not None:
        _call("/stop", {"port": self.port})
    self.port = None
    self.workdir = None


_init = testing.LocalControlPlane.__init__


def _init_keep_ca(self: testing.LocalControlPlane, *args: Any, **kwargs: Any) -> None:
    _init(self, *args, **kwargs)
    tls = kwargs.get("tls")
    self._remote_ca = str(tls[2]) if tls else None


testing.LocalControlPlane.__init__ = _init_keep_ca  # type: ignore[method-assign]
testing.LocalControlPlane.start = _start  # type: ignore[method-assign]
testing.LocalControlPlane.stop = _stop  # type: ignore[method-assign]
testing.LocalControlPlane.pid = property(lambda self: getattr(self, "_remote_pid", None))  # type: ignore[method-assign,assignment]
