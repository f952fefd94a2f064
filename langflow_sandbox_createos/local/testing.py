"""Start createos-local as a subprocess for tests (stdlib only, importable anywhere).

with LocalControlPlane() as cp:
    os.environ["CREATEOS_SANDBOX_BASE_URL"] = cp.url
    os.environ["CREATEOS_SANDBOX_API_KEY"] = cp.api_key
    ...
    assert cp.live_sandboxes() == []
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


class LocalControlPlane:
    """A createos-local server on a free loopback port, with its own temporary state dir."""

    def __init__(
        self,
        *,
        api_key: str | None = None,
        boot_delay_ms: int = 0,
        transition_delay_ms: int = 0,
        heartbeat_seconds: float | None = None,
        streaming: bool = True,
        isolation: bool = True,
        extra_args: Sequence[str] = (),
        startup_timeout: float = 30.0,
        tls: tuple[str | os.PathLike[str], str | os.PathLike[str], str | os.PathLike[str]] | None = None,
    ) -> None:
        """``tls=(cert, key, ca)`` serves HTTPS on ``https://localhost:PORT``; ``ca`` is the PEM
        bundle the admin calls of this helper trust. ``api_key`` defaults to a random one (a
        guest cannot guess it); it reaches the server in its environment, not its argv."""
        self.api_key = api_key if api_key is not None else secrets.token_urlsafe(18)
        self._args = ["--boot-delay-ms", str(boot_delay_ms)]
        self._args += ["--transition-delay-ms", str(transition_delay_ms)]
        if heartbeat_seconds is not None:
            self._args += ["--heartbeat-seconds", str(heartbeat_seconds)]
        if not streaming:
            self._args.append("--no-streaming")
        if not isolation:
            self._args.append("--no-isolation")
        self._args += list(extra_args)
        self._ssl: ssl.SSLContext | None = None
        if tls is not None:
            cert, key, ca = (str(p) for p in tls)
            self._args += ["--tls-cert", cert, "--tls-key", key]
            self._ssl = ssl.create_default_context(cafile=ca)
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self.workdir: Path | None = None
        self.port: int | None = None

    # -- lifecycle -----------------------------------------------------------------------
    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("the control plane is not running")
        if self._ssl is not None:  # the certificate names localhost
            return f"https://localhost:{self.port}"
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def guest_file(self, sandbox_id: str, guest_path: str) -> Path:
        """The host path of a file in a guest's root, readable by this (root) process while the
        sandbox lives: guest roots are mounts of the server's own mount namespace, reached
        through ``/proc/<server pid>/root``. Without isolation, the sandbox's plain ``fs/``."""
        fs = self.state_dir / "sandboxes" / sandbox_id / "fs"
        if self.pid is not None and "--no-isolation" not in self._args:
            fs = Path(f"/proc/{self.pid}/root") / fs.relative_to("/")
        return fs / guest_path.lstrip("/")

    @property
    def state_dir(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "state"

    @property
    def log_path(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "server.log"

    def start(self) -> LocalControlPlane:
        self.workdir = Path(tempfile.mkdtemp(prefix="createos-local-test-"))
        self.workdir.chmod(0o711)  # searchable by the unprivileged guest user (see __main__)
        port_file = self.workdir / "port"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
        env["CREATEOS_LOCAL_API_KEY"] = self.api_key
        argv = [sys.executable, "-m", "langflow_sandbox_createos.local", "--host", "127.0.0.1", "--port", "0"]
        argv += ["--state-dir", str(self.state_dir), "--port-file", str(port_file), *self._args]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"createos-local exited early:\n{self.log_path.read_text()}")
            if port_file.exists():
                self.port = int(port_file.read_text())
                with contextlib.suppress(OSError):
                    if self._request("GET", "/healthz", timeout=2)[0] == 200:
                        return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("createos-local did not become healthy in time")

    def stop(self, timeout: float = 10.0) -> None:
        proc, self.process = self.process, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self.port = None
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def __enter__(self) -> LocalControlPlane:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- admin API ------------------------------------------------------------------------
    def _request(
        self, method: str, path: str, body: Any = None, timeout: float = 30.0, auth: bool = False
    ) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if auth:
            request.add_header("X-Api-Key", self.api_key)
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=self._ssl) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def stats(self) -> dict[str, Any]:
        return self._request("GET", "/_local/stats", auth=True)[1]

    def faults(self) -> dict[str, Any]:
        return self._request("GET", "/_local/faults", auth=True)[1]["data"]

    def set_faults(self, faults: dict[str, Any]) -> dict[str, Any]:
        status, body = self._request("PUT", "/_local/faults", faults, auth=True)
        if status != 200:
            raise ValueError(f"fault set refused: {body}")
        return body["data"]

    def clear_faults(self) -> None:
        self._request("DELETE", "/_local/faults", auth=True)

    def sandboxes(self) -> list[dict[str, Any]]:
        """Every sandbox row (id, name, status, created_at), terminal ones included."""
        return self.stats()["sandboxes"]

    def live_sandboxes(self) -> list[dict[str, Any]]:
        return [sb for sb in self.sandboxes() if sb["status"] not in ("destroyed", "failed")]

    def delete_sandbox(self, sandbox_id: str) -> None:
        self._request("DELETE", f"/v1/sandboxes/{sandbox_id}", auth=True)

    def delete_all(self) -> None:
        """Delete every live sandbox (test cleanup helper)."""
        for sb in self.live_sandboxes():
            if sb["status"] != "destroying":
                self.delete_sandbox(sb["id"])

    def wait_until_no_live(
        self, timeout: float = 5.0, ignore_prefix: str | None = None
    ) -> list[dict[str, Any]]:
        """Poll until no live sandbox remains (optionally ignoring names with a prefix); return the rest."""
        deadline = time.monotonic() + timeout
        while True:
            live = [
                sb
                for sb in self.live_sandboxes()
                if not (ignore_prefix and (sb.get("name") or "").startswith(ignore_prefix))
            ]
            if not live or time.monotonic() >= deadline:
                return live
            time.sleep(0.05)
