"""A loopback HTTP peer for the native client's tests: it counts connections, keeps every
request byte it receives, and answers each request with ``response``: raw bytes (empty: no
answer, as a proxy that must never be used), or a function of the request (method, target,
header lines and body) that returns the raw answer. One request per connection: answers
should say ``Connection: close``."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Request:
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)


Responder = Callable[[Request], bytes]


def answer(status: str, headers: list[str], body: bytes) -> bytes:
    """Raw HTTP/1.1 answer bytes with Content-Length and Connection: close."""
    head = [f"HTTP/1.1 {status}", *headers, f"Content-Length: {len(body)}", "Connection: close"]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def parse_request(raw: bytes) -> Request:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = [*lines[0].split(" ", 2), "", ""][:3]
    headers = [(k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in lines[1:] if line)]
    return Request(method, target, headers, body)


class RawServer:
    def __init__(self, response: bytes | Responder = b"") -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.response = response
        self.received = b""
        self.requests: list[Request] = []
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _read_request(self, conn: socket.socket) -> bytes:
        request = b""
        while b"\r\n\r\n" not in request and (chunk := conn.recv(65536)):
            request += chunk
        length = parse_request(request).header("Content-Length")
        if length is not None and length.isdigit():
            want = request.index(b"\r\n\r\n") + 4 + int(length)
            while len(request) < want and (chunk := conn.recv(65536)):
                request += chunk
        return request

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            with conn, contextlib.suppress(OSError):
                conn.settimeout(5)
                request = self._read_request(conn)
                self.received += request
                if callable(self.response):
                    parsed = parse_request(request)
                    self.requests.append(parsed)
                    reply = self.response(parsed)
                else:
                    reply = self.response
                if reply:
                    conn.sendall(reply)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()
