"""Out of memory while a background delete's outcome is recorded never turns a failed delete
into a success, nor drops it uncounted (issue 42). An LD_PRELOAD shim (shims/fail_alloc.c)
makes strdup fail for the delete's error text, or calloc fail for the outcome's node; a
scripted control plane on loopback (rawserver.py) answers the exec and the delete. The client
runs in a child process with the shim preloaded. Skipped under make sanitize: ASan's allocator
answers before any shim can."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from .conftest import build_shim, preloading
from .rawserver import RawServer, Request, answer

KEY = "sk-outcome-oom-test-key"
# sizeof(cos_outcome) (csrc/engine.h: next, status, error, id[256]) on LP64: the size of the
# calloc the shim fails; the child asserts the shim did fail something
OUTCOME_SIZE = 280

SCRIPT = textwrap.dedent(
    """
    import ctypes, json, sys
    from langflow_sandbox_createos import _createos

    url, key, mode, size = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    shim = ctypes.CDLL(None)
    client = _createos.Client(url, key, control_timeout=10.0)
    client.whoami()
    if mode == "strdup":
        shim.shim_fail_strdup(b"delete failed")
    else:
        shim.shim_fail_calloc(ctypes.c_size_t(size))
    try:
        r = client.run_program(None, "echo", ["ran"], timeout=10, sandbox_id="sb-oom", delete="background")
        outcomes = client.drain_deletes(timeout=5.0)
    finally:
        shim.shim_fail_strdup(b"")
        shim.shim_fail_calloc(ctypes.c_size_t(0))
    print(json.dumps({"stdout": r.stdout, "outcomes": outcomes, "stats": client.stats(),
                      "failures": shim.shim_failures()}), flush=True)
    client.close()
    """
)


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if "libasan" in os.environ.get("LD_PRELOAD", ""):
        pytest.skip("under AddressSanitizer its allocator answers before the shim")
    return build_shim(tmp_path_factory, "fail_alloc")


def scripted(delete_status: str) -> Any:
    def respond(req: Request) -> bytes:
        if "/exec" in req.target:
            body = b'{"stdout":"ran\\n"}\n{"exit_code":0}\n'
            return answer("200 OK", ["Content-Type: application/x-ndjson"], body)
        if req.method == "DELETE":
            body = b'{"status":"fail","data":{"message":"sandbox is busy"}}'
            if delete_status.startswith("200"):
                body = b'{"status":"success","data":{"id":"sb-oom","status":"destroying"}}'
            return answer(delete_status, ["Content-Type: application/json"], body)
        return answer("200 OK", ["Content-Type: application/json"],
                      b'{"status":"success","data":{"user_id":"u"}}')  # fmt: skip

    return respond


def run_child(shim: Path, server: RawServer, mode: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, server.url, KEY, mode, str(OUTCOME_SIZE)],
        env=preloading(shim),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["stdout"] == "ran\n"
    assert out["failures"] >= 1, out  # the shim did make an allocation fail
    return out


def test_a_failed_delete_whose_error_cannot_be_copied_stays_a_failure(shim: Path, server: RawServer) -> None:
    """strdup of the delete's error text fails: the outcome still carries an error (saying it
    was lost) and counts in deletes_failed. Fails on ac8509d: the outcome was (id, 409, None),
    counted in deletes_done, a success."""
    server.response = scripted("409 Conflict")
    out = run_child(shim, server, "strdup")
    [(sid, status, error)] = out["outcomes"]
    assert (sid, status) == ("sb-oom", 409)
    assert error is not None and "out of memory" in error
    assert (out["stats"]["deletes_failed"], out["stats"]["deletes_done"]) == (1, 0)


def test_a_delete_whose_outcome_cannot_be_held_is_counted_as_failed(shim: Path, server: RawServer) -> None:
    """calloc of every outcome node fails: the delete cannot be recorded (nor, here, even
    queued: its node is made with the request), and says so in deletes_failed and
    outcomes_dropped, never in deletes_done. Fails on ac8509d: the outcome was dropped with
    nothing counted at all."""
    server.response = scripted("200 OK")
    out = run_child(shim, server, "calloc")
    stats = out["stats"]
    assert out["outcomes"] == []
    assert (stats["deletes_failed"], stats["deletes_done"], stats["outcomes_dropped"]) == (1, 0, 1), stats
