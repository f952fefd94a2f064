"""An HTTP proxy for HTTPS traffic on loopback, as corporate networks have: it answers
``CONNECT host:port`` with ``200 Connection established`` and then copies bytes both ways,
so TLS runs end to end through it. It keeps the targets it tunnelled to. With ``tls=(cert,
key)`` it is an HTTPS proxy: the client speaks TLS to the proxy itself (``https://localhost``),
and the control plane's TLS runs inside that; ``handshakes`` counts the TLS sessions it
accepted, ``failed_handshakes`` those that did not complete (a client that refused its
certificate)."""

from __future__ import annotations

import contextlib
import selectors
import socket
import ssl
import threading
from pathlib import Path


class ConnectProxy:
    def __init__(self, tls: tuple[Path, Path] | None = None) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.tunnels: list[str] = []
        self.refused: list[bytes] = []
        self.handshakes = 0
        self.failed_handshakes = 0
        self._tls: ssl.SSLContext | None = None
        if tls is not None:
            self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._tls.load_cert_chain(str(tls[0]), str(tls[1]))
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accept = threading.Thread(target=self._serve, daemon=True)
        self._accept.start()

    @property
    def url(self) -> str:
        port = self.sock.getsockname()[1]
        return f"https://localhost:{port}" if self._tls else f"http://127.0.0.1:{port}"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            t = threading.Thread(target=self._tunnel, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _tunnel(self, raw: socket.socket) -> None:
        conn = raw
        if self._tls is not None:
            try:
                raw.settimeout(5)
                conn = self._tls.wrap_socket(raw, server_side=True)
                self.handshakes += 1
            except (OSError, ssl.SSLError):
                self.failed_handshakes += 1
                raw.close()
                return
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
                # a TLS socket may hold decrypted bytes its descriptor no longer shows
                held = [s for s in (a, b) if isinstance(s, ssl.SSLSocket) and s.pending()]
                for src in held or [key.fileobj for key, _ in sel.select(timeout=0.2)]:
                    assert isinstance(src, socket.socket)
                    try:
                        data = src.recv(65536)
                    except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
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
