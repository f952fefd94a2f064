"""Runs on the host: starts and stops createos-local servers for tests that run elsewhere (a
Debian root under qemu-user-static, tests/packaging/test_foreign_roots.py), through
LocalControlPlane itself, on the host's loopback.

    python plane_spawner.py PORT_FILE SHARED_DIR

POST /start {"api_key", "args", "ca"} -> {"port", "pid", "workdir"}; POST /stop {"port"}.
SHARED_DIR holds the servers' work dirs: the same path inside the root (a bind mount), so paths
the tests pass (TLS files under pytest's basetemp) and get back mean the same on both sides.
Bound to 127.0.0.1 only; stops its servers when it gets SIGTERM.
"""

from __future__ import annotations

import json
import signal
import ssl
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from langflow_sandbox_createos.local.testing import LocalControlPlane

planes: dict[int, LocalControlPlane] = {}
lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        try:
            if self.path == "/start":
                plane = LocalControlPlane(api_key=body["api_key"])
                plane._args = list(body["args"])
                if body.get("ca"):
                    plane._ssl = ssl.create_default_context(cafile=body["ca"])
                plane.start()
                assert plane.port is not None and plane.workdir is not None
                with lock:
                    planes[plane.port] = plane
                answer = {"port": plane.port, "pid": plane.pid, "workdir": str(plane.workdir)}
            elif self.path == "/stop":
                with lock:
                    plane = planes.pop(int(body["port"]), None)
                if plane is not None:
                    plane.stop()
                answer = {}
            else:
                self.send_error(404)
                return
        except Exception as exc:  # reported to the caller
            self.send_response(500)
            self.end_headers()
            self.wfile.write(json.dumps({"error": repr(exc)}).encode())
            return
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    port_file, shared = Path(sys.argv[1]), Path(sys.argv[2])
    shared.mkdir(parents=True, exist_ok=True)
    tempfile.tempdir = str(shared)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)

    def stop(*_: object) -> None:
        threading.Thread(target=server.shutdown).start()

    signal.signal(signal.SIGTERM, stop)
    port_file.write_text(str(server.server_address[1]))
    try:
        server.serve_forever()
    finally:
        for plane in list(planes.values()):
            plane.stop()


if __name__ == "__main__":
    main()
