"""The runner's channel to the host: authenticated frames out, the host's answers in.

Framing. Before any flow code runs, the real stdout (fd 1) is duplicated onto a private,
non-inheritable descriptor reserved for frames, and fd 1 (plus `sys.stdout`) is pointed at
stderr. So `print()`, logging and child processes of the flow all land on the exec's stderr
stream. Each frame is one line in the format of `executor/framing.py`, keyed with the
per-run secret that arrived on stdin (never in argv or the environment). The host accepts a
line only if the sequence number is the next one and the MAC matches; anything else is plain
output. See docs/executor.md for the threat model.

Answers. What the host answers (a stored message's id, a history read, a sandboxed node's
result) arrives as a file in the run's reply directory, uploaded whole by the host, read once
and removed.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

from langflow_sandbox_createos.executor.framing import EXIT_TIMEOUT, frame_body, frame_line

REPLY_POLL_SECONDS = 0.002  # between looks for the host's answer

# How long each of the run's steps took in the guest, sent with the `done` frame (the host
# logs them in its debug timeline, executor/timeline.py). One run per process.
_PHASES: dict[str, float] = {}
_PHASE_CLOCK = [time.monotonic()]


def _phase(name: str) -> None:
    """The step `name` ended now: note the seconds since the previous step ended."""
    now = time.monotonic()
    _PHASES[name] = round(now - _PHASE_CLOCK[0], 4)
    _PHASE_CLOCK[0] = now


def _phases_from_now() -> None:
    """The run begins now (a pooled runner: its spec arrived): earlier steps are not its own."""
    _PHASES.clear()
    _PHASE_CLOCK[0] = time.monotonic()


class Frames:
    """Writes authenticated frames to the private descriptor."""

    def __init__(self, fd: int, key: bytes) -> None:
        self._fd = fd
        self._key = key
        self._seq = 0
        self._lock = threading.Lock()

    def emit(self, kind: str, **fields: Any) -> int:
        body = frame_body(kind, fields, default=_json_default)
        locked = self._lock.acquire(timeout=2.0)  # the watchdog must not wait forever
        try:
            seq = self._seq
            self._seq += 1
            # The leading newline ends any partial line flow code may have written to this
            # descriptor, so it cannot glue itself onto (and spoil) a real frame.
            data = f"\n{frame_line(self._key, seq, kind, body)}\n".encode()
            view = memoryview(data)
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
            return len(data)
        finally:
            if locked:
                self._lock.release()


def _json_default(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        try:
            return dump(mode="json")
        except Exception:  # fall through to str
            pass
    return str(value)


def _jsonable(data: Any) -> Any:
    """What lfx's EventManager.send_event would put on the wire for `data`."""
    try:
        from fastapi.encoders import jsonable_encoder

        return json.loads(json.dumps(jsonable_encoder(data)))
    except Exception:
        from lfx.serialization.serialization import serialize

        return json.loads(json.dumps(serialize(data, to_str=True), default=_json_default))


def _isolate_stdout() -> int:
    """Reserve the real stdout for frames; send everything else the flow writes to stderr."""
    sys.stdout.flush()
    frame_fd = os.dup(1)  # non-inheritable (PEP 446): child processes never get it
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # the spec has been read; the flow gets an empty stdin
    os.close(devnull)
    return frame_fd


class _Watchdog:
    """The run's deadline: when it passes, a `timeout` frame and exit EXIT_TIMEOUT. Its thread
    starts at once (a pooled runner's while it waits for its spec, off the run's path) and
    counts from `arm`."""

    def __init__(self, frames: Frames) -> None:
        self._frames = frames
        self._armed = threading.Event()
        self._seconds = 0.0
        self._deadline = 0.0
        threading.Thread(target=self._watch, name="createos-watchdog", daemon=True).start()

    def arm(self, seconds: float) -> None:
        self._seconds = seconds
        self._deadline = time.monotonic() + seconds
        self._armed.set()

    def _watch(self) -> None:
        self._armed.wait()
        while (left := self._deadline - time.monotonic()) > 0:
            time.sleep(left)
        try:
            self._frames.emit("timeout", seconds=self._seconds)
        finally:
            os._exit(EXIT_TIMEOUT)


def _take_reply(path: str) -> tuple[bool, Any]:
    """(True, the host's answer at `path`) once it is there whole, read once and removed;
    (False, None) while it is not there yet, or still being written."""
    try:
        with open(path, "rb") as handle:
            answer = json.loads(handle.read())
    except (FileNotFoundError, ValueError):
        return False, None
    os.unlink(path)
    return True, answer
