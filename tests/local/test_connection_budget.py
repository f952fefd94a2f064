"""A client with the API key is never starved by connections without it (issue 42).

At ac8509d the only budget was per client address, so on loopback every local process shared
one: a process with no key held every slot by sending one byte before each idle deadline, and a
legitimate client's ``/healthz`` got ``ConnectionResetError``. Here that holder keeps every slot
of 127.0.0.1 it can (reopening whatever the server closes) while a client with the key opens
fresh connections from the same address.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from cp_helpers import data

from langflow_sandbox_createos.local.testing import LocalControlPlane

PER_CLIENT = 64
UNAUTHENTICATED = (
    32  # the default of --max-unauthenticated-connections (not passed: ac8509d has no such flag)
)
IDLE_SECONDS = 120.0  # far beyond the test: only the budgets may close a connection here
TRICKLE_SECONDS = 1.0


class IdleHolder:
    """Holds ``count`` connections to the server without ever sending a whole request: one
    byte on each every ``TRICKLE_SECONDS`` (well before any idle deadline), and any connection
    the server closes is opened again."""

    def __init__(self, port: int, count: int) -> None:
        self.port = port
        self.socks: list[socket.socket | None] = [None] * count
        self.opened = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _connect(self) -> socket.socket | None:
        try:
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        except OSError:
            return None
        self.opened += 1
        return sock

    @staticmethod
    def _alive(sock: socket.socket) -> bool:
        try:
            return sock.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK) != b""
        except BlockingIOError:
            return True
        except OSError:
            return False

    def _run(self) -> None:
        next_byte = time.monotonic() + TRICKLE_SECONDS
        while not self.stop.is_set():
            for i, sock in enumerate(self.socks):
                if sock is None or not self._alive(sock):
                    if sock is not None:
                        sock.close()
                    self.socks[i] = self._connect()
            if time.monotonic() >= next_byte:
                for sock in self.socks:
                    if sock is not None:
                        with contextlib.suppress(OSError):
                            sock.send(b"G")  # a request line that never ends
                next_byte = time.monotonic() + TRICKLE_SECONDS
            self.stop.wait(0.05)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        for sock in self.socks:
            if sock is not None:
                sock.close()


@pytest.fixture
def plane() -> Iterator[LocalControlPlane]:
    args = ["--max-connections-per-client", str(PER_CLIENT), "--idle-connection-seconds", str(IDLE_SECONDS)]
    with LocalControlPlane(extra_args=args) as cp:
        yield cp


def _stats_from_elsewhere(plane: LocalControlPlane) -> dict[str, object]:
    """The stats, asked from 127.0.0.3 (an address the holder does not use)."""
    transport = httpx.HTTPTransport(local_address="127.0.0.3")
    with httpx.Client(transport=transport, base_url=plane.url, timeout=10) as client:
        answer = client.get("/_local/stats", headers={"X-Api-Key": plane.api_key})
        assert answer.status_code == 200, answer.text
        stats: dict[str, object] = answer.json()
        return stats


def _raw_request(sock: socket.socket, path: str, key: str) -> bytes:
    """One keep-alive request on ``sock``; the whole answer (it carries a Content-Length)."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nX-Api-Key: {key}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        assert chunk, f"the server closed the connection: {head!r}"
        head += chunk
    header, _, body = head.partition(b"\r\n\r\n")
    length = int(
        next(h.split(b":")[1] for h in header.split(b"\r\n") if h.lower().startswith(b"content-length"))
    )
    while len(body) < length:
        chunk = sock.recv(4096)
        assert chunk, "the server closed the connection mid-answer"
        body += chunk
    return header


def test_an_idle_holder_without_the_key_does_not_starve_a_client_with_it(plane: LocalControlPlane) -> None:
    """Fails on ac8509d: with every slot of 127.0.0.1 held, the client's fresh connections are
    closed on arrival (httpx.ReadError / RemoteProtocolError)."""
    assert plane.port is not None
    kept = socket.create_connection(("127.0.0.1", plane.port), timeout=10)  # shown the key, then quiet
    assert _raw_request(kept, "/v1/whoami", plane.api_key).startswith(b"HTTP/1.1 200")
    holder = IdleHolder(plane.port, PER_CLIENT)
    holder.thread.start()
    try:
        deadline = time.monotonic() + 30
        while (
            holder.opened < PER_CLIENT or int(_stats_from_elsewhere(plane)["connections_open"]) < PER_CLIENT
        ):
            assert time.monotonic() < deadline, (holder.opened, _stats_from_elsewhere(plane))
            time.sleep(0.05)
        # every slot of the address is taken now; a client with the key still gets in, each time
        fresh = httpx.Client(
            base_url=plane.url,
            headers={"X-Api-Key": plane.api_key},
            timeout=10,
            limits=httpx.Limits(max_keepalive_connections=0),  # a new connection per request
        )
        with fresh:
            for _ in range(10):
                assert fresh.get("/healthz").status_code == 200
                assert data(fresh.get("/v1/whoami"))
        # the connection that showed the key before the attack was never pushed out
        assert _raw_request(kept, "/healthz", plane.api_key).startswith(b"HTTP/1.1 200")
        stats = _stats_from_elsewhere(plane)
        assert int(stats["connections_refused"]) > 0, stats  # the holder's were, to make room

        # once the holder stops opening new ones, what it still holds is trimmed to the budget
        holder.stop.set()
        holder.thread.join(10)
        deadline = time.monotonic() + 30
        while int(_stats_from_elsewhere(plane)["connections_unauthenticated"]) > UNAUTHENTICATED:
            assert time.monotonic() < deadline, _stats_from_elsewhere(plane)
            time.sleep(0.1)
        assert _raw_request(kept, "/healthz", plane.api_key).startswith(b"HTTP/1.1 200")
    finally:
        holder.close()
        kept.close()


def test_an_address_whose_connections_all_showed_the_key_is_refused_over_its_cap(
    plane: LocalControlPlane,
) -> None:
    """The per-address cap still holds: only connections without the key are pushed out."""
    assert plane.port is not None
    socks = [socket.create_connection(("127.0.0.1", plane.port), timeout=10) for _ in range(PER_CLIENT)]
    try:
        for sock in socks:
            assert _raw_request(sock, "/healthz", plane.api_key).startswith(b"HTTP/1.1 200")
        before = int(_stats_from_elsewhere(plane)["connections_refused"])
        extra = socket.create_connection(("127.0.0.1", plane.port), timeout=10)
        with extra, pytest.raises((ConnectionResetError, AssertionError)):
            _raw_request(extra, "/healthz", plane.api_key)
        assert int(_stats_from_elsewhere(plane)["connections_refused"]) == before + 1
        for sock in socks:  # none of them was pushed out for it
            assert _raw_request(sock, "/healthz", plane.api_key).startswith(b"HTTP/1.1 200")
    finally:
        for sock in socks:
            sock.close()
