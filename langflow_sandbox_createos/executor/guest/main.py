"""The runner's entry point: `main(boot)`, called by the bootstrap with the document it read
from stdin. A cold run carries its spec; a pooled one (`wait`) loads lfx first and then waits
for its spec to be uploaded. Either way, one flow runs and the process exits.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import os
import sys
import time
import traceback
from typing import Any

from langflow_sandbox_createos.executor.framing import EXIT_FAILED, TAIL_CHARS, spec_mac, tail
from langflow_sandbox_createos.executor.guest.frames import (
    _PHASES,
    Frames,
    _isolate_stdout,
    _phase,
    _phases_from_now,
    _Watchdog,
)
from langflow_sandbox_createos.executor.guest.graph_run import _run_flow
from langflow_sandbox_createos.executor.guest.install import _ensure_lfx, _lfx_version
from langflow_sandbox_createos.executor.guest.sandbox_bridge import _SANDBOX_SEAMS


def main(boot: dict[str, Any]) -> None:
    """A cold run (`spec` or `spec_path` in `boot`) or a pooled one (`wait`: lfx is loaded
    first, then the runner waits for its spec file)."""
    wait = boot.pop("wait", None)
    if wait is not None:
        _pooled(boot, wait)
    _cold(boot)


def _pooled(boot: dict[str, Any], wait: dict[str, Any]) -> None:
    key = bytes.fromhex(boot.pop("token"))
    frames = _start(key)
    watchdog = _Watchdog(frames)  # armed when the spec arrived
    _ensure_lfx(frames)
    if wait.get("preload", True):  # a reused guest's standby run is forked with all of it loaded
        _preload(wait.get("warm_flow"))
    _SANDBOX_SEAMS.point()  # lfx's own until the spec says what the host answers
    frames.emit("ready", lfx=_lfx_version(), installed=False)
    spec = _await_spec(frames, key, str(wait["path"]), float(wait["seconds"]), float(wait.get("poll", 0.02)))
    del key
    if spec is None:
        frames.emit("idle_expired")
        sys.stderr.flush()
        os._exit(0)
    frames.emit("accepted")  # before anything of the run happens
    _phase("accepted")
    watchdog.arm(float(spec["timeout"]))
    _phase("watchdog")
    _run(frames, spec)


def _cold(boot: dict[str, Any]) -> None:
    _phases_from_now()
    key = bytes.fromhex(boot.pop("token"))
    spec = boot.pop("spec", None)
    if spec is None:  # a large spec was uploaded; read it and leave nothing on disk
        path = boot.pop("spec_path")
        with open(path, encoding="utf-8") as handle:
            spec = json.load(handle)
        os.unlink(path)
        spec.update(boot.pop("secret", None) or {})  # the run user's variables: never in that file
    frames = _start(key)
    del key
    deadline = time.monotonic() + float(spec["timeout"])
    _Watchdog(frames).arm(float(spec["timeout"]))
    installed = _ensure_lfx(frames, spec.get("install"), deadline)
    frames.emit("ready", lfx=_lfx_version(), installed=installed)
    _phase("lfx")
    _run(frames, spec)


def _start(key: bytes) -> Frames:
    frames = Frames(_isolate_stdout(), key)
    # The guest runs the flow itself; it must never hand the graph to another executor.
    os.environ["LANGFLOW_EXECUTOR_KIND"] = "in-process"
    frames.emit("hello", python=sys.version.split()[0], pid=os.getpid(), start=_start_time())
    return frames


def _start_time() -> int | None:
    """This process's start time in clock ticks (/proc/self/stat's 22nd field): with the pid,
    what names this very process (the host ends a reused guest's run by it, never another)."""
    try:
        with open("/proc/self/stat", encoding="ascii") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _run(frames: Frames, spec: dict[str, Any]) -> None:
    import asyncio

    try:
        asyncio.run(_run_flow(frames, spec))
    except BaseException as exc:  # report every failure, including SystemExit from a component
        if isinstance(exc, KeyboardInterrupt):
            raise
        frames.emit(
            "fatal",
            error=tail(f"{type(exc).__name__}: {exc}", TAIL_CHARS),
            missing_module=_missing_module(exc),
            traceback=tail("".join(traceback.format_exception(exc)), TAIL_CHARS),
        )
        sys.stderr.flush()
        os._exit(EXIT_FAILED)
    frames.emit("done", phases=_PHASES)
    sys.stderr.flush()
    _tell_learned()
    os._exit(0)  # do not wait for threads a component left running


# A run forked by a reused guest's warm runner (zygote.py) tells it, once the run is done, which
# modules it imported that the runner had not loaded (a component's lazy imports: the OpenAI
# client's `openai.resources`, 0.8 s of CPU, is imported on the model's first use), so the
# runner loads them and the next runs are forked with them. Set by the runner in each run it
# forks: "fd" (the pipe's write end), "known" (the runner's modules at the fork).
_LEARNING: dict[str, Any] = {}
LEARN_MAX_BYTES = 60_000  # under a pipe's 64 KiB: the write never waits for the runner


def _tell_learned() -> None:
    fd, known = _LEARNING.get("fd"), _LEARNING.get("known")
    if not isinstance(fd, int) or not isinstance(known, frozenset):
        return
    names = [name for name in list(sys.modules) if name not in known]
    data = "\n".join(names).encode("ascii", "ignore")
    if len(data) > LEARN_MAX_BYTES:
        data = data[: data.rfind(b"\n", 0, LEARN_MAX_BYTES) + 1]
    try:
        os.set_blocking(fd, False)
        os.write(fd, data)
    except OSError:  # only a warm-up for later runs
        pass


def _missing_module(exc: BaseException) -> str | None:
    """The module a ModuleNotFoundError anywhere in the exception chain names."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [exc]
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, ModuleNotFoundError) and current.name:
            return current.name
        stack += [current.__cause__, current.__context__]
    text = str(exc)
    marker = "No module named "
    at = text.find(marker)
    if at >= 0:
        rest = text[at + len(marker) :].strip()
        quote = rest[:1]
        if quote in ("'", '"') and quote in rest[1:]:
            return rest[1 : rest.index(quote, 1)]
    return None


# How long a runner waiting with inotify sleeps before it looks anyway: a bound, should an
# upload ever not be seen by inotify (a filesystem written from outside the guest's kernel).
SPEC_RECHECK_SECONDS = 0.1
_IN_CLOSE_WRITE, _IN_MOVED_TO, _IN_CREATE = 0x8, 0x80, 0x100
_IN_NONBLOCK, _IN_CLOEXEC = 0o4000, 0o2000000


class _DirectoryWatch:
    """Wakes a waiting runner when a file is written, moved or created in a directory it
    watches (Linux inotify, through libc; the guest has the standard library only). `fd` is
    -1 where inotify is unavailable: the caller polls instead."""

    def __init__(self) -> None:
        self.fd = -1
        self._libc: Any = None
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        except (OSError, AttributeError):  # no libc inotify here
            return
        if fd >= 0:
            self.fd, self._libc = fd, libc

    def add(self, directory: str) -> bool:
        """Watch `directory` (again: inotify keeps one watch per directory)."""
        if self.fd < 0:
            return False
        return (
            self._libc.inotify_add_watch(
                self.fd, os.fsencode(directory), _IN_CLOSE_WRITE | _IN_MOVED_TO | _IN_CREATE
            )
            >= 0
        )

    def wait(self, timeout: float) -> None:
        """Until something happened in a watched directory, or `timeout` passed."""
        import select

        ready, _, _ = select.select([self.fd], [], [], max(0.0, timeout))
        if ready:
            try:
                while os.read(self.fd, 65536):  # drain: the next wait sleeps until something new
                    pass
            except BlockingIOError:
                pass


def _await_spec(frames: Frames, key: bytes, path: str, seconds: float, poll: float) -> dict[str, Any] | None:
    """Wait for the host's upload of this guest's one run spec: `<mac>\n<json>`, accepted only
    whole and authentic (the MAC, keyed with this runner's secret, also proves it complete
    on a control plane whose upload is not atomic). Read once, then removed. None when
    nobody delivered a spec within `seconds` (the host's pool has forgotten this guest).

    The runner makes the spec's directory, then sleeps until inotify reports a change in it,
    looking anyway every SPEC_RECHECK_SECONDS; without inotify it looks every `poll` seconds.
    The directory goes with the spec (a reused guest's standby runs each have their own)."""
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)  # watched from the start
    # Never closed: closing an inotify descriptor waits for the kernel's grace period (~17 ms
    # measured, between the spec's arrival and `accepted`); the runner exits after its run.
    watch = _DirectoryWatch()
    frames.emit("waiting", path=path)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        watch.add(directory)  # again, should it have been replaced: its files wake us
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except FileNotFoundError:
            data = None
        if data is not None:
            mac, _, body = data.partition(b"\n")
            if hmac.compare_digest(mac.decode("ascii", "replace"), spec_mac(key, body)):
                _phases_from_now()
                os.unlink(path)
                with contextlib.suppress(OSError):  # a reused guest's standby leaves nothing behind
                    os.rmdir(directory)
                spec = json.loads(body)
                _phase("spec")
                return spec
            # still being written: its close (or rename) wakes us
        left = deadline - time.monotonic()
        if watch.fd >= 0:
            watch.wait(min(SPEC_RECHECK_SECONDS, left))
        else:
            time.sleep(max(0.0, min(poll, left)))
    return None


def _preload(warm_flow: Any = None) -> None:
    """What every run imports, loaded while a pooled runner waits for its spec; then a small
    flow from the host (ChatInput -> ChatOutput) is rebuilt and dropped, never run, which
    fills lfx's first-build caches (component code, models): ~0.3 s off the run's own build."""
    import asyncio  # noqa: F401
    import importlib.util

    from lfx.events.event_manager import EventManager  # noqa: F401
    from lfx.graph import Graph
    from lfx.graph.graph.constants import Finish  # noqa: F401
    from lfx.memory import stubs  # noqa: F401
    from lfx.memory.flow_context import should_persist_messages  # noqa: F401
    from lfx.schema.data import Data  # noqa: F401
    from lfx.schema.message import Message  # noqa: F401
    from lfx.schema.schema import InputValueRequest  # noqa: F401

    if importlib.util.find_spec("fastapi") is not None:  # else _jsonable uses lfx's serializer
        from fastapi.encoders import jsonable_encoder  # noqa: F401
    if isinstance(warm_flow, dict):
        try:
            Graph.from_payload(warm_flow)
        except Exception:  # only a warm-up: the run builds its own graph
            traceback.print_exc()
    _complete_models()


def _complete_models() -> None:
    """Complete lfx's pydantic models that import left incomplete (forward references, e.g.
    the content blocks of lfx.schema.content_types): pydantic completes each on first use, which
    cost a run's first message ~0.1-0.3 s. Only lfx's own: completing every model of every
    library loaded (hundreds of langsmith's) would cost seconds and no run needs them."""
    try:
        from pydantic import BaseModel
    except ImportError:
        return
    seen: set[type[BaseModel]] = set()
    stack: list[type[BaseModel]] = [BaseModel]
    model: type[BaseModel]
    while stack:
        for model in stack.pop().__subclasses__():
            if model in seen:
                continue
            seen.add(model)
            stack.append(model)
            module = getattr(model, "__module__", "") or ""
            if module.startswith("lfx.") and model.__dict__.get("__pydantic_complete__") is False:
                try:
                    model.model_rebuild(raise_errors=False)
                except Exception:  # only a warm-up: a model that cannot complete does so (or not) on use
                    traceback.print_exc()
