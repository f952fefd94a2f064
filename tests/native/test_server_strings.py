"""Every string from the server that reaches Python goes through the one sanitizer (issue 42):
sandbox ids (exc.sandbox_id, ExecResult.sandbox_id, the ids of drain_deletes), whoami() and
every other success answer. A scripted control plane on loopback (rawserver.py) echoes the key,
a line separator (U+2028), a C1 NEL and a bidi override where a real one puts ids and names.

- An id create answers with is shown as it is everywhere later, so one the sanitizer would
  change is refused (ProtocolError, the id not quoted), as a NUL in it already was.
- An id the caller passes in (run_program(sandbox_id=...)) is the caller's, and may hold
  anything: it comes back sanitized in exc.sandbox_id, ExecResult.sandbox_id and drain_deletes.
- A success answer is data: each string and key in it has every run of the key replaced by
  "[redacted]", and is otherwise kept (NUL included: test_server_bytes.py)."""

from __future__ import annotations

import json

import pytest

from langflow_sandbox_createos import _createos as E

from .rawserver import RawServer, Request, answer

KEY = "sk-Echo-ThisKey-0123456789"
HOSTILE = {
    "key": f"sb-{KEY}",
    "key-cut": f"sb-{KEY[3:15].upper()}-x",
    "line-separator": "sb-1\u2028[INFO] forged",
    "nel": "sb-1\u0085forged",
    "bidi-override": "sb-\u202egnp.exe",
}
HIDDEN = ("\u2028", "\u0085", "\u202e")


def envelope(data: object) -> bytes:
    return json.dumps({"status": "success", "data": data}).encode()


def json_answer(data: object) -> bytes:
    return answer("200 OK", ["Content-Type: application/json"], envelope(data))


def assert_shown_safely(text: str | None) -> None:
    assert text is not None
    assert KEY[3:11].lower() not in text.lower(), text
    assert not any(c in text for c in HIDDEN), ascii(text)


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_a_created_id_the_sanitizer_would_change_is_refused(server: RawServer, kind: str) -> None:
    """Fails on ac8509d: create returned the id, and run_program put it raw into
    ExecResult.sandbox_id (an id with only a C0 control was refused there)."""
    sid = HOSTILE[kind]

    def respond(req: Request) -> bytes:
        if req.method == "POST" and req.target == "/v1/sandboxes":
            return json_answer({"id": sid, "status": "running"})
        if "/exec" in req.target:
            body = b'{"stdout":"ran\\n"}\n{"exit_code":0}\n'
            return answer("200 OK", ["Content-Type: application/x-ndjson"], body)
        return json_answer({"id": sid, "status": "destroying"})

    server.response = respond
    with E.Client(server.url, KEY, control_timeout=5) as client:
        with pytest.raises(E.ProtocolError) as created:
            client.create({"shape": "s"})
        with pytest.raises(E.ProtocolError) as ran:
            client.run_program({"shape": "s"}, "echo", ["ran"], timeout=5)
    for exc in (created.value, ran.value):
        assert "sandbox id" in str(exc)
        assert_shown_safely(str(exc))
        assert exc.sandbox_id is None  # no guest the client will name
    assert not [r for r in server.requests if "/exec" in r.target]  # never used


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_an_id_the_caller_passes_in_comes_back_sanitized(server: RawServer, kind: str) -> None:
    """Fails on ac8509d: exc.sandbox_id, ExecResult.sandbox_id and the drain_deletes id were the
    raw text, key and all."""
    sid = HOSTILE[kind]
    exec_status = {"code": "200 OK"}

    def respond(req: Request) -> bytes:
        if "/exec" in req.target and exec_status["code"] == "200 OK":
            body = b'{"stdout":"ran\\n"}\n{"exit_code":0}\n'
            return answer("200 OK", ["Content-Type: application/x-ndjson"], body)
        if "/exec" in req.target:
            return answer(exec_status["code"], ["Content-Type: application/json"],
                          b'{"status":"error","message":"exec broke"}')  # fmt: skip
        return json_answer({"id": "gone", "status": "destroying"})

    server.response = respond
    with E.Client(server.url, KEY, control_timeout=5) as client:
        result = client.run_program(None, "echo", ["ran"], timeout=5, sandbox_id=sid, delete="background")
        assert result.stdout == "ran\n"
        assert_shown_safely(result.sandbox_id)
        exec_status["code"] = "500 Internal Server Error"
        with pytest.raises(E.TransientError) as failed:
            client.run_program(None, "echo", ["ran"], timeout=5, sandbox_id=sid, delete="background")
        assert_shown_safely(failed.value.sandbox_id)
        outcomes = client.drain_deletes(timeout=5)
    assert len(outcomes) == 2, outcomes
    for shown, status, error in outcomes:
        assert (status, error) == (200, None)
        assert_shown_safely(shown)
        assert shown == result.sandbox_id == failed.value.sandbox_id
    # the requests themselves name the guest by its real id (percent-encoded)
    assert all("/exec" in r.target or r.method == "DELETE" for r in server.requests)


def test_whoami_and_views_have_an_echoed_key_redacted(server: RawServer) -> None:
    """Fails on ac8509d: whoami() returned the key a server echoed."""
    echo = {
        "user_id": KEY,
        "note": f"key {KEY.upper()} in a sentence",
        KEY: "as a key",
        "nested": [{"created_by": f"x{KEY[2:14]}#"}],
        "plain": "v\u0000w\u2028x",  # data is kept as it is, but for the key
    }
    server.response = lambda req: json_answer(echo)
    with E.Client(server.url, KEY, control_timeout=5) as client:
        me = client.whoami()
        view = client.get("sb-1")
    for got in (me, view):
        text = json.dumps(got)
        assert KEY[3:11].lower() not in text.lower(), text
        assert got["user_id"] == "[redacted]"
        assert got["note"] == "key [redacted] in a sentence"
        assert got["[redacted]"] == "as a key"
        assert got["nested"][0]["created_by"] == "x[redacted]#"
        assert got["plain"] == "v\u0000w\u2028x"
