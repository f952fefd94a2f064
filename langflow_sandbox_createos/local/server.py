"""Running the app on uvicorn: a bound loopback socket, a port file, clean guest teardown."""

from __future__ import annotations

import asyncio
import functools
import hmac
import itertools
import logging
import signal
import socket
from collections import Counter
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from .config import ServerConfig
from .faults import CONNECTION_KEY, TRANSPORT_KEY
from .plane import Plane
from .routes import build_app
from .stats import Counters

log = logging.getLogger("createos.local")

WRITE_BUFFER_HIGH = 1024 * 1024
# Numbers each accepted connection: a client's (address, port) is not enough to tell two
# connections apart, since a busy machine reuses its ephemeral ports.
_CONNECTIONS = itertools.count(1)
# how long a new connection has to send its first request (and show the key) before it counts
# against the budget of unauthenticated connections
UNAUTHENTICATED_GRACE_SECONDS = 2.0


class ConnectionGuard:
    """Bounds what clients can hold open, so that one without the key never starves one with it.

    Every connection starts *unauthenticated* and becomes *authenticated* at its first request
    that carries the right ``X-Api-Key`` (``promote``). Budgets:

    * ``per_client``: the connections of one client address, both kinds. A new one over it
      pushes out that address's oldest unauthenticated connection; it is refused only when all
      of them have shown the key.
    * ``unauthenticated``: connections that have not shown the key, all addresses together,
      kept beyond their first ``grace`` seconds (the time a client has to send its first
      request). Over it, the oldest such connection is closed.

    On loopback every local process is one address: a process that holds all its slots without
    the key (one byte before each idle deadline) only ever holds unauthenticated ones, which
    every new connection can push out, so a client with the key is always let in and, once it
    has shown the key, never closed for anyone else. None of them idles longer than
    ``idle_seconds`` (no byte received and no request in progress). The counts live in
    ``Counters``."""

    def __init__(
        self,
        counters: Counters,
        per_client: int,
        idle_seconds: float,
        unauthenticated: int = 32,
        api_key: str = "",
        grace: float = UNAUTHENTICATED_GRACE_SECONDS,
    ) -> None:
        self.counters = counters
        self.per_client = per_client
        self.idle_seconds = idle_seconds
        self.unauthenticated = unauthenticated
        self.grace = grace
        self._key = api_key.encode()
        self._open: Counter[str] = Counter()
        # unauthenticated connections, oldest first: all of them, and by client address
        self._waiting: dict[TransportAwareProtocol, float] = {}
        self._waiting_by_host: dict[str, dict[TransportAwareProtocol, None]] = {}
        self._trim_timer: asyncio.TimerHandle | None = None

    def admit(self, conn: TransportAwareProtocol, host: str, now: float) -> bool:
        if self._open[host] >= self.per_client:
            same_host = self._waiting_by_host.get(host)
            if not same_host:  # every connection of this address has shown the key
                self.counters.connections_refused += 1
                return False
            self._push_out(next(iter(same_host)))
        self._open[host] += 1
        self._waiting[conn] = now
        self._waiting_by_host.setdefault(host, {})[conn] = None
        self.counters.connections_opened += 1
        self.counters.connections_open += 1
        self.trim(conn.loop)
        return True

    def shows_key(self, headers: list[tuple[bytes, bytes]]) -> bool:
        """Whether a request's headers carry the API key (compared in constant time)."""
        for name, value in headers:
            if name.lower() == b"x-api-key":
                return bool(self._key) and hmac.compare_digest(value, self._key)
        return False

    def promote(self, conn: TransportAwareProtocol, host: str) -> None:
        """``conn`` has shown the key: it leaves the unauthenticated budget for good."""
        if self._waiting.pop(conn, None) is not None:
            self._forget(conn, host)

    def release(self, conn: TransportAwareProtocol, host: str) -> None:
        if self._waiting.pop(conn, None) is not None:
            self._forget(conn, host)
        self._open[host] -= 1
        if self._open[host] <= 0:
            del self._open[host]
        self.counters.connections_open -= 1

    def trim(self, loop: asyncio.AbstractEventLoop) -> None:
        """Close the oldest unauthenticated connections past their grace while there are more
        than the budget; come back when the oldest one's grace ends if it has not yet."""
        if self._trim_timer is not None:
            self._trim_timer.cancel()
            self._trim_timer = None
        while len(self._waiting) > self.unauthenticated:
            oldest, since = next(iter(self._waiting.items()))
            wait = since + self.grace - loop.time()
            if wait > 0:
                self._trim_timer = loop.call_later(wait, self.trim, loop)
                return
            self._push_out(oldest)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def _push_out(self, conn: TransportAwareProtocol) -> None:
        self.counters.connections_refused += 1
        host = conn.peer or ""
        if self._waiting.pop(conn, None) is not None:
            self._forget(conn, host)
        conn.transport.abort()  # connection_lost releases its slot

    def _forget(self, conn: TransportAwareProtocol, host: str) -> None:
        same_host = self._waiting_by_host.get(host)
        if same_host is not None:
            same_host.pop(conn, None)
            if not same_host:
                del self._waiting_by_host[host]


