"""Start createos-local as a subprocess for tests (stdlib only, importable anywhere).

with LocalControlPlane() as cp:
    os.environ["CREATEOS_SANDBOX_BASE_URL"] = cp.url
    os.environ["CREATEOS_SANDBOX_API_KEY"] = cp.api_key
    ...
    assert cp.live_sandboxes() == []
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from langflow_sandbox_createos.core import with_this_package_importable

_CLONE_NEWNET = 0x40000000
_SANITIZER_ENV = frozenset({"LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS", "PYTHONMALLOC"})


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
        # The control plane is not what a sanitizer run (make sanitize) checks: its Python and
        # the tools it starts for every guest (unshare, nsenter, nft, bwrap, ...) run without
        # the sanitizer runtime, which would slow each of them down many times over.
        env = {k: v for k, v in os.environ.items() if k not in _SANITIZER_ENV}
        with_this_package_importable(env)
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

    def fault_hits(self) -> list[int]:
        """How many requests each rule of the current fault set fired on, in the order the
        rules were set (spent ``times`` rules included); read it before ``clear_faults``."""
        return list(self.faults()["hits"])

    def clear_faults(self) -> None:
        self._request("DELETE", "/_local/faults", auth=True)

    def sandboxes(self) -> list[dict[str, Any]]:
        """Every sandbox row (id, name, status, created_at), terminal ones included."""
        return self.stats()["sandboxes"]

    def live_sandboxes(self) -> list[dict[str, Any]]:
        return [sb for sb in self.sandboxes() if sb["status"] not in ("destroyed", "failed")]

    def network(self, sandbox_id: str) -> dict[str, Any]:
        """A guest's egress as enforced and its rules read back from the kernel."""
        status, body = self._request("GET", f"/_local/sandboxes/{sandbox_id}/network", auth=True)
        if status != 200:
            raise RuntimeError(f"/_local/sandboxes/{sandbox_id}/network answered {status}: {body}")
        return body

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


# A banner server (each connection gets one line and is closed) or, given a directory, an
# HTTP server of that directory (a package index for pip's --find-links).
_TEST_HOST_SERVER = r"""
import functools, http.server, socket, sys
if len(sys.argv) > 2:
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[2])
    handler.log_message = lambda *a: None
    srv = http.server.ThreadingHTTPServer((sys.argv[1], 0), handler)
    print(srv.server_address[1], flush=True)
    srv.serve_forever()
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((sys.argv[1], 0))
srv.listen(64)
print(srv.getsockname()[1], flush=True)
while True:
    conn, _ = srv.accept()
    with conn:
        conn.sendall(b"createos-test-host\n")
"""


class NamespaceHost:
    """A test host of the test's own: a network namespace joined to this machine by a veth pair
    (``10.213.N.1`` here, ``10.213.N.2`` there), serving one banner line per TCP connection, or
    ``serve_dir`` over HTTP. What egress tests aim at instead of an outside address. Needs root
    and iproute2."""

    BANNER = "createos-test-host"

    def __init__(self, serve_dir: str | os.PathLike[str] | None = None) -> None:
        self.serve_dir = str(serve_dir) if serve_dir is not None else None
        tag = secrets.token_hex(3)
        self.netns = f"cos-th-{tag}"
        self._link = f"cth{tag}"  # + "h" here, "g" there: at most 15 characters
        self.subnet = self._free_subnet()
        self.host_side = self.subnet.replace(".0/30", ".1")
        self.address = self.subnet.replace(".0/30", ".2")
        self.port = 0
        self._server: subprocess.Popen[bytes] | None = None

    @staticmethod
    def _free_subnet() -> str:
        used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=True).stdout
        for _ in range(64):
            n = secrets.randbelow(250) + 1
            if f" 10.213.{n}." not in used:
                return f"10.213.{n}.0/30"
        raise RuntimeError("no free 10.213.N.0/30 subnet for a test host")

    def _ip(self, *args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True)

    def __enter__(self) -> NamespaceHost:
        try:
            self._ip("netns", "add", self.netns)
            self._ip("link", "add", f"{self._link}h", "type", "veth", "peer", "name", f"{self._link}g")
            self._ip("link", "set", f"{self._link}g", "netns", self.netns)
            self._ip("addr", "add", f"{self.host_side}/30", "dev", f"{self._link}h")
            self._ip("link", "set", f"{self._link}h", "up")
            self._ip("-n", self.netns, "addr", "add", f"{self.address}/30", "dev", f"{self._link}g")
            self._ip("-n", self.netns, "link", "set", f"{self._link}g", "up")
            self._ip("-n", self.netns, "link", "set", "lo", "up")
            argv = ["ip", "netns", "exec", self.netns, sys.executable, "-c", _TEST_HOST_SERVER, self.address]
            self._server = subprocess.Popen(
                [*argv, *([self.serve_dir] if self.serve_dir else [])],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
            assert self._server.stdout is not None
            line = self._server.stdout.readline()
            if not line.strip():
                raise RuntimeError("the test host's server did not start")
            self.port = int(line)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}/"

    def listen_socket(self) -> socket.socket:
        """A TCP socket of this process listening on the test host's address (a free port): a
        server of the test's own, in this process, that guests reach through their egress.
        Made by a short-lived thread that enters the test host's network namespace."""
        made: list[socket.socket] = []
        failed: list[BaseException] = []

        def inside() -> None:
            libc = ctypes.CDLL(None, use_errno=True)
            own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
            target = os.open(f"/run/netns/{self.netns}", os.O_RDONLY)
            try:
                if libc.setns(target, _CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns into the test host's namespace failed")
                try:
                    sock = socket.socket()
                    sock.bind((self.address, 0))
                    sock.listen(64)
                    made.append(sock)
                finally:
                    libc.setns(own, _CLONE_NEWNET)  # the thread ends here anyway
            except BaseException as exc:
                failed.append(exc)
            finally:
                os.close(own)
                os.close(target)

        thread = threading.Thread(target=inside)
        thread.start()
        thread.join()
        if failed:
            raise failed[0]
        return made[0]

    def close(self) -> None:
        if self._server is not None:
            self._server.kill()
            self._server.wait(10)
            self._server = None
        for args in (("link", "del", f"{self._link}h"), ("netns", "del", self.netns)):
            subprocess.run(["ip", *args], capture_output=True, check=False)
