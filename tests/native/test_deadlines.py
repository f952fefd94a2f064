"""Whole-call deadlines through name resolution: a getaddrinfo that stalls (an LD_PRELOAD shim,
built here with gcc) bounds neither the call, nor other calls on the same Client, nor Ctrl-C."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from langflow_sandbox_createos import _createos

from .conftest import build_shim, preloading

STALL_SECONDS = 20

SCRIPT = textwrap.dedent(
    """
    import json, os, signal, threading, time
    from langflow_sandbox_createos import _createos as E
    out = {}
    # connect_timeout is generous: the whole-call deadline (control_timeout) must be what ends it
    c = E.Client("https://api.stall.test", "key", connect_timeout=60, control_timeout=1)

    def call(name):
        t0 = time.monotonic()
        try:
            c.whoami()
            out[name] = ["returned", time.monotonic() - t0]
        except Exception as exc:
            out[name] = [type(exc).__name__, time.monotonic() - t0]

    threads = [threading.Thread(target=call, args=(n,)) for n in ("first", "second")]
    for t in threads:
        t.start()
        time.sleep(0.2)
    for t in threads:
        t.join()

    slow = E.Client("https://ctrl-c.stall.test", "key", connect_timeout=60, control_timeout=60)
    # Python's own Ctrl-C handler: a process started with SIGINT ignored (a `cmd &` job of a
    # non-interactive shell, as a CI runner may be) passes SIG_IGN on to this one, and the
    # SIGINT below would be dropped (the call then ran out the whole 20 s stall)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
    t0 = time.monotonic()
    try:
        slow.whoami()
        out["sigint"] = ["returned", time.monotonic() - t0]
    except KeyboardInterrupt:
        out["sigint"] = ["KeyboardInterrupt", time.monotonic() - t0]
    t0 = time.monotonic()
    c.close()
    slow.close()
    out["close"] = ["closed", time.monotonic() - t0]
    print(json.dumps(out), flush=True)
    """
)


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_shim(tmp_path_factory, "stall_getaddrinfo")


def test_stalled_name_resolution_is_bounded_by_the_deadline(shim: Path) -> None:
    env = preloading(shim, STALL_SECONDS=str(STALL_SECONDS))
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=4 * STALL_SECONDS
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # each call ends at its own 1 s deadline, far inside the 20 s stall; the old client took
    # the whole stall for the first call and again for the second (one I/O thread, blocked)
    for name in ("first", "second"):
        kind, elapsed = out[name]
        assert kind == "DeadlineError" and elapsed < STALL_SECONDS / 2, out
    kind, elapsed = out["sigint"]
    assert kind == "KeyboardInterrupt" and elapsed < STALL_SECONDS / 2, out
    if "quick_exit" in _createos.build_features:
        assert out["close"][1] < STALL_SECONDS / 2, out
    else:
        # libcurl < 7.87 (no CURLOPT_QUICK_EXIT) joins the stuck resolver thread: each call
        # still ends at its deadline (the caller's backstop abandons it), but each client's
        # I/O thread, and so close(), waits for its getaddrinfo to return (two clients here)
        assert out["close"][1] < 2 * STALL_SECONDS + 10, out
