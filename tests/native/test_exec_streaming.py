"""Streaming exec: live delivery, deadlines, output caps and memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest

from langflow_sandbox_createos import _createos
from langflow_sandbox_createos.local.testing import LocalControlPlane

from .conftest import SHAPE


def test_chunks_reach_python_while_the_guest_runs(client: _createos.Client, sandbox: dict) -> None:
    seen: list[tuple[float, str, str]] = []
    t0 = time.monotonic()
    r = client.exec(
        sandbox["id"],
        "bash",
        ["-c", "echo first; sleep 1.5; echo second >&2; sleep 0.5; echo third"],
        timeout=20,
        on_output=lambda s, t: seen.append((time.monotonic() - t0, s, t)),
    )
    total = time.monotonic() - t0
    assert r.streamed and r.exit_code == 0
    assert [(s, t) for _, s, t in seen] == [
        ("stdout", "first\n"),
        ("stderr", "second\n"),
        ("stdout", "third\n"),
    ]
    first_at = seen[0][0]
    assert first_at < 1.0 and total - first_at > 1.5, (first_at, total)
    assert r.stdout == "first\nthird\n" and r.stderr == "second\n"


def test_on_output_exception_cancels_and_propagates(client: _createos.Client, sandbox: dict) -> None:
    def boom(stream: str, text: str) -> None:
        raise RuntimeError("stop here")

    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="stop here"):
        client.exec(sandbox["id"], "bash", ["-c", "echo go; sleep 30"], timeout=60, on_output=boom)
    assert time.monotonic() - t0 < 5
    assert client.exec(sandbox["id"], "echo", ["still fine"], timeout=10).stdout == "still fine\n"


def test_stream_deadline_returns_partial_output(client: _createos.Client, sandbox: dict) -> None:
    t0 = time.monotonic()
    r = client.exec(sandbox["id"], "bash", ["-c", "echo early; sleep 30"], timeout=1.5)
    elapsed = time.monotonic() - t0
    assert r.timed_out is True and r.exit_code == -1 and r.stdout == "early\n"
    assert elapsed < 2.5


def test_deadline_before_the_stream_starts_raises(
    client: _createos.Client, sandbox: dict, cp: LocalControlPlane
) -> None:
    cp.set_faults({"rules": [{"route": "exec_stream", "hang": True, "times": 1}]})
    t0 = time.monotonic()
    with pytest.raises(_createos.DeadlineError):
        client.exec(sandbox["id"], "echo", ["x"], timeout=1.0)
    assert time.monotonic() - t0 < 2.0


def test_buffered_exec_deadline_raises(client: _createos.Client, sandbox: dict) -> None:
    with pytest.raises(_createos.DeadlineError):
        client.exec(sandbox["id"], "sleep", ["30"], timeout=1.0, stream=False)


def test_stream_reset_mid_output_is_an_error(
    client: _createos.Client, sandbox: dict, cp: LocalControlPlane
) -> None:
    cp.set_faults({"rules": [{"route": "exec_stream", "reset": True, "after_bytes": 30, "times": 1}]})
    with pytest.raises(_createos.ProtocolError, match="truncated"):
        client.exec(
            sandbox["id"], "bash", ["-c", "for i in $(seq 50); do echo line$i; sleep 0.01; done"], timeout=20
        )


def test_output_cap_truncates_on_a_character_boundary(client: _createos.Client, sandbox: dict) -> None:
    # 3-byte characters; a cap of 1000 bytes cannot hold a whole number of them
    prog = "import sys; sys.stdout.write('\\u4e2d' * 5000); sys.stderr.write('e' * 50)"
    for stream in (True, False):
        r = client.exec(
            sandbox["id"], "python3", ["-c", prog], timeout=20, max_output_bytes=1000, stream=stream
        )
        assert r.stdout_truncated and not r.stderr_truncated
        assert r.stdout == "\u4e2d" * 333 and r.stderr == "e" * 50
        assert r.exit_code == 0


MEMORY_PROBE = textwrap.dedent(
    """
    import json, sys
    from langflow_sandbox_createos import _createos
    def peak_kib():
        # VmHWM, not ru_maxrss: the latter keeps the parent's peak across fork+exec
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))

    url, key, sid, mib = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    c = _createos.Client(url, key)
    c.exec(sid, "true", timeout=10)
    before = peak_kib()
    chunks = 0
    def on_output(stream, text):
        global chunks
        chunks += 1
    prog = "import os\\nb = b'x' * (1 << 20)\\nfor _ in range(%d): os.write(1, b)\\n" % mib
    r = c.exec(sid, "python3", ["-c", prog], timeout=120, on_output=on_output)
    after = peak_kib()
    print(json.dumps({"before_kib": before, "after_kib": after, "len": len(r.stdout),
                      "truncated": r.stdout_truncated, "exit": r.exit_code, "chunks": chunks,
                      "received": c.stats()["bytes_received"]}))
    """
)


def test_guest_printing_100_mib_costs_about_the_cap(
    client: _createos.Client, sandbox: dict, cp: LocalControlPlane
) -> None:
    """A fresh process streams 100 MiB of guest output under the default 16 MiB cap; its peak RSS
    grows by well under 100 MiB."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    if "libasan" in env.get("LD_PRELOAD", ""):
        # under `make sanitize` freed blocks wait in ASan's quarantine (256 MiB by default)
        env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":quarantine_size_mb=1"
    out = subprocess.run(
        [sys.executable, "-c", MEMORY_PROBE, cp.url, cp.api_key, sandbox["id"], "100"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    m = json.loads(out.stdout)
    growth_mib = (m["after_kib"] - m["before_kib"]) / 1024
    print(
        f"RSS growth streaming 100 MiB under a 16 MiB cap: {growth_mib:.1f} MiB "
        f"(received {m['received'] / 2**20:.0f} MiB)"
    )
    assert m["truncated"] and m["len"] == _createos.DEFAULT_MAX_OUTPUT_BYTES and m["exit"] == 0
    assert m["received"] > 100 * 2**20  # the whole stream was read, not cut short
    assert growth_mib < 60, m


def test_max_output_zero_keeps_nothing(client: _createos.Client, sandbox: dict) -> None:
    r = client.exec(sandbox["id"], "echo", ["x"], timeout=10, max_output_bytes=0)
    assert r.stdout == "" and r.stdout_truncated and r.exit_code == 0


def test_exec_argument_validation(client: _createos.Client, sandbox: dict) -> None:
    with pytest.raises(TypeError):
        client.exec(sandbox["id"], "echo", "not-a-list", timeout=5)
    with pytest.raises(TypeError):
        client.exec(sandbox["id"], "echo")  # timeout is required
    with pytest.raises(ValueError):
        client.exec(sandbox["id"], "echo", timeout=-1)
    with pytest.raises(TypeError):
        client.exec(sandbox["id"], "echo", timeout=5, on_output=42)


def test_env_at_exec(client: _createos.Client) -> None:
    view = client.create({"shape": SHAPE, "envs": {"GREETING": "hi"}})
    try:
        r = client.exec(view["id"], "printenv", ["GREETING"], env={"GREETING": "hello"}, timeout=10)
        assert r.stdout == "hello\n"
        with pytest.raises(_createos.UnavailableError) as info:
            client.exec(view["id"], "true", env={"UNDECLARED": "x"}, timeout=10)
        assert info.value.status == 400 and info.value.code == "env_not_declared"
    finally:
        client.delete(view["id"])


def test_stream_without_exit_frame_is_a_protocol_error(
    client: _createos.Client, sandbox: dict[str, Any], cp: LocalControlPlane
) -> None:
    """Not exit_code=-1 with error=None: the caller can tell a dead agent from a program."""
    cp.set_faults({"rules": [{"route": "exec_stream", "drop_exit": True, "times": 1}]})
    with pytest.raises(_createos.ProtocolError) as info:
        client.exec(sandbox["id"], "echo", ["hi"], timeout=10)
    assert info.value.code == "no_exit_frame" and info.value.status == 200
    assert "without an exit_code frame" in str(info.value)
    assert client.exec(sandbox["id"], "echo", ["hi"], timeout=10).exit_code == 0
