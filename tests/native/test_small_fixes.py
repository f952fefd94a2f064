"""The smaller points of issue 26: a server id holding NUL is refused (never cut into another
sandbox's id); URL escaping and Retry-After do not follow the process locale; an allocation
failure while converting arguments is MemoryError, never SystemError."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from langflow_sandbox_createos import _createos as E

from .rawserver import RawServer, Request, answer

JSON = ["Content-Type: application/json"]


def nul_id_plane(req: Request) -> bytes:
    if req.method == "POST" and req.target == "/v1/sandboxes":
        view = {"id": "sb-1\u0000other", "status": "running"}
        return answer("200 OK", JSON, json.dumps({"status": "success", "data": view}).encode())
    return answer("404 Not Found", JSON, b'{"status":"fail","data":{"message":"no such sandbox"}}')


@pytest.fixture
def nul_server() -> Iterator[RawServer]:
    s = RawServer(nul_id_plane)
    try:
        yield s
    finally:
        s.close()


def test_a_server_id_with_nul_is_refused_not_cut(nul_server: RawServer) -> None:
    with E.Client(nul_server.url, "k", control_timeout=5) as c:
        with pytest.raises(E.ProtocolError, match="sandbox id"):
            c.create({"shape": "s"})
        with pytest.raises(E.ProtocolError, match="sandbox id"):
            c.run_program({"shape": "s"}, "true", timeout=5)
    # nothing was ever sent to "sb-1", the id cut at its NUL
    assert [r.target for r in nul_server.requests] == ["/v1/sandboxes", "/v1/sandboxes"]


LOCALE_SCRIPT = textwrap.dedent(
    """
    import ctypes, json, locale, sys
    from langflow_sandbox_createos import _createos as E
    locale.setlocale(locale.LC_ALL, "")  # as an application may: every category from LC_ALL
    libc = ctypes.CDLL(None)
    out = {"locale": locale.setlocale(locale.LC_ALL), "decimal_point": locale.localeconv()["decimal_point"],
           "isalnum_c3": bool(libc.isalnum(0xC3))}
    c = E.Client(sys.argv[1], "k", control_timeout=5)
    try:
        c.get("sb-\\u00e9")
    except E.TransientError as exc:
        out["retry_after"] = exc.retry_after
    print(json.dumps(out))
    """
)


def test_escaping_and_retry_after_do_not_follow_the_locale(tmp_path: Path) -> None:
    """de_DE.ISO-8859-1, compiled here with localedef: a decimal comma, and 0xC3 ('Ã') is a
    letter. The old client sent the raw byte 0xC3 in the URL path and lost Retry-After: 1.5."""
    localedef = shutil.which("localedef")
    assert localedef is not None, "localedef (libc-bin) is needed to compile the test locale"
    subprocess.run([localedef, "-i", "de_DE", "-f", "ISO-8859-1", str(tmp_path / "de_DE.ISO-8859-1")],
                   check=True, capture_output=True, timeout=60)  # fmt: skip
    busy = answer(
        "503 Service Unavailable", ["Retry-After: 1.5", *JSON], b'{"status":"error","message":"busy"}'
    )
    server = RawServer(lambda req: busy)
    try:
        env = dict(os.environ, LOCPATH=str(tmp_path), LC_ALL="de_DE.ISO-8859-1")
        proc = subprocess.run([sys.executable, "-c", LOCALE_SCRIPT, server.url], env=env,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
    finally:
        server.close()
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # the test means something only if the locale took: decimal comma, 0xC3 a letter
    assert out["decimal_point"] == "," and out["isalnum_c3"], out
    targets = [r.target for r in server.requests]
    assert (targets, out["retry_after"]) == (["/v1/sandboxes/sb-%C3%A9"], 1.5), out


ALLOC_SCRIPT = textwrap.dedent(
    """
    import ctypes, json, os
    from langflow_sandbox_createos import _createos as E
    jansson = ctypes.CDLL("libjansson.so.4")  # the copy the extension already loaded
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    MALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t)
    # free is libc's own, never Python code: jansson frees while an exception is set
    jansson.json_set_alloc_funcs.argtypes = [MALLOC, ctypes.c_void_p]
    libc_free = ctypes.cast(libc.free, ctypes.c_void_p)
    left = [None]  # allocations that still succeed; None: all of them

    @MALLOC
    def failing_malloc(n):
        if left[0] is not None:
            if left[0] == 0:
                return None
            left[0] -= 1
        return libc.malloc(n)

    jansson.json_set_alloc_funcs(failing_malloc, libc_free)
    c = E.Client("http://127.0.0.1:9", "k", control_timeout=2)  # nothing listens: no server
    spec = {"shape": "s", "n": 123456789, "x": 1.5, "l": [7, 8, 9], "t": "text", "o": {"k": 10**12}}
    seen = {}
    for k in range(40):
        left[0] = k
        try:
            c.create(spec)
            kind = "returned"
        except BaseException as exc:
            kind = type(exc).__name__
        left[0] = None
        seen.setdefault(kind, []).append(k)
    print(json.dumps(seen), flush=True)
    os._exit(0)
    """
)


def test_an_allocation_failure_in_jansson_is_memory_error() -> None:
    """jansson's allocator fails at the k-th allocation, for every k: each call raises
    MemoryError, or gets as far as the network (TransientError), never SystemError."""
    proc = subprocess.run([sys.executable, "-c", ALLOC_SCRIPT], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(seen) <= {"MemoryError", "TransientError"}, seen
    assert "MemoryError" in seen and "TransientError" in seen, seen
