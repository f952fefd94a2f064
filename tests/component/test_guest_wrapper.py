"""The component's guest wrapper (`wrapper.GUEST_WRAPPER`), run as the engine builds it on a real
createos-local guest: a reused run's program starts only once an earlier run's archive has been
fetched (or the wait's budget is spent), whatever waits there (a file, a dangling link), and
its clock reports a timeout as a timeout. The wrapper does these checks with shell builtins
(no `ls`, no `date` when /proc/uptime is readable), so here they are driven end to end."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from langflow_sandbox_createos.component import engine, wrapper
from langflow_sandbox_createos.local.testing import LocalControlPlane

pytestmark = pytest.mark.timeout(120)

OUT = wrapper.ARCHIVE_DIR
MARK = "/tmp/archive-fetched"
SHAPE = "s-2vcpu-4gb"
PENDWAIT_ARG = 9  # argv: -c WRAPPER $0 run limit collect budget cap lockwait pendwait ...

# Both guest programs below start with the two paths.
PATHS = f"MARK, OUT = {MARK!r}, {OUT!r}\n"

# What the program reports: whether the "host" had fetched the waiting archive before it started.
REPORT = (
    PATHS + "import os\nprint('fetched' if os.path.exists(MARK) else 'not fetched', os.path.exists(OUT))\n"
)

# The host's fetch, as a guest process: once the wrapper is in its wait (its `sleep 0.1` is
# running), mark the fetch, then remove what waited. Gives up after 6 s if no wait comes.
FETCHER = (
    PATHS
    + """
import os, time
def waiting():
    for pid in os.listdir('/proc'):
        try:
            with open(f'/proc/{pid}/cmdline', 'rb') as fh:
                if fh.read() == b'sleep\\x000.1\\x00':
                    return True
        except OSError:
            pass
    return False
for _ in range(300):
    if waiting():
        open(MARK, 'w').close()
        for name in os.listdir(OUT):
            os.unlink(os.path.join(OUT, name))
        print('fetched')
        break
    time.sleep(0.02)
else:
    print('no wait seen')
"""
)


@pytest.fixture
def guest(cp: LocalControlPlane) -> Iterator[tuple[Any, str]]:
    from langflow_sandbox_createos import _createos

    client = _createos.Client(cp.url, cp.api_key)
    sandbox_id = client.create({"name": "t-wrapper", "shape": SHAPE, "rootfs": "devbox:1"})["id"]
    try:
        yield client, sandbox_id
    finally:
        client.delete(sandbox_id)
        client.close()


def _sh(client: Any, sandbox_id: str, script: str) -> Any:
    result = client.exec(sandbox_id, "/bin/sh", ["-c", script], timeout=30)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result


def _run(
    client: Any, sandbox_id: str, program: str, *, pendwait: int | None = None, timeout: int = 30
) -> Any:
    req = engine.RunRequest(
        program=program, mode="python", reuse=True, collect=False, allow_network=False,
        timeout=timeout, shape=SHAPE, flow_id="f", component_id="c",
    )  # fmt: skip
    built = wrapper.build_program(req, lock=True)
    argv = list(built.argv)
    if pendwait is not None:
        argv[PENDWAIT_ARG] = str(pendwait)
    for path, data in built.files:
        client.upload(sandbox_id, path, data)
    return client.exec(sandbox_id, "/bin/sh", argv, stdin=built.stdin, timeout=built.exec_timeout)


@pytest.mark.parametrize(
    "plant",
    [f"touch {OUT}/createos-run-0.tar.gz", f"ln -s /nonexistent {OUT}/.dangling"],
    ids=["archive", "dangling-link"],
)
def test_a_reused_run_starts_once_the_waiting_archive_is_fetched(guest: tuple[Any, str], plant: str) -> None:
    client, sandbox_id = guest
    _sh(client, sandbox_id, f"rm -f {MARK}; mkdir -p {OUT} && {plant}")
    fetcher: list[Any] = []
    thread = threading.Thread(
        target=lambda: fetcher.append(client.exec(sandbox_id, "python3", ["-c", FETCHER], timeout=30))
    )
    thread.start()
    try:
        out = _run(client, sandbox_id, REPORT)
    finally:
        thread.join(40)
    assert fetcher and fetcher[0].stdout == "fetched\n", fetcher
    assert out.exit_code == 0, (out.stdout, out.stderr)
    assert out.stdout == "fetched False\n", out.stdout  # started after the fetch; the wrapper emptied it


def test_an_archive_nobody_fetches_is_dropped_after_the_wait(guest: tuple[Any, str]) -> None:
    client, sandbox_id = guest
    _sh(client, sandbox_id, f"rm -f {MARK}; mkdir -p {OUT} && touch {OUT}/createos-run-0.tar.gz")
    out = _run(client, sandbox_id, REPORT, pendwait=1)
    assert out.exit_code == 0, (out.stdout, out.stderr)
    assert out.stdout == "not fetched False\n", out.stdout


def test_nothing_waiting_means_no_wait_and_no_leftovers(guest: tuple[Any, str]) -> None:
    client, sandbox_id = guest
    _sh(client, sandbox_id, f"rm -rf {MARK} {OUT}")
    out = _run(client, sandbox_id, REPORT)
    assert (out.exit_code, out.stdout) == (0, "not fetched False\n"), (out.stdout, out.stderr)
    left = _sh(client, sandbox_id, f"ls -A /tmp | grep -c '^{wrapper.RUN_DIR_PREFIX[5:]}' || true")
    assert left.stdout.strip() == "0", left.stdout  # the run directory is gone


def test_a_program_past_its_limit_is_reported_as_timed_out(guest: tuple[Any, str]) -> None:
    client, sandbox_id = guest
    out = _run(client, sandbox_id, "import time\nprint('started', flush=True)\ntime.sleep(30)\n", timeout=1)
    assert out.stdout == "started\n", (out.stdout, out.stderr)
    assert out.exit_code == 124, (out.exit_code, out.stderr)  # killed by the limit, not a crash (137)
