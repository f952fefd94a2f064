"""Concurrent runs on one reused guest keep their program and their archive to themselves:
the program is written after the lock into a run directory only the wrapper creates, and the
archive leaves that directory, and is fetched, before the next run's program starts."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Any

from langflow_sandbox_createos.component import engine
from langflow_sandbox_createos.local.testing import LocalControlPlane

# Holds the lock for a few seconds and rewrites every other run's program it can find.
HIJACKER = r"""
import glob, os, time
print("A-started", flush=True)
hit = {os.path.abspath(__file__)}
end = time.monotonic() + 3
while time.monotonic() < end:
    for path in glob.glob("/tmp/createos-run-*/main.py") + glob.glob("/tmp/createos-run-*.upload"):
        if path not in hit:
            open(path, "w").write("print('hijacked')\n")
            hit.add(path)
    time.sleep(0.005)
print("A-holder done", len(hit) - 1)
"""

SNOOPER = r"""
import os, tarfile
found = []
for root, dirs, files in os.walk("/tmp"):
    for name in files:
        if name.endswith(".tar.gz"):
            try:
                with tarfile.open(os.path.join(root, name)) as tar:
                    found += [m.name for m in tar]
            except Exception as exc:
                found.append(f"{name}: {exc}")
print("found", sorted(found))
"""


def _request(program: str, **kwargs: Any) -> engine.RunRequest:
    fields: dict[str, Any] = {
        "program": program,
        "mode": "python",
        "reuse": True,
        "collect": False,
        "allow_network": False,
        "timeout": 30,
        "shape": engine.resolve_shape(None),
        "flow_id": "flow-privacy",
        "component_id": "CreateOSSandbox-p0001",
    }
    fields.update(kwargs)
    return engine.RunRequest(**fields)


def _start_holder(pool: concurrent.futures.Executor, program: str, **kwargs: Any) -> Any:
    """Run `program` on the reused guest and return once it has printed that it started
    (so it holds the guest's lock)."""
    started = threading.Event()

    def on_output(stream: str, chunk: str) -> None:
        if "A-started" in chunk:
            started.set()

    future = pool.submit(engine.run, _request(program, **kwargs), on_output=on_output)
    assert started.wait(120), future.result() if future.done() else "the holder never started"
    return future


def test_a_waiting_run_cannot_have_its_program_replaced(reuse_env: LocalControlPlane) -> None:
    engine.run(_request("print('warm')"))  # the guest exists: both runs below reuse it
    small = "print('B-small ran its own program')\n"
    big = "x = 1\n" * (300 * 1024 // 6) + "print('B-big ran its own program')\n"  # uploaded, not stdin
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        holder = _start_holder(pool, HIJACKER)
        b_small = pool.submit(engine.run, _request(small))
        b_big = pool.submit(engine.run, _request(big))
        a, small_out, big_out = holder.result(), b_small.result(), b_big.result()
    assert a.exit_code == 0 and "A-holder done" in a.stdout, a
    # e8f911e: the waiting run wrote main.py before taking the lock and printed "hijacked"
    assert small_out.exit_code == 0, small_out
    assert small_out.stdout.strip() == "B-small ran its own program"
    # a program too large for stdin is staged before the lock: rewriting it is detected
    assert "hijacked" not in big_out.stdout
    assert big_out.exit_code == 125, big_out
    assert "the uploaded program is missing or was changed before it ran" in big_out.stderr
    assert a.stdout.strip().endswith("done 1")  # it found only the staged upload


def test_the_next_run_never_sees_an_archive_still_waiting_for_its_host(
    reuse_env: LocalControlPlane, monkeypatch: Any
) -> None:
    engine.run(_request("print('warm')"))
    real_collect = engine._collect

    def slow_host(guest: Any, program: Any, outcome: Any, retry: Any) -> None:
        time.sleep(2.0)  # the holder's host is slow to fetch its archive
        real_collect(guest, program, outcome, retry)

    monkeypatch.setattr(engine, "_collect", slow_host)
    holder_program = (
        "import time\nprint('A-started', flush=True)\ntime.sleep(1)\n"
        "open('/workspace/artifacts/secret.txt', 'w').write('A-secret')\n"
    )
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        holder = _start_holder(pool, holder_program, collect=True)
        snooper = pool.submit(engine.run, _request(SNOOPER))
        a, b = holder.result(), snooper.result()
    assert a.exit_code == 0 and [(f.path, f.data) for f in a.files] == [("secret.txt", b"A-secret")], a
    # e8f911e: the archive sat in the holder's run directory until its host fetched it
    assert b.exit_code == 0, b
    assert b.stdout.strip() == "found []"


def test_the_program_keeps_the_default_umask(reuse_env: LocalControlPlane) -> None:
    out = engine.run(_request("import os\nprint(oct(os.umask(0)))\n"))
    assert out.exit_code == 0 and out.stdout.strip() == "0o22", out
