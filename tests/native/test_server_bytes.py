"""Bytes a server decides, read by the native client: header lines (bounded copies, never
read past the line libcurl hands over; csrc/headers.c, fuzzed by csrc/fuzz/fuzz_headers.c)
and JSON object keys holding NUL. A small HTTP server on loopback answers each request
with the raw bytes a test gives it."""

from __future__ import annotations

import pytest

from langflow_sandbox_createos import _createos as E

from .rawserver import RawServer

KEY = "sk-server-bytes-test-key"


def answer(status: str, headers: list[str], body: bytes) -> bytes:
    head = [f"HTTP/1.1 {status}", *headers, f"Content-Length: {len(body)}", "Connection: close"]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def test_json_values_from_the_server_keep_embedded_nul(server: RawServer) -> None:
    server.response = answer(
        "200 OK",
        ["Content-Type: application/json"],
        b'{"status":"success","data":{"id":"sb-1","note":"v\\u0000w","status":"running"}}',
    )
    with E.Client(server.url, KEY, control_timeout=5) as client:
        row = client.get("sb-1")
    assert row["note"] == "v\x00w"


def test_a_json_key_from_the_server_with_nul_is_refused_not_cut(server: RawServer) -> None:
    """jansson cannot hold NUL in an object key: the answer is refused, never read as "a"."""
    server.response = answer(
        "200 OK",
        ["Content-Type: application/json"],
        b'{"status":"success","data":{"id":"sb-1","a\\u0000b":"v","status":"running"}}',
    )
    with (
        E.Client(server.url, KEY, control_timeout=5) as client,
        pytest.raises(E.ProtocolError, match="not valid JSON"),
    ):
        client.get("sb-1")


def test_hostile_header_values_stay_bounded(server: RawServer) -> None:
    server.response = answer(
        "429 Too Many Requests",
        ["X-Request-Id: " + "r" * 5000, "Retry-After: 1e300", "X-Fc-Request-Id: ignored"],
        b'{"status":"error","message":"slow down"}',
    )
    with E.Client(server.url, KEY, control_timeout=5) as client, pytest.raises(E.TransientError) as info:
        client.get("sb-1")
    err = info.value
    assert err.status == 429
    assert err.request_id is not None and err.request_id.startswith("r" * 100) and len(err.request_id) < 256
    assert err.retry_after is None  # not a delay anyone could wait: ignored, not wrapped around


def test_retry_after_as_a_far_date_is_capped(server: RawServer) -> None:
    server.response = answer(
        "503 Service Unavailable",
        ["Retry-After: Fri, 31 Dec 9999 23:59:59 GMT"],
        b'{"status":"error","message":"later"}',
    )
    with E.Client(server.url, KEY, control_timeout=5) as client, pytest.raises(E.TransientError) as info:
        client.get("sb-1")
    assert info.value.retry_after is not None and 0 < info.value.retry_after <= 1e9


def test_a_negative_content_length_is_not_a_length(server: RawServer) -> None:
    """'-1' is not digits: it is not read as 2**64 - 1 (libcurl refuses the response)."""
    server.response = b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\nConnection: close\r\n\r\n{}"
    with E.Client(server.url, KEY, control_timeout=5) as client, pytest.raises(E.CreateOSError) as info:
        client.download("sb-1", "/workspace/x", max_bytes=10)
    assert "too_large" not in str(getattr(info.value, "code", ""))
