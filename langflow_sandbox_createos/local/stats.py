"""Request accounting for ``/_local/stats`` and the ``X-Request-Id`` header on every response."""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .faults import CONNECTION_KEY


@dataclass
class Counters:
    requests: Counter[str] = field(default_factory=Counter)
    statuses: Counter[str] = field(default_factory=Counter)
    # one entry per connection: the server's number for it (HTTP/1.1), else the client's
    # (address, port), which a busy machine may reuse for a later connection (HTTP/2 server)
    connections: set[object] = field(default_factory=set)
    http_versions: Counter[str] = field(default_factory=Counter)
    bytes_sent: int = 0

    @property
    def connections_opened(self) -> int:
        return len(self.connections)


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
        connection = scope.get("extensions", {}).get(CONNECTION_KEY)
        client = scope.get("client")
        if connection is not None:
            counters.connections.add(connection)
        elif client:
            counters.connections.add((client[0], client[1]))
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
