"""Runtime fault injection (``/_local/faults``): latency, forced statuses, broken bodies,
connection resets, hangs and slow drips, per route name.

Body accepted by ``PUT /_local/faults`` (every key optional)::

    {"latency_ms": 0, "boot_delay_ms": 0, "streaming": true,
     "rules": [{"route": "create" | "*", "status": 429, "retry_after": 2,
                "body": "non-json" | "truncated" | "wrong-envelope" | "reflect-headers",
                "reset": true, "after_bytes": 100, "hang": true, "drip_bytes_per_sec": 10,
                "latency_ms": 25, "times": 1, "probability": 0.5, "drop_exit": true}]}

``drop_exit`` (``exec_stream``): the stream ends cleanly without its ``exit_code`` frame, as when
the guest agent dies mid-command.

Every answer also carries ``"hits"``: how many requests each rule fired on, one count per rule in
the order it was PUT (a rule spent by ``times`` keeps its count), so a test can tell that the
fault it set really happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
from dataclasses import dataclass, field
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .envelope import ApiError, bad_request, dumps

ROUTE_NAMES = frozenset(
    {
        "healthz",
        "readyz",
        "whoami",
        "shapes",
        "rootfs",
        "templates",
        "create",
        "list",
        "get",
        "patch",
        "delete",
        "pause",
        "resume",
        "fork",
        "resize",
        "egress_get",
        "egress_put",
        "files_put",
        "files_get",
        "exec",
        "exec_stream",
    }
)
BODY_KINDS = frozenset({"non-json", "truncated", "wrong-envelope", "reflect-headers"})
TRANSPORT_KEY = "createos.transport"
# A number per TCP connection (HTTP/1.1 server), for /_local/stats' connection count.
CONNECTION_KEY = "createos.connection"
_MESSAGES = {
    400: "injected bad request",
    402: "insufficient credit",
    403: "quota exceeded",
    404: "not found",
    409: "conflict",
    429: "rate limited",
    500: "injected server fault",
    502: "bad gateway",
    503: "no host with capacity",
    504: "gateway timeout",
}


@dataclass
class FaultRule:
    route: str = "*"
    status: int | None = None
    retry_after: int | str | None = None
    body: str | None = None
    reset: bool = False
    after_bytes: int | None = None
    hang: bool = False
    drip_bytes_per_sec: int | None = None
    latency_ms: int = 0
    times: int | None = None
    probability: float = 1.0
    drop_exit: bool = False
    index: int = 0  # its place in the set as PUT (for FaultSet.hits); not part of the JSON

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"route": self.route}
        for key in ("status", "retry_after", "body", "after_bytes", "drip_bytes_per_sec", "times"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        for key in ("reset", "hang", "drop_exit"):
            if getattr(self, key):
                out[key] = True
        if self.latency_ms:
            out["latency_ms"] = self.latency_ms
        if self.probability != 1.0:
            out["probability"] = self.probability
        return out

    @property
    def terminal(self) -> bool:
        """Whether the rule answers instead of the real route."""
        return bool((self.reset and self.after_bytes is None) or self.hang or self.status or self.body)


def _int(raw: dict[str, Any], key: str, low: int = 0, high: int = 10**9) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise bad_request(f"{key} must be an integer between {low} and {high}", key)
    return value


def parse_rule(raw: Any) -> FaultRule:
    if not isinstance(raw, dict):
        raise bad_request("each rule must be an object", "rules")
    known = set(FaultRule.__dataclass_fields__) - {"index"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise bad_request(f"unknown rule keys: {', '.join(unknown)}", "rules")
    route = raw.get("route", "*")
    if route != "*" and route not in ROUTE_NAMES:
        raise bad_request(
            f"unknown route {route!r}; use one of {', '.join(sorted(ROUTE_NAMES))} or *", "route"
        )
    body = raw.get("body")
    if body is not None and body not in BODY_KINDS:
        raise bad_request(f"body must be one of {', '.join(sorted(BODY_KINDS))}", "body")
    retry_after = raw.get("retry_after")
    if retry_after is not None and not isinstance(retry_after, (int, str)):
        raise bad_request("retry_after must be delta-seconds or an HTTP-date", "retry_after")
    probability = raw.get("probability", 1.0)
    if (
        isinstance(probability, bool)
        or not isinstance(probability, (int, float))
        or not 0 <= probability <= 1
    ):
        raise bad_request("probability must be a number between 0 and 1", "probability")
    return FaultRule(
        route=route,
        status=_int(raw, "status", 100, 599),
        retry_after=retry_after,
        body=body,
        reset=bool(raw.get("reset", False)),
        after_bytes=_int(raw, "after_bytes"),
        hang=bool(raw.get("hang", False)),
        drop_exit=bool(raw.get("drop_exit", False)),
        drip_bytes_per_sec=_int(raw, "drip_bytes_per_sec", 1),
        latency_ms=_int(raw, "latency_ms", 0, 600_000) or 0,
        times=_int(raw, "times", 1),
        probability=float(probability),
    )


@dataclass
class FaultSet:
    latency_ms: int = 0
    boot_delay_ms: int = 0
    streaming: bool | None = None  # None: as configured on the command line
    rules: list[FaultRule] = field(default_factory=list)
    # requests each rule fired on, by its index as PUT (kept when `times` removes the rule)
    hits: list[int] = field(default_factory=list)

    @classmethod
    def parse(cls, raw: Any) -> FaultSet:
        if not isinstance(raw, dict):
            raise bad_request("the fault set must be a JSON object")
        # "hits" is read-only: accepted (and ignored) so that what GET answered can be PUT back
        unknown = sorted(set(raw) - {"latency_ms", "boot_delay_ms", "streaming", "rules", "hits"})
        if unknown:
            raise bad_request(f"unknown fault keys: {', '.join(unknown)}")
        rules = raw.get("rules") or []
        if not isinstance(rules, list):
            raise bad_request("rules must be a list", "rules")
        streaming = raw.get("streaming")
        if streaming is not None and not isinstance(streaming, bool):
            raise bad_request("streaming must be a boolean", "streaming")
        parsed = [parse_rule(r) for r in rules]
        for index, rule in enumerate(parsed):
            rule.index = index
        return cls(
            latency_ms=_int(raw, "latency_ms", 0, 600_000) or 0,
            boot_delay_ms=_int(raw, "boot_delay_ms", 0, 600_000) or 0,
            streaming=streaming,
            rules=parsed,
            hits=[0] * len(parsed),
        )

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "latency_ms": self.latency_ms,
            "boot_delay_ms": self.boot_delay_ms,
            "rules": [r.as_json() for r in self.rules],
            "hits": list(self.hits),
        }
        if self.streaming is not None:
            out["streaming"] = self.streaming
        return out

    def match(self, route: str) -> list[FaultRule]:
        """Rules that fire for this request, in order, up to the first one that answers."""
        fired: list[FaultRule] = []
        for rule in list(self.rules):
            if rule.route not in ("*", route):
                continue
            if rule.probability < 1.0 and random.random() >= rule.probability:
                continue
            if rule.times is not None:
                rule.times -= 1
                if rule.times <= 0:
                    self.rules.remove(rule)
            fired.append(rule)
            self.hits[rule.index] += 1
            if rule.terminal:
                break
        return fired


def abort_connection(scope: Scope, graceful: bool = False) -> bool:
    """Drop the TCP connection: with a RST, or (``graceful``) a FIN after what was already sent."""
    transport = scope.get("extensions", {}).get(TRANSPORT_KEY)
    if transport is None:
        return False
    if graceful:
        transport.close()
        return True
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()
    return True


async def wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class FaultMiddleware:
    """Applies the current :class:`FaultSet` to every non-admin request."""

    def __init__(self, app: ASGIApp, state: Any) -> None:
        self.app = app
        self.state = state  # has .faults: FaultSet

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = scope.get("createos.route", "")
        if scope["type"] != "http" or route not in ROUTE_NAMES:
            await self.app(scope, receive, send)
            return
        faults: FaultSet = self.state.faults
        rules = faults.match(route)
        latency = faults.latency_ms + sum(r.latency_ms for r in rules)
        if latency:
            await asyncio.sleep(latency / 1000)
        answer = next((r for r in rules if r.terminal), None)
        if answer is not None:
            await self._answer(answer, scope, receive, send)
            return
        for rule in rules:
            if rule.drip_bytes_per_sec:
                send = _dripping(send, rule.drip_bytes_per_sec)
            if rule.reset and rule.after_bytes is not None:
                send = _resetting(send, scope, rule.after_bytes)
            if rule.drop_exit:
                send = _dropping_exit(send)
        await self.app(scope, receive, send)

    async def _answer(self, rule: FaultRule, scope: Scope, receive: Receive, send: Send) -> None:
        if rule.reset:
            if not abort_connection(scope):
                raise ConnectionResetError("injected reset")
            return
        if rule.hang:
            await wait_for_disconnect(receive)
            return
        status, headers, body = self._synthesize(rule, scope)
        if rule.drip_bytes_per_sec:
            send = _dripping(send, rule.drip_bytes_per_sec)
        if rule.body == "truncated":
            headers.append((b"content-length", str(len(body) + 1024).encode()))
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body[: len(body) // 2], "more_body": True})
            if not abort_connection(scope, graceful=True):
                raise ConnectionResetError("injected truncation")
            return
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _synthesize(self, rule: FaultRule, scope: Scope) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        headers: list[tuple[bytes, bytes]] = []
        if rule.retry_after is not None:
            headers.append((b"retry-after", str(rule.retry_after).encode()))
        json_type = (b"content-type", b"application/json")
        if rule.body == "non-json":
            status = rule.status or 502
            headers.append((b"content-type", b"text/html; charset=utf-8"))
            return status, headers, f"<html><body><h1>{status} Bad Gateway</h1></body></html>\n".encode()
        if rule.body == "wrong-envelope":
            headers.append(json_type)
            return rule.status or 200, headers, dumps({"ok": True, "result": {"id": "sb-wrong-envelope"}})
        if rule.body == "truncated":
            headers.append(json_type)
            payload = {"status": "success", "data": {"id": "sb-truncated", "padding": "x" * 256}}
            return rule.status or 200, headers, dumps(payload)
        if rule.body == "reflect-headers":
            seen = "; ".join(f"{k.decode('latin-1')}: {v.decode('latin-1')}" for k, v in scope["headers"])
            headers.append(json_type)
            status = rule.status or 500
            return (
                status,
                headers,
                dumps({"status": "error", "message": f"request headers: {seen}", "code": status}),
            )
        status = rule.status or 500
        response = ApiError(status, _MESSAGES.get(status, "injected fault"), "injected_fault").response()
        headers.append(json_type)
        return status, headers, bytes(response.body)


def _dripping(send: Send, rate: int) -> Send:
    step = max(1, rate // 10)

    async def dripping_send(message: Message) -> None:
        if message["type"] != "http.response.body" or not message.get("body"):
            await send(message)
            return
        body: bytes = message["body"]
        more = message.get("more_body", False)
        for start in range(0, len(body), step):
            piece = body[start : start + step]
            last = start + step >= len(body)
            await send({"type": "http.response.body", "body": piece, "more_body": more or not last})
            await asyncio.sleep(len(piece) / rate)

    return dripping_send


def _dropping_exit(send: Send) -> Send:
    """Swallow the stream's exit_code frame (each frame is one body message)."""

    async def dropping_send(message: Message) -> None:
        if message["type"] == "http.response.body" and message.get("body", b"").startswith(b'{"exit_code"'):
            return
        await send(message)

    return dropping_send


def _resetting(send: Send, scope: Scope, after_bytes: int) -> Send:
    sent = 0
    dead = False

    async def resetting_send(message: Message) -> None:
        nonlocal sent, dead
        if dead:
            return
        if message["type"] == "http.response.body":
            body: bytes = message.get("body", b"")
            if sent + len(body) >= after_bytes:
                head = body[: after_bytes - sent]
                if head:
                    await send({"type": "http.response.body", "body": head, "more_body": True})
                await asyncio.sleep(0.05)
                dead = True
                abort_connection(scope)
                return
            sent += len(body)
        await send(message)

    return resetting_send
