"""Request accounting for ``/_local/stats`` and the ``X-Request-Id`` header on every response."""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .faults import CONNECTION_KEY

# the HTTP/2 server names a connection only by its client's (address, port): the most recent
# ones are remembered to tell a new connection from another request on a known one
RECENT_PEERS = 4096


@dataclass
class Counters:
    requests: Counter[str] = field(default_factory=Counter)
    statuses: Counter[str] = field(default_factory=Counter)
    http_versions: Counter[str] = field(default_factory=Counter)
    bytes_sent: int = 0
    # HTTP/1.1: counted by the connection guard as connections are accepted and closed
    connections_opened: int = 0
    connections_open: int = 0
    # closed by a budget: refused on arrival, or pushed out for a newer one (never one with the key)
    connections_refused: int = 0
    _recent_peers: dict[object, None] = field(default_factory=dict)

    def saw_peer(self, peer: object) -> None:
        """HTTP/2 server: count a (address, port) not among the recent ones as a connection."""
        if peer in self._recent_peers:
            return
        self.connections_opened += 1
        self._recent_peers[peer] = None
        if len(self._recent_peers) > RECENT_PEERS:
            del self._recent_peers[next(iter(self._recent_peers))]


class StatsMiddleware:
    """Outermost middleware: names the route, counts it, tags the response with a request id."""

    def __init__(self, app: ASGIApp, counters: Counters, classify: Callable[[Scope], str]) -> None:
        self.app = app
        self.counters = counters
        self.classify = classify

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = self.classify(scope)
        scope["createos.route"] = route
        counters = self.counters
        counters.requests[route] += 1
        counters.http_versions[str(scope.get("http_version", "?"))] += 1
        client = scope.get("client")
        if CONNECTION_KEY not in scope.get("extensions", {}) and client:
            counters.saw_peer((client[0], client[1]))
        request_id = f"req-{secrets.token_hex(8)}"
        scope["createos.request_id"] = request_id

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"]
                headers.append((b"x-request-id", request_id.encode()))
                message = {**message, "headers": headers}
                counters.statuses[str(message["status"])] += 1
            elif message["type"] == "http.response.body":
                counters.bytes_sent += len(message.get("body", b""))
            await send(message)

        await self.app(scope, receive, counting_send)
