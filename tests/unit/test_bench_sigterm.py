"""A benchmark stopped with SIGTERM (a CI time limit, `kill`) stops what it started: the
Langflow server, createos-local and its guests, not only its own process
(benchmarks/run.py's stop_on_sigterm, which benchmarks/server_bench.py calls first)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV_LANGFLOW = ROOT / os.environ.get("VENV_LANGFLOW", ".venv-langflow")

pytestmark = pytest.mark.skipif(
    not (VENV_LANGFLOW / "bin" / "langflow").exists(), reason="needs .venv-langflow (make langflow)"
)


def started_by(sid: int, scratch: str) -> list[str]:
    """Every live process of session `sid`, or whose working directory or command line is in
    the benchmark's scratch directory (createos-local and Langflow get sessions of their own):
    pid and command line."""
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if fields[0] != "Z" and (int(fields[3]) == sid or scratch in cmd or cwd.startswith(scratch)):
            alive.append(f"{entry.name} {cmd[:160]}")
    return alive


def test_sigterm_stops_the_server_and_the_bed(tmp_path: Path) -> None:
    log = tmp_path / "bench.log"
    scratch = ""
    with log.open("wb") as out:
        bench = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "benchmarks" / "server_bench.py"),
                "--quick",
                "--surfaces",
                "inprocess",
                "--concurrency",
                "16",
                "--no-plot",
                "--out",
                str(tmp_path / "results"),
            ],
            cwd=ROOT,
            env={**os.environ, "VENV_LANGFLOW": str(VENV_LANGFLOW)},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its session: the bench and the children it did not detach
        )
    try:
        deadline = time.monotonic() + 240
        while "server up in" not in (text := log.read_text(errors="replace")):
            assert bench.poll() is None, text[-3000:]
            assert time.monotonic() < deadline, "the server did not come up in 240 s"
            time.sleep(0.5)
        found = re.search(r"scratch (/\S+)", text)
        assert found, text[-3000:]
        scratch = found.group(1)
        started = started_by(bench.pid, scratch)
        assert any("createos-local" in p for p in started) and any("langflow" in p for p in started), started
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(120) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 30
        while started_by(bench.pid, scratch) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert started_by(bench.pid, scratch) == [], log.read_text(errors="replace")[-3000:]
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
        for line in started_by(bench.pid, scratch) if scratch else []:
            os.kill(int(line.split()[0]), signal.SIGKILL)
