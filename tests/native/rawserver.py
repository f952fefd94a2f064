"""A loopback HTTP peer for the native client's tests: it counts connections, keeps every
request byte it receives, and answers each request with ``response`` (raw bytes; empty:
no answer, as a proxy that must never be used)."""

from __future__ import annotations

import contextlib
import socket
import threading


class RawServer:
    def __init__(self, response: bytes = b"") -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.response = response
        self.received = b""
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            with conn, contextlib.suppress(OSError):
                conn.settimeout(5)
                request = b""
                while b"\r\n\r\n" not in request and (chunk := conn.recv(65536)):
                    request += chunk
                self.received += request
                if self.response:
                    conn.sendall(self.response)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()
