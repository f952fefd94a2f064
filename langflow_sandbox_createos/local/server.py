"""Running the app on uvicorn: a bound loopback socket, a port file, clean guest teardown."""

from __future__ import annotations

import asyncio
import itertools
import logging
import signal
import socket
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from .app import Plane, build_app
from .config import ServerConfig
from .faults import CONNECTION_KEY, TRANSPORT_KEY

WRITE_BUFFER_HIGH = 1024 * 1024
# Numbers each accepted connection: a client's (address, port) is not enough to tell two
# connections apart, since a busy machine reuses its ephemeral ports.
_CONNECTIONS = itertools.count(1)


class TransportAwareProtocol(H11Protocol):
    """h11 protocol that lends each request its connection's transport, so the fault
    injector can reset the TCP connection or truncate a response mid-body."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # room for a few output frames in flight, so big streams are not ping-ponged frame by frame
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH)
        inner = self.config.loaded_app
        connection = next(_CONNECTIONS)

        async def app(scope: Any, receive: Any, send: Any) -> None:
            extensions = scope.setdefault("extensions", {})
            extensions[TRANSPORT_KEY] = transport
            extensions[CONNECTION_KEY] = connection
            await inner(scope, receive, send)

        self.app = app


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
    uv_config = uvicorn.Config(
        app,
        http=TransportAwareProtocol,
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
