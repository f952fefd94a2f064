"""An HTTP proxy for HTTPS traffic on loopback, as corporate networks have: it answers
``CONNECT host:port`` with ``200 Connection established`` and then copies bytes both ways,
so TLS runs end to end through it. It keeps the targets it tunnelled to."""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading


class ConnectProxy:
    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.tunnels: list[str] = []
        self.refused: list[bytes] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accept = threading.Thread(target=self._serve, daemon=True)
        self._accept.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            t = threading.Thread(target=self._tunnel, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _tunnel(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.settimeout(5)
            head = b""
            while b"\r\n\r\n" not in head and (chunk := conn.recv(4096)):
                head += chunk
            line = head.split(b"\r\n", 1)[0].decode("latin-1")
            method, target, _ = [*line.split(" "), "", "", ""][:3]
            host, _, port = target.rpartition(":")
            if method != "CONNECT" or not port.isdigit():
                self.refused.append(head)
                conn.sendall(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
                return
            with socket.create_connection((host.strip("[]"), int(port)), timeout=5) as upstream:
                self.tunnels.append(target)
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                extra = head.split(b"\r\n\r\n", 1)[1]
                if extra:
                    upstream.sendall(extra)
                self._pipe(conn, upstream)

    def _pipe(self, a: socket.socket, b: socket.socket) -> None:
        a.setblocking(False)
        b.setblocking(False)
        peer = {a: b, b: a}
        with selectors.DefaultSelector() as sel:
            sel.register(a, selectors.EVENT_READ)
            sel.register(b, selectors.EVENT_READ)
            while not self._stop.is_set():
                for key, _ in sel.select(timeout=0.2):
                    src = key.fileobj
                    assert isinstance(src, socket.socket)
                    try:
                        data = src.recv(65536)
                    except BlockingIOError:
                        continue
                    if not data:
                        return
                    dst = peer[src]
                    dst.setblocking(True)
                    dst.sendall(data)
                    dst.setblocking(False)

    def close(self) -> None:
        self._stop.set()
        self._accept.join(5)
        for t in self._threads:
            t.join(5)
        self.sock.close()
