"""Server and guest text on its way to Python goes through one sanitizer (csrc/common.c,
cos_sanitize): the API key is redacted whole or in part and in any case, control characters
are escaped (no log injection), and the text is valid UTF-8 by construction. A small HTTP
server on loopback plays a control plane that reflects the request's headers."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from langflow_sandbox_createos import _createos as E

from .rawserver import RawServer, Request, answer

KEY = "sk-Live-ReflectMe-0123456789-abcdefXYZ"
JSON = ["Content-Type: application/json"]


def reflected(req: Request) -> str:
    """What a careless agent puts in its error: the request's headers, the key upper-cased
    (a proxy that normalises header values), ESC sequences and a forged log line."""
    seen = "; ".join(f"{k}: {v}" for k, v in req.headers)
    return (
        f"could not start: request headers: {seen}\x1b[2J\r\n"
        f"ERROR forged log line key={KEY.upper()} tail={KEY[5:17].lower()}\x07"
    )


def leaks(text: str) -> list[str]:
    """Every run of 8 characters of the key found in text, whatever the case."""
    low = text.lower()
    return [KEY[i : i + 8] for i in range(len(KEY) - 7) if KEY[i : i + 8].lower() in low]


def control_chars(text: str) -> list[str]:
    return [c for c in text if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 or c in "\u2028\u2029"]


def plane(req: Request) -> bytes:
    if req.method == "POST" and req.target.endswith("/exec?stream=true"):
        frames = [{"stdout": "started\n"}, {"error": reflected(req)}, {"exit_code": 127}]
        body = "".join(json.dumps(f) + "\n" for f in frames).encode()
        return answer("200 OK", ["Content-Type: application/x-ndjson"], body)
    if req.method == "POST" and req.target.endswith("/exec"):
        result = {"stdout": "", "stderr": "", "exit_code": 127, "error": reflected(req)}
        return answer("200 OK", JSON, json.dumps({"status": "success", "data": {"result": result}}).encode())
    if req.target.startswith("/v1/sandboxes/sb-1"):  # resume (POST .../resume, then GET polls)
        state = f"{req.header('X-Api-Key')}\x1b[31m\r\nforged"
        view = {"id": "sb-1", "status": state}
        return answer("200 OK", JSON, json.dumps({"status": "success", "data": view}).encode())
    return answer("404 Not Found", JSON, b'{"status":"fail","data":{"message":"no route"}}')


@pytest.fixture
def server() -> Iterator[RawServer]:
    s = RawServer(plane)
    try:
        yield s
    finally:
        s.close()


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "buffered"])
def test_reflected_key_in_the_exec_error_is_redacted_and_escaped(server: RawServer, stream: bool) -> None:
    with E.Client(server.url, KEY, control_timeout=10) as c:
        r = c.exec("sb-1", "nosuchcmd", timeout=10, stream=stream)
    assert r.exit_code == 127 and r.streamed is stream
    assert r.error is not None and "x-api-key" in r.error.lower(), r.error
    assert leaks(r.error) == [], r.error
    assert control_chars(r.error) == [], r.error
    assert "[redacted]" in r.error and "forged log line" in r.error
    r.error.encode("utf-8")  # strict: no lone surrogate


def test_reflected_key_in_the_resume_state_is_redacted_and_escaped(server: RawServer) -> None:
    with E.Client(server.url, KEY, control_timeout=10) as c, pytest.raises(E.DeadlineError) as info:
        c.resume("sb-1", wait=0.5)
    text = str(info.value)
    assert "not running after" in text
    assert leaks(text) == [], text
    assert control_chars(text) == [], text


def completing(req: Request) -> bytes:
    """An error whose escape completes a run of the key: ESC is written as `\\x1b`, whose
    last letter, "b", and the 7 characters after it ("cdefXYZ", the key's end) spell 8 of
    the key; the server itself sent only 7 (fuzz_exec_result found this with DEL's "f")."""
    result = {"stdout": "", "stderr": "", "exit_code": 1, "error": f"tail \x1b{KEY[-7:]} end"}
    return answer("200 OK", JSON, json.dumps({"status": "success", "data": {"result": result}}).encode())


def test_an_escape_never_completes_a_run_of_the_key() -> None:
    assert KEY[-8] == "b"  # what the escape of ESC ends with
    server = RawServer(completing)
    try:
        with E.Client(server.url, KEY, control_timeout=10) as c:
            r = c.exec("sb-1", "x", timeout=10, stream=False)
    finally:
        server.close()
    assert r.error is not None and r.error.startswith("tail ") and r.error.endswith(" end"), r.error
    assert leaks(r.error) == [], r.error
    assert control_chars(r.error) == [] and "[redacted]" in r.error, r.error


# Overlong encodings ('/' as C0 AF and E0 80 AF), UTF-16 surrogates (ED A0 80, ED BF BF), a
# code point above U+10FFFF (F4 90 80 80), a lone continuation byte and a truncated sequence.
MALFORMED = b"\xc0\xaf \xe0\x80\xaf \xed\xa0\x80 \xed\xbf\xbf \xf4\x90\x80\x80 \x80 \xe2\x82"


def deleting(req: Request) -> bytes:
    if req.target.endswith("/exec?stream=true"):
        body = b'{"stdout":"hi\\n"}\n{"exit_code":0}\n'
        return answer("200 OK", ["Content-Type: application/x-ndjson"], body)
    if req.method == "DELETE":
        return answer("500 Internal Server Error", ["Content-Type: text/plain"], b"upstream " + MALFORMED)
    return answer("404 Not Found", JSON, b'{"status":"fail","data":{"message":"no route"}}')


@pytest.mark.parametrize("mode", ["background", "wait"])
def test_malformed_utf8_never_loses_delete_outcomes(mode: str) -> None:
    """A failed delete whose error body holds malformed UTF-8: drain_deletes reports it (the
    plugin warns for it) instead of raising UnicodeDecodeError after the outcomes were taken."""
    server = RawServer(deleting)
    try:
        with E.Client(server.url, KEY, control_timeout=10) as c:
            r = c.run_program({}, "echo", ["hi"], sandbox_id="sb-1", timeout=10, delete=mode)
            assert r.stdout == "hi\n" and r.exit_code == 0
            outcomes = c.drain_deletes(timeout=10)
            with pytest.raises(E.TransientError) as info:
                c.delete("sb-1")
    finally:
        server.close()
    assert [(sid, status) for sid, status, _ in outcomes] == [("sb-1", 500)], outcomes
    for text in (outcomes[0][2], str(info.value)):
        assert text is not None and text.startswith("delete failed: HTTP 500"), text
        text.encode("utf-8")  # valid: every malformed sequence was replaced
        assert "non-JSON body: upstream" in text, text
        assert control_chars(text) == [], text
