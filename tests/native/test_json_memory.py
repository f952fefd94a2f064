"""Memory of a parsed JSON answer is bounded in proportion to its body. jansson builds a node
of tens of bytes (an object: hundreds) for each value, so 16 MiB of "{}," once took gigabytes.
An answer whose tree (and the Python value made from it) would pass the bound is refused as
ProtocolError before it is parsed; every answer within it is parsed as before.

Each shape is 16 MiB, served by a loopback server to a client in a subprocess that reports
its peak RSS growth (VmHWM after clearing it with /proc/self/clear_refs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable

import pytest

from .rawserver import RawServer, answer

BODY = 16 << 20
BOUND = 4  # peak RSS growth <= BOUND x body

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from langflow_sandbox_createos import _createos as E
    def status(field):
        for line in open("/proc/self/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024

    c = E.Client(sys.argv[1], "k", control_timeout=60)
    c.whoami()  # the I/O thread and its buffers exist before the measure
    before = status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM (peak RSS) to the current RSS
    try:
        view = c.get("sb-1")
        outcome = "parsed %d items" % len(view["items"])
        del view
    except E.ProtocolError as exc:
        outcome = "refused: %s" % exc
    print(json.dumps({"growth": status("VmHWM") - before, "outcome": outcome}))
    """
)


def envelope(items: str) -> bytes:
    return ('{"status":"success","data":{"id":"sb-1","items":' + items + "}}").encode()


def filled(first: str, more: str, close: str, size: int = BODY) -> str:
    """first + more + more + ... + close, `size` bytes in all (envelope included)."""
    room = size - len(envelope("")) - len(first) - len(close)
    return first + more * (room // len(more)) + close


def many_keys() -> bytes:
    room, parts, i = BODY - len(envelope("{}")), [], 0
    while room > 16:
        part = f'"{i:x}":1'
        parts.append(part)
        room -= len(part) + 1
        i += 1
    return envelope("{" + ",".join(parts) + "}")


SHAPES: dict[str, tuple[Callable[[], bytes], bool]] = {
    # name: (body, parsed?) -- structure-heavy shapes are refused, text-heavy ones parsed
    "empty objects": (lambda: envelope(filled("[{}", ",{}", "]")), False),
    "empty arrays": (lambda: envelope(filled("[[]", ",[]", "]")), False),
    "small integers": (lambda: envelope(filled("[0", ",0", "]")), False),
    "one-char strings": (lambda: envelope(filled('["a"', ',"a"', "]")), False),
    "many keys": (many_keys, False),
    "one big string": (lambda: envelope(filled('["', "x", '"]')), True),
    # one character beyond U+FFFF: Python stores every character of that str in 4 bytes
    "one big string, 4-byte characters": (lambda: envelope(filled('["\U0001f600', "x", '"]')), False),
    "rows of text": (
        lambda: envelope(filled("[" + '"' + "r" * 200 + '"', ',"' + "r" * 200 + '"', "]")),
        True,
    ),
    "rows of shorter text": (  # near the bound: estimated 3.9 x
        lambda: envelope(filled("[" + '"' + "r" * 100 + '"', ',"' + "r" * 100 + '"', "]")),
        True,
    ),
    "objects with text": (
        lambda: envelope(filled('[{"name":"' + "n" * 1000 + '"}', ',{"name":"' + "n" * 1000 + '"}', "]")),
        True,
    ),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_peak_memory_of_a_16_mib_json_answer_is_bounded(shape: str) -> None:
    make, parsed = SHAPES[shape]
    body = make()
    assert abs(len(body) - BODY) < BODY // 100, len(body)
    whoami = answer("200 OK", ["Content-Type: application/json"], b'{"status":"success","data":{}}')
    big = answer("200 OK", ["Content-Type: application/json"], body)
    server = RawServer(lambda req: whoami if req.target.endswith("/whoami") else big)
    # under `make sanitize` the memory is ASan's allocator's (redzones around every block,
    # shadow memory, a quarantine of freed blocks): the outcome is checked there, the bound
    # only with the real allocator (tests/native, make test)
    asan = "libasan" in os.environ.get("LD_PRELOAD", "")
    try:
        proc = subprocess.run(
            [sys.executable, "-c", SCRIPT, server.url], capture_output=True, text=True, timeout=300
        )
    finally:
        server.close()
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    print(shape, f"{out['growth'] / (1 << 20):.1f} MiB", out["outcome"][:120])
    assert out["outcome"].startswith("parsed" if parsed else "refused"), out
    assert asan or out["growth"] <= BOUND * len(body), out
