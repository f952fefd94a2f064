"""``PUT /egress`` applies to a live guest at once (issue 42).

At ac8509d the rules changed only at the guest's next exec: a background process it left
running kept its old egress (20 connections to a test host in the 5 s after the rules were
narrowed to deny-all). Here a background process connects to a server of the test's own (on a
``NamespaceHost``) in a loop and holds one more connection open; the test narrows the rules and
tells the guest so through the files API (never an exec, which would load the rules at
ac8509d too); every attempt the guest starts after that must be refused, the server must see
none of them, and the open connection must be cut. Widening applies at once as well.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from cp_helpers import data, sh

from langflow_sandbox_createos.local.testing import NamespaceHost

# The guest's side: one connection held open, then connect, send "<n> <phase>", close, in a
# loop; each attempt's phase is the newest marker file present when it started, and its
# outcome goes to /tmp/egress.log. Once narrowed, the held connection sends "after" and reports
# what became of it.
GUEST = r"""
import os, socket, sys, threading, time
addr, port = sys.argv[1], int(sys.argv[2])
log = open("/tmp/egress.log", "a", buffering=1)
def phase():
    for name in ("reopened", "narrowed"):
        if os.path.exists(f"/tmp/{name}"):
            return name
    return "open"
held = socket.create_connection((addr, port), timeout=10)
held.sendall(b"held\n")
def watch_held():
    while phase() == "open":
        time.sleep(0.01)
    try:
        held.sendall(b"after\n")
        held.settimeout(20)
        log.write(f"held: data {held.recv(100)!r}\n")
    except OSError as e:
        log.write(f"held: {type(e).__name__}\n")
threading.Thread(target=watch_held, daemon=True).start()
n = 0
while True:
    n += 1
    tag = phase()
    try:
        s = socket.create_connection((addr, port), timeout=5)
        s.sendall(f"{n} {tag}\n".encode())
        s.close()
        log.write(f"{n} {tag} ok\n")
    except OSError as e:
        log.write(f"{n} {tag} {type(e).__name__}\n")
    time.sleep(0.02)
"""


class Server:
    """The test host's listener: counts what each accepted connection says (its first line)."""

    def __init__(self, listener: socket.socket) -> None:
        self.listener = listener
        self.lines: list[str] = []
        self.held: socket.socket | None = None
        self.got_held = threading.Event()
        self.open_seen = threading.Event()  # three connections made before the rules changed
        self.reopened_seen = threading.Event()
        self._stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.listener.settimeout(0.2)
        while not self._stop:
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(10)
            try:
                line = conn.recv(100).decode(errors="replace").strip()
            except OSError:
                conn.close()
                continue
            if line == "held":
                self.held = conn
                self.got_held.set()
                continue
            conn.close()
            self.lines.append(line)
            if sum(1 for seen in self.lines if seen.endswith(" open")) >= 3:
                self.open_seen.set()
            if line.endswith(" reopened"):
                self.reopened_seen.set()

    def close(self) -> None:
        self._stop = True
        self.thread.join(5)
        self.listener.close()
        if self.held is not None:
            self.held.close()


@pytest.fixture(scope="module")
def test_host() -> Iterator[NamespaceHost]:
    with NamespaceHost() as host:
        yield host


def _guest_log(client: httpx.Client, sandbox_id: str) -> list[str]:
    answer = client.get(f"/v1/sandboxes/{sandbox_id}/files", params={"path": "/tmp/egress.log"})
    return answer.text.splitlines() if answer.status_code == 200 else []


def _wait_log(client: httpx.Client, sandbox_id: str, done: Any, what: str, timeout: float = 60) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        lines = _guest_log(client, sandbox_id)
        if done(lines):
            return lines
        assert time.monotonic() < deadline, f"the guest never logged {what}: {lines[-20:]}"
        time.sleep(0.05)


def _mark(client: httpx.Client, sandbox_id: str, name: str) -> None:
    put = client.put(f"/v1/sandboxes/{sandbox_id}/files", params={"path": f"/tmp/{name}"}, content=b"")
    assert put.status_code == 200, put.text


def _attempts(lines: list[str], tag: str) -> list[str]:
    return [line.split()[2] for line in lines if len(line.split()) == 3 and line.split()[1] == tag]


def test_egress_put_reaches_a_running_background_process_at_once(
    client: httpx.Client, sandbox_factory: Any, test_host: NamespaceHost
) -> None:
    """Fails on ac8509d: after PUT deny-all, the background process's new connections still
    reach the test host ("narrowed ok" in its log, the server counts them)."""
    server = Server(test_host.listen_socket())
    try:
        port = server.listener.getsockname()[1]
        sb = sandbox_factory(egress=["*"])
        sid = sb["id"]
        started = sh(
            client,
            sid,
            f"nohup python3 -c '{GUEST}' {test_host.address} {port} >/tmp/guest.err 2>&1 & echo started",
        )
        assert started["stdout"] == "started\n", started
        assert server.got_held.wait(30), _guest_log(client, sid)
        assert server.open_seen.wait(30), (server.lines, _guest_log(client, sid))

        # deny-all as the product sends it (an unroutable range)
        data(client.put(f"/v1/sandboxes/{sid}/egress", json={"egress": ["240.0.0.0/4"]}))
        _mark(client, sid, "narrowed")  # from here on, every attempt the guest starts is "narrowed"
        lines = _wait_log(
            client,
            sid,
            lambda lines: (
                len(_attempts(lines, "narrowed")) >= 5 and any(x.startswith("held:") for x in lines)
            ),
            "five narrowed attempts and the held connection's fate",
        )
        narrowed = _attempts(lines, "narrowed")
        assert set(narrowed) == {"ConnectionRefusedError"}, lines[-20:]
        assert not [line for line in server.lines if line.endswith(" narrowed")], server.lines
        # the connection opened before: cut at its next packet, and nothing of it got through
        held = next(line for line in lines if line.startswith("held:"))
        assert held == "held: ConnectionResetError", held
        assert server.held is not None
        server.held.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.held.recv(100)  # "after" never arrived (and no FIN either: the NAT is not told)

        data(client.put(f"/v1/sandboxes/{sid}/egress", json={"egress": None}))  # allow-all again
        _mark(client, sid, "reopened")
        assert server.reopened_seen.wait(30), _guest_log(client, sid)[-20:]
    finally:
        server.close()
