"""The mid-transfer download cap.

createos-local always declares Content-Length on file downloads (that path is
covered against it in test_operations.py). A body with no declared length,
chunked, is the case where only the running count can stop the transfer, so
this test uses a minimal raw-socket HTTP peer that answers with chunked
encoding: real HTTP over a real socket, not a mocked client layer.
"""

from __future__ import annotations

import socket
import threading

import pytest

from langflow_sandbox_createos import _createos


class ChunkedPeer:
    def __init__(self, total: int, chunk: int = 64 * 1024) -> None:
        self.total, self.chunk, self.sent = total, chunk, 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            buf = b""
            while b"\r\n\r\n" not in buf:
                buf += conn.recv(4096)
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
            )
            piece = b"x" * self.chunk
            try:
                while self.sent < self.total:
                    conn.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
                    self.sent += len(piece)
                conn.sendall(b"0\r\n\r\n")
            except OSError:
                pass  # the client hung up: that is the point


def test_chunked_body_over_the_cap_is_aborted_mid_transfer() -> None:
    peer = ChunkedPeer(total=64 << 20)
    c = _createos.Client(peer.url, "k", control_timeout=20)
    with pytest.raises(_createos.UnavailableError) as info:
        c.download("sb-1", "/workspace/big", max_bytes=1 << 20)
    assert info.value.code == "too_large" and "transfer aborted" in str(info.value)
    peer.thread.join(10)
    received = c.stats()["bytes_received"]
    assert received <= (1 << 20) + 2 * peer.chunk  # stopped within a chunk of the cap
    assert peer.sent < 64 << 20
    c.close()


def test_chunked_body_under_the_cap_is_returned() -> None:
    peer = ChunkedPeer(total=256 * 1024, chunk=1000)
    c = _createos.Client(peer.url, "k")
    assert c.download("sb-1", "/workspace/f", max_bytes=1 << 20) == b"x" * peer.sent
    c.close()
