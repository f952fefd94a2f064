"""Buffered exec (a control plane without streaming exec) is one JSON document, parsed whole
before max_output_bytes can cut anything: its body is capped at the parser's 64 MiB whatever
max_output_bytes allows, and refused as soon as it passes (from a Content-Length before any
body byte, else at the cap), as ProtocolError with code "too_large" (issue 42). At ac8509d a
max_output_bytes of 100 MiB let the client read a 400 MiB body, all of it, and then the parser
refused anything over 64 MiB ("response body too large"). A scripted control plane on loopback
(rawserver.py) answers the streaming exec with 404 and the buffered one with 66 MiB of stdout."""

from __future__ import annotations

import json

import pytest

from langflow_sandbox_createos import _createos as E

from .rawserver import RawServer, Request, answer

KEY = "sk-buffered-cap-test-key"
MiB = 1 << 20
CAP = 64 * MiB


def buffered_body() -> bytes:
    result = {"result": {"stdout": "x" * (66 * MiB), "stderr": "", "exit_code": 0}, "exec_ms": 1}
    return json.dumps({"status": "success", "data": result}).encode()


def no_streaming(req: Request) -> bytes | None:
    if "stream=true" in req.target:
        return answer("404 Not Found", ["Content-Type: application/json"],
                      b'{"status":"fail","data":{"message":"no streaming"}}')  # fmt: skip
    return None


@pytest.fixture(scope="module")
def body() -> bytes:
    return buffered_body()


def run_buffered(server: RawServer) -> tuple[E.ProtocolError, int]:
    with E.Client(server.url, KEY, control_timeout=30) as client:
        with pytest.raises(E.ProtocolError) as info:
            client.exec("sb-1", "yes", timeout=30, max_output_bytes=100 * MiB)
        received = client.stats()["bytes_received"]
    return info.value, received


def test_a_declared_body_over_the_cap_is_refused_before_it_is_read(server: RawServer, body: bytes) -> None:
    """Fails on ac8509d: the whole 66 MiB body was read, then refused by the parser."""
    server.response = lambda req: (
        no_streaming(req) or answer("200 OK", ["Content-Type: application/json"], body)
    )
    exc, received = run_buffered(server)
    assert exc.code == "too_large", exc
    assert "no streaming exec" in str(exc) and "nothing was read" in str(exc)
    assert received < MiB, received  # the 404's body, not a byte of the answer


def test_an_undeclared_body_is_cut_off_at_the_cap(server: RawServer, body: bytes) -> None:
    """The same answer without a Content-Length (read until the connection closes): the client
    stops reading at 64 MiB. Fails on ac8509d (66 MiB read)."""

    def respond(req: Request) -> bytes:
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"
        return no_streaming(req) or head + body

    server.response = respond
    exc, received = run_buffered(server)
    assert exc.code == "too_large", exc
    assert "the transfer was stopped there" in str(exc)
    assert CAP <= received < CAP + MiB, received


def test_a_buffered_answer_under_the_cap_keeps_max_output_bytes(server: RawServer) -> None:
    """Within the cap, max_output_bytes still cuts each stream, with its note."""
    result = {"result": {"stdout": "y" * (3 * MiB), "stderr": "e", "exit_code": 0}, "exec_ms": 1}
    data = json.dumps({"status": "success", "data": result}).encode()
    server.response = lambda req: (
        no_streaming(req) or answer("200 OK", ["Content-Type: application/json"], data)
    )
    with E.Client(server.url, KEY, control_timeout=30) as client:
        r = client.exec("sb-1", "yes", timeout=30, max_output_bytes=MiB)
    assert (r.streamed, r.exit_code, r.stderr) == (False, 0, "e")
    assert r.stdout == "y" * MiB and r.stdout_truncated and not r.stderr_truncated