class TransportAwareProtocol(H11Protocol):
    """h11 protocol that lends each request its connection's transport, so the fault
    injector can reset the TCP connection or truncate a response mid-body, and that holds
    every connection to the ``ConnectionGuard``'s bounds."""

    def __init__(self, *args: Any, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.guard = guard
        self.peer: str | None = None  # set once admitted
        self._authenticated = False
        self._last_read = 0.0
        self._idle: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        peer = self.client[0] if self.client else ""
        if not self.guard.admit(self, peer, self.loop.time()):
            transport.abort()
            return
        self.peer = peer
        self._last_read = self.loop.time()
        self._idle = self.loop.call_later(self.guard.idle_seconds, self._close_if_idle)
        # room for a few output frames in flight, so big streams are not ping-ponged frame by frame
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH)
        inner = self.config.loaded_app
        connection = next(_CONNECTIONS)

        async def app(scope: Any, receive: Any, send: Any) -> None:
            if not self._authenticated and self.guard.shows_key(scope.get("headers", [])):
                self._authenticated = True
                self.guard.promote(self, peer)
            extensions = scope.setdefault("extensions", {})
            extensions[TRANSPORT_KEY] = transport
            extensions[CONNECTION_KEY] = connection
            await inner(scope, receive, send)

        self.app = app

    def data_received(self, data: bytes) -> None:
        self._last_read = self.loop.time()
        super().data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        if self.peer is not None:
            self.guard.release(self, self.peer)
            self.peer = None
        super().connection_lost(exc)

    def _close_if_idle(self) -> None:
        self._idle = None
        if self.transport.is_closing():
            return
        busy = self.cycle is not None and not self.cycle.response_complete
        quiet = self.loop.time() - self._last_read
        if busy or quiet < self.guard.idle_seconds:
            wait = self.guard.idle_seconds - quiet if not busy else self.guard.idle_seconds
            self._idle = self.loop.call_later(max(wait, 0.05), self._close_if_idle)
            return
        log.info("closing a connection of %s idle for %.0f s", self.peer, quiet)
        self.transport.close()


class ControlPlaneServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, plane: Plane) -> None:
        super().__init__(config)
        self.plane = plane

    def handle_exit(self, sig: int, frame: Any) -> None:
        # kill guests first, so in-flight execs end now instead of holding the shutdown open
        self.plane.runner.kill_all()
        super().handle_exit(sig, frame)
        # uvicorn re-raises the signal after its graceful shutdown, which would kill us before
        # __main__ removes the temporary state dir: a signalled shutdown is a clean exit here
        captured = getattr(self, "_captured_signals", None)
        if isinstance(captured, list):
            captured.clear()


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


def serve(config: ServerConfig) -> None:
    plane = Plane(config)
    app = build_app(plane)
    sock = bind_socket(config.host, config.port)
    port = sock.getsockname()[1]
    scheme = "https" if config.tls_cert else "http"
    url = f"{scheme}://{config.host if ':' not in config.host else f'[{config.host}]'}:{port}"
    if config.port_file is not None:
        tmp = config.port_file.with_suffix(".tmp")
        tmp.write_text(f"{port}\n")
        tmp.replace(config.port_file)
    logging.getLogger("createos.local").warning(
        "createos-local listening on %s (state: %s)%s",
        url,
        config.state_dir,
        " with HTTP/2" if config.http2 else "",
    )
    print(f"createos-local listening on {url}", flush=True)
    if config.http2:
        _serve_http2(config, plane, app, sock)
        return
    guard = ConnectionGuard(
        plane.counters,
        config.max_connections_per_client,
        config.idle_connection_seconds,
        unauthenticated=config.max_unauthenticated_connections,
        api_key=config.api_key,
    )
    plane.connection_guard = guard
    uv_config = uvicorn.Config(
        app,
        http=functools.partial(TransportAwareProtocol, guard=guard),  # type: ignore[arg-type]
        lifespan="on",
        log_level=config.log_level,
        access_log=config.log_level in ("debug", "trace"),
        timeout_graceful_shutdown=3,
        timeout_keep_alive=30,
        ssl_certfile=str(config.tls_cert) if config.tls_cert else None,
        ssl_keyfile=str(config.tls_key) if config.tls_key else None,
    )
    ControlPlaneServer(uv_config, plane).run(sockets=[sock])


def _serve_http2(config: ServerConfig, plane: Plane, app: Any, sock: socket.socket) -> None:
    """HTTP/2 (ALPN h2, HTTP/1.1 still offered) over TLS with hypercorn, for clients that
    multiplex. Connection-level faults need uvicorn's HTTP/1.1 transport: here a reset before
    the answer comes out as HTTP 500, and a cut body leaves the stream open (the client's
    deadline ends it)."""
    from hypercorn.asyncio import serve as hypercorn_serve
    from hypercorn.config import Config as HypercornConfig

    hc = HypercornConfig()
    hc.bind = [f"fd://{sock.fileno()}"]
    hc.certfile = str(config.tls_cert)
    hc.keyfile = str(config.tls_key)
    hc.alpn_protocols = ["h2", "http/1.1"]
    hc.graceful_timeout = 3.0
    hc.keep_alive_timeout = 30.0
    hc.loglevel = config.log_level.upper()
    hc.accesslog = "-" if config.log_level in ("debug", "trace") else None

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)

        async def shutdown_trigger() -> None:
            await stop.wait()
            plane.runner.kill_all()  # in-flight execs end now instead of holding shutdown open

        await hypercorn_serve(app, hc, shutdown_trigger=shutdown_trigger)

    asyncio.run(main())
