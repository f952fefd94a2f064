"""upload(file=) opens the file without freezing the interpreter: a FIFO (or any file that is
not a regular file) is refused before anything can block, with an error that says so. A
ticker thread measures the longest time the interpreter stood still during the call."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from langflow_sandbox_createos import _createos as E


class Ticker:
    """Wakes every 10 ms; `longest` is the longest gap between two wake-ups."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(0.01):
            now = time.monotonic()
            self.longest = max(self.longest, now - last)
            last = now

    def __enter__(self) -> Ticker:
        self._thread.start()
        time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_upload_from_a_fifo_is_refused_without_freezing_the_interpreter(
    client: E.Client, tmp_path: Path
) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    # a writer that shows up 3 s later: the old client blocked in open() with the GIL held
    # until then (the whole interpreter stood still), and then refused the FIFO anyway
    writer = subprocess.Popen(["sh", "-c", 'sleep 3; : > "$0"', str(fifo)])
    error: BaseException | None = None
    try:
        with Ticker() as ticker:
            t0 = time.monotonic()
            try:
                client.upload("sb-unused", "/workspace/in", file=fifo)
            except BaseException as exc:
                error = exc
            elapsed = time.monotonic() - t0
    finally:
        writer.kill()
        writer.wait()
    print(f"longest stall {ticker.longest * 1000:.1f} ms, call {elapsed * 1000:.1f} ms")
    assert ticker.longest < 0.5 and elapsed < 0.5, (ticker.longest, elapsed)
    assert isinstance(error, OSError) and error.filename == fifo, error
    assert "not a regular file" in str(error) and "FIFO" in str(error), error


@pytest.mark.parametrize("kind", ["directory", "missing"])
def test_upload_of_what_is_not_a_readable_regular_file_names_it(
    client: E.Client, tmp_path: Path, kind: str
) -> None:
    target = tmp_path if kind == "directory" else tmp_path / "nope"
    with pytest.raises(OSError) as info:
        client.upload("sb-unused", "/workspace/in", file=target)
    assert info.value.filename == target
