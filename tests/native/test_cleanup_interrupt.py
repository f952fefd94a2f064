"""Ctrl-C while run_program's synchronous delete is past its deadline and the thread driving
the client's transfers is held (an LD_PRELOAD shim, built here with gcc, blocks the DELETE's
send for 8 s and raises SIGINT 3.5 s in: after the deadline of 2 s + 1 s, inside the bounded
wait for the cancel). The driver is another thread of the process (a long exec on the same
client, which drives every transfer in flight while it waits for its own): a caller whose
transfer is driven elsewhere still ends at its deadline and on Ctrl-C. The call raises
KeyboardInterrupt, and the delete it gave up on is reported by drain_deletes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from langflow_sandbox_createos.local.testing import LocalControlPlane

from .conftest import SHAPE, build_shim, preloading

SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sys, threading, time
    from langflow_sandbox_createos import _createos as E
    out = {}
    signal.signal(signal.SIGINT, signal.default_int_handler)  # see test_deadlines.py
    c = E.Client(os.environ["CP_URL"], os.environ["CP_KEY"], control_timeout=2)
    # another thread's long exec: it drives the client's transfers, ours included, and is
    # the thread the stalled DELETE send holds
    long_run = threading.Thread(
        target=c.run_program, args=({"shape": sys.argv[1]}, "sleep"), kwargs={"args": ["6"], "timeout": 30}
    )
    long_run.start()
    time.sleep(1.0)
    t0 = time.monotonic()
    try:
        r = c.run_program({"shape": sys.argv[1]}, "true", timeout=10)
        out["call"] = ["returned", time.monotonic() - t0, r.sandbox_id]
    except BaseException as exc:
        out["call"] = [type(exc).__name__, time.monotonic() - t0, getattr(exc, "sandbox_id", None)]
    out["pending"] = c.pending_deletes()
    out["outcomes"] = c.drain_deletes(timeout=20)
    out["pending_after"] = c.pending_deletes()
    long_run.join()
    c.close()
    print(json.dumps(out), flush=True)
    """
)


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_shim(tmp_path_factory, "stall_delete")


def test_ctrl_c_during_a_held_cleanup_delete(shim: Path, cp: LocalControlPlane) -> None:
    env = preloading(shim, CP_URL=cp.url, CP_KEY=cp.api_key, STALL_SECONDS="8", SIGINT_AFTER="3.5")
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, SHAPE], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    print(out)
    kind, elapsed, _ = out["call"]
    # before: SystemError ("returned a result with an exception set"), and no outcome
    assert kind == "KeyboardInterrupt" and elapsed < 7, out
    # the abandoned delete counts as a background delete until the driver lets go of it
    assert out["pending"] == 1 and out["pending_after"] == 0, out
    # it was retried once the driver was free: the guest is gone, and said so
    [(sid, _, error)] = out["outcomes"]
    assert error is None and sid in {sb["id"] for sb in cp.sandboxes()}, out
    assert cp.wait_until_no_live(timeout=5.0) == []
