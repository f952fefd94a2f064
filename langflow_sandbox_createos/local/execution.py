"""Exec, buffered (one JSON result) and streaming (NDJSON frames), spec sections 8.2-8.3."""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from .faults import wait_for_disconnect
from .jailer import ExecRequest, GuestProcess, GuestRunner, GuestStartError
from .store import Sandbox

NDJSON = "application/x-ndjson"


def _frame(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


# printable ASCII except '"' and '\\': bytes that are their own JSON string encoding
_JSON_PLAIN = bytes(range(0x20, 0x7F)).replace(b'"', b"").replace(b"\\", b"")
_JSON_WHITESPACE = b"\n\r\t"


def _output_frame(name: str, chunk: bytes, decoder: codecs.IncrementalDecoder) -> bytes | None:
    """Encode an output chunk as one NDJSON frame; None when nothing is decodable yet.

    Plain ASCII output (the common case, and what makes 1 GiB outputs feasible) is framed with
    C-level byte operations; anything else goes through the UTF-8 decoder and json.
    """
    if decoder.getstate()[0] == b"":
        rest = chunk.translate(None, _JSON_PLAIN)
        if not rest.translate(None, _JSON_WHITESPACE):
            if rest:
                chunk = chunk.replace(b"\n", b"\\n").replace(b"\r", b"\\r").replace(b"\t", b"\\t")
            return b'{"' + name.encode() + b'":"' + chunk + b'"}\n'
    text = decoder.decode(chunk)
    return _frame({name: text}) if text else None


def _decoders() -> dict[str, codecs.IncrementalDecoder]:
    # invalid UTF-8 from the guest becomes U+FFFD; a character split across chunks survives
    return {name: codecs.getincrementaldecoder("utf-8")(errors="replace") for name in ("stdout", "stderr")}


async def _start(runner: GuestRunner, sb: Sandbox, req: ExecRequest, stdin: bytes | None) -> GuestProcess:
    guest = await runner.start(req, stdin)
    sb.processes.add(guest)
    return guest


async def _until_disconnect(work: Awaitable[Any], receive: Receive) -> tuple[bool, Any]:
    """Run ``work``; if the client goes away first, cancel it. Returns (finished, result)."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(wait_for_disconnect(receive))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if task.done():
        return True, task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    return False, None


async def run_buffered(
    runner: GuestRunner, sb: Sandbox, req: ExecRequest, stdin: bytes | None, cap: int, receive: Receive
) -> dict[str, Any] | None:
    """The buffered exec result, or None when the client disconnected (the guest is killed)."""
    started = time.monotonic()
    try:
        guest = await _start(runner, sb, req, stdin)
    except GuestStartError as exc:
        result = {"stdout": "", "stderr": "", "exit_code": 0, "error": str(exc)}
        return {"result": result, "exec_ms": round((time.monotonic() - started) * 1000, 3)}

    buffers = {"stdout": bytearray(), "stderr": bytearray()}
    dropped = {"stdout": 0, "stderr": 0}

    async def collect() -> int:
        while (item := await guest.next_chunk()) is not None:
            name, chunk = item
            room = cap - len(buffers[name])
            buffers[name] += chunk[: max(room, 0)]
            dropped[name] += max(len(chunk) - max(room, 0), 0)
        return await guest.wait()

    try:
        finished, exit_code = await _until_disconnect(collect(), receive)
    finally:
        await guest.close()
        sb.processes.discard(guest)
    if not finished:
        return None
    stderr = buffers["stderr"].decode(errors="replace")
    for name, count in dropped.items():
        if count:
            stderr += (
                f"\n[createos-local: {name} truncated, {count} bytes over the {cap}-byte buffer dropped]\n"
            )
    result = {"stdout": buffers["stdout"].decode(errors="replace"), "stderr": stderr, "exit_code": exit_code}
    return {"result": result, "exec_ms": round((time.monotonic() - started) * 1000, 3)}


class ExecStreamResponse(Response):
    """NDJSON frames as the guest produces output; heartbeats while it is silent.

    A client disconnect cancels the pump and kills the guest command.
    """

    media_type = NDJSON

    def __init__(
        self,
        runner: GuestRunner,
        sb: Sandbox,
        req: ExecRequest,
        stdin: bytes | None,
        heartbeat_seconds: float,
    ) -> None:
        super().__init__(
            content=None, status_code=200, media_type=NDJSON, headers={"Cache-Control": "no-store"}
        )
        self.runner = runner
        self.sb = sb
        self.req = req
        self.stdin = stdin
        self.heartbeat_seconds = heartbeat_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        guest: GuestProcess | None = None

        async def emit(payload: dict[str, Any] | bytes) -> None:
            frame = payload if isinstance(payload, bytes) else _frame(payload)
            await send({"type": "http.response.body", "body": frame, "more_body": True})

        async def pump() -> None:
            nonlocal guest
            try:
                guest = await _start(self.runner, self.sb, self.req, self.stdin)
            except GuestStartError as exc:
                await emit({"error": str(exc)})
                await emit({"exit_code": 0})
                return
            await self._relay(guest, emit)

        try:
            finished, _ = await _until_disconnect(pump(), receive)
        finally:
            if guest is not None:
                await guest.close()
                self.sb.processes.discard(guest)
        if finished:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _relay(
        self, guest: GuestProcess, emit: Callable[[dict[str, Any] | bytes], Awaitable[None]]
    ) -> None:
        decoders = _decoders()
        last_frame = time.monotonic()
        while True:
            wait = max(self.heartbeat_seconds - (time.monotonic() - last_frame), 0.0)
            try:
                item = await asyncio.wait_for(guest.next_chunk(), timeout=wait)
            except asyncio.TimeoutError:
                await emit({"hb": True})
                last_frame = time.monotonic()
                continue
            if item is None:
                break
            name, chunk = item
            frame = _output_frame(name, chunk, decoders[name])
            if frame is not None:
                await emit(frame)
                last_frame = time.monotonic()
        for name, decoder in decoders.items():
            tail = decoder.decode(b"", final=True)
            if tail:
                await emit({name: tail})
        await emit({"exit_code": await guest.wait()})
