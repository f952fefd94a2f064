"""One executor run: one guest, one streaming exec of the runner, the frames it writes, the
guest's deletion. :class:`CreateOSExecutor` (``executor/__init__.py``) makes one per run; the
warm pool (``executor/pool.py``) starts the same run type ahead of need.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from lfx.utils.sandbox.base import SandboxExecutionError, SandboxUnavailableError

from langflow_sandbox_createos.core import (
    budget,
    connection,
    failures,
    guest_spec,
)
from langflow_sandbox_createos.core.lease import Lease
from langflow_sandbox_createos.core.native import load_native
from langflow_sandbox_createos.core.settings import ExecutorSettings
from langflow_sandbox_createos.executor.framing import EXIT_TIMEOUT, new_token, spec_mac, tail
from langflow_sandbox_createos.executor.guest import BOOTSTRAP, runner_source
from langflow_sandbox_createos.executor.guest.zygote import (
    CONNECTOR_ARGV,
    EXIT_NO_ZYGOTE,
    EXIT_ZYGOTE_LOST,
    KILL_RUN,
)
from langflow_sandbox_createos.executor.reader import FrameReader
from langflow_sandbox_createos.executor.spec import REPLY_DIR, encode_runtime
from langflow_sandbox_createos.executor.timeline import Timeline

logger = logging.getLogger("langflow_sandbox_createos.executor")

NAME_PREFIX = "lf-x-"
PYTHON = "python3"
# A run spec bigger than this is uploaded as a file (read and removed by the runner)
# instead of travelling on stdin, whose size limit the API leaves undocumented.
STDIN_SPEC_MAX_BYTES = 4 * 1024 * 1024
# Spec fields that stay on stdin when the rest of a large spec is uploaded: the run user's
# variables and the environment values that travel with them (executor/variables.py).
STDIN_ONLY_FIELDS = ("variables", "environ")
SPEC_DIR = "/workspace/.createos-run"
# Where a pooled runner waits for its spec (the guest's private /tmp).
SPEC_PATH = "/tmp/.createos-run/spec"
# Under which a reused guest's standby runs wait for theirs, each in a directory of its own.
STANDBY_DIR = "/tmp/.createos-standby"
# How long a pooled runner may take to confirm it picked up the uploaded spec.
ACCEPT_SECONDS = 30.0
# How long closing the stream waits for the guest delete before returning anyway.
# How long a reused run closed early may take to end by itself before it is killed in its guest.
GIVE_BACK_GRACE_SECONDS = 1.0
CLOSE_WAIT_SECONDS = 5.0
STDERR_KEEP_CHARS = 16000

ROOTFS_HINT = (
    "Build a guest template with Langflow and every package your components import, and set "
    "CREATEOS_EXECUTOR_ROOTFS to it (the supported path); CREATEOS_EXECUTOR_INSTALL_LFX=true with "
    "CREATEOS_EXECUTOR_PIP=<packages> installs them per run instead, for experiments."
)


def compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), default=str)


@functools.lru_cache(maxsize=1)
def _runner_json() -> str:
    return json.dumps(runner_source())


def runner_stdin(token: str, **fields: str) -> str:
    """The runner's stdin document: its program, the run's frame secret, and `fields`, each
    given as JSON text already. The program (about 60 KB) is encoded once per process, and a
    caller can keep the encoding of other parts that do not change (the warm-up flow)."""
    return boot_stdin(token, runner=_runner_json(), **fields)


def boot_stdin(token: str, **fields: str) -> str:
    """A run's boot document without the program: what a reused guest's warm runner, which has
    the program already, reads for each run (with `runner`: a cold runner's)."""
    parts = [f"{json.dumps(name)}:{text}" for name, text in fields.items() if name == "runner"]
    parts.append(f'"token":{json.dumps(token)}')
    parts += [f"{json.dumps(name)}:{text}" for name, text in fields.items() if name != "runner"]
    return "{" + ",".join(parts) + "}"


def version_text(value: Any) -> str | None:
    """A version string from the guest, fit to log and show: short, printable ASCII."""
    if not isinstance(value, str) or not value:
        return None
    cleaned = "".join(ch if 32 < ord(ch) < 127 else "?" for ch in value[:40])
    return cleaned + ("..." if len(value) > 40 else "")


def forwarded_env(cfg: ExecutorSettings) -> dict[str, str]:
    """Only the variables CREATEOS_EXECUTOR_ENV names, with this process's values."""
    envs = {}
    for name in cfg.env_allowlist:
        value = os.environ.get(name)
        if value is None:
            logger.warning("CreateOS executor: CREATEOS_EXECUTOR_ENV names %s, which is not set here", name)
            continue
        envs[name] = value
    return envs


# --- one run ------------------------------------------------------------------------------


class ReusedGuest(Protocol):
    """A reused guest of a run's trust domain (``reuse.WarmGuest``), as a run sees it."""

    lease: Lease

    def give_back(self, *, gone: bool) -> None: ...


class _Run:
    """Everything one execute() call owns: the guest's lease, the exec thread and its event
    queue."""

    def __init__(
        self,
        endpoint: connection.Endpoint,
        cfg: ExecutorSettings,
        spec: dict[str, Any] | None,
        *,
        pooled: Lease | None = None,
        spec_wait: float = 0.0,
        reused: ReusedGuest | None = None,
        standby: bool = False,
    ) -> None:
        """``pooled``: the warm pool's guest this run's exec starts on, ahead of any run
        (``spec_wait``: how long its runner may wait for a spec, a phase of the run's budget).
        ``reused``: a reused guest of the run's trust domain (``reuse.py``), whose warm runner
        forks the run: the guest outlives the run. ``standby`` (with ``reused``): the run's
        process is forked ahead of any run and waits for a spec, as a pooled runner does."""
        self.endpoint = endpoint
        self.cfg = cfg
        self.spec = spec
        self.token = new_token()
        self.reused = reused
        self.lease = reused.lease if reused is not None else pooled
        self.pooled = pooled is not None
        self.standby = standby
        ahead = self.pooled or standby  # the exec starts before a run owns it
        # where a runner started ahead waits for its spec: a reused guest's standbys each their own
        self.spec_path = f"{STANDBY_DIR}/{guest_spec.random_name('w')}/spec" if standby else SPEC_PATH
        # how the exec starts the run: the bootstrap with the whole runner, or a reused guest's connector
        self.argv = list(CONNECTOR_ARGV) if reused is not None else ["-c", BOOTSTRAP]
        self.exec_result: Any = None  # the exec's end, once its thread has it
        self.exec_error: BaseException | None = None
        self.exec_done = threading.Event()  # the exec's thread has its end (result or error)
        self.guest_process: tuple[int, int] | None = None  # a reused run's (pid, start time), from hello
        # A pooled guest's exec starts before any run (and any event loop) owns it: until
        # attach(), what it reports is kept in `early` and `warm_state` says how far it got.
        self.loop: asyncio.AbstractEventLoop | None = None if ahead else asyncio.get_running_loop()
        self.queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.early: list[tuple[str, Any]] = []
        self.warm_state = threading.Condition(threading.Lock())
        self.attached = not ahead
        self.budget = budget.executor(cfg.timeout_seconds, spec_wait=spec_wait)
        self.exec_timeout = self.budget.exec_timeout()
        self._closed = threading.Event()
        self.stderr_tail: list[str] = []
        self._stderr_chars = 0
        self.plain_lines = 0
        self.timeline: Timeline | None = None  # the run's, once a run owns this guest

    @property
    def sandbox_id(self) -> str | None:
        return self.lease.sandbox_id if self.lease is not None else None

    @property
    def guest(self) -> Lease:
        """The run's guest, once created or handed over by the pool."""
        if self.lease is None:
            raise RuntimeError("the executor run has no guest yet")
        return self.lease

    # -- guest lifecycle ----------------------------------------------------------------
    def _guest_spec(self) -> guest_spec.GuestSpec:
        return guest_spec.GuestSpec.of(
            self.endpoint,
            shape=self.cfg.shape,
            rootfs=self.cfg.rootfs,
            egress=self.cfg.egress,
            budget=self.budget,
            envs=forwarded_env(self.cfg),
        )

    def _create_blocking(self) -> Lease:
        # held until its delete: if this process is killed first, its keeper deletes it
        with failures.native_errors("create the executor guest"):
            return Lease.create(self.endpoint, self._guest_spec(), guest_spec.random_name(NAME_PREFIX))

    async def create(self) -> None:
        future = asyncio.get_running_loop().run_in_executor(None, self._create_blocking)
        try:
            self.lease = await asyncio.shield(future)
        except asyncio.CancelledError:
            # The create keeps going in its thread: delete the guest it makes, whenever it lands.
            def cleanup(done: asyncio.Future[Lease]) -> None:
                if not done.cancelled() and done.exception() is None:
                    self.lease = done.result()
                    self.lease.end_soon(self._delete_failed)

            future.add_done_callback(cleanup)
            raise

    def _delete_failed(self, exc: BaseException) -> None:
        logger.warning(
            "CreateOS executor: could not delete guest %s (%s); auto-pause after %s s bounds it",
            self.sandbox_id,
            exc,
            self.budget.auto_pause_seconds(),
        )

    def _deleted(self) -> None:
        if self.timeline is not None:
            self.timeline.mark("deleted")

    def delete_blocking(self) -> None:
        """Delete the guest once (its lease's end); a failed delete leaves it held, so the
        keeper tries again when this process ends."""
        if self.lease is not None and self.lease.end(self._delete_failed):
            self._deleted()

    def _gone(self) -> bool:
        """Whether the reused guest this run used is gone: its exec failed on the way (the guest
        was deleted or paused, the stream broke), or its connector found no warm runner (75) or
        lost it (70)."""
        if self.exec_error is not None:
            return True
        code = getattr(self.exec_result, "exit_code", None)
        return code in (EXIT_NO_ZYGOTE, EXIT_ZYGOTE_LOST)

    def _give_back(self, then: Callable[[], None] | None) -> None:
        """A reused run is over: the guest goes back to its domain (or is deleted if gone). A
        run whose exec has ended is given back at once, so the next run of the domain finds the
        guest free; one still going in the guest (closed early) gets GIVE_BACK_GRACE_SECONDS to
        end by itself, then its process group (only its own) is killed there, off the caller's
        path."""
        reused = self.reused
        assert reused is not None

        def finish(ended: bool = True) -> None:
            reused.give_back(gone=not ended or self._gone())
            if then is not None:
                then()

        if self.exec_done.is_set():
            finish()
            return

        def work() -> None:
            ended = False
            try:
                ended = self.exec_done.wait(GIVE_BACK_GRACE_SECONDS) or self._kill_in_guest()
            finally:
                finish(ended)  # a run not known to be ended: its guest is deleted, never reused

        threading.Thread(target=work, name="createos-executor-give-back", daemon=True).start()

    def _kill_in_guest(self) -> bool:
        """Kill the process group of this run's process in its reused guest, if that process is
        still the one that said hello (its start time), never another run's. Whether the run is
        known to be ended (else its guest must not serve another run)."""
        if self.guest_process is None:
            return self.exec_done.wait(CLOSE_WAIT_SECONDS)  # it never started: its exec ends
        pid, started = self.guest_process
        try:
            out = self.guest.exec(PYTHON, ["-c", KILL_RUN, str(pid), str(started)], timeout=60, stream=False)
        except Exception as exc:  # the guest is gone (or unreachable): delete it
            logger.debug(
                "CreateOS executor: could not end a run in reused guest %s: %s", self.sandbox_id, exc
            )
            return False
        return out.exit_code == 0

    def close_soon(self, then: Callable[[], None] | None = None) -> None:
        """Stop reading and delete the guest (which also ends a running exec) in a worker
        thread, off the caller's path; `then` runs once the delete returned (at once when
        there is no guest). Interpreter exit waits a little for deletes still running."""
        self._closed.set()
        if self.reused is not None:
            self._give_back(then)
            return
        if self.lease is None:
            if then is not None:
                then()
            return
        self.lease.end_soon(self._delete_failed, then=then, deleted=self._deleted)

    async def close(self) -> None:
        """Delete the guest; returns when the delete returned, or after CLOSE_WAIT_SECONDS
        (the thread finishes it either way)."""
        loop = asyncio.get_running_loop()
        deleted: asyncio.Future[None] = loop.create_future()

        def resolve() -> None:
            if not deleted.done():
                deleted.set_result(None)

        def wake() -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(resolve)

        self.close_soon(then=wake)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(deleted, CLOSE_WAIT_SECONDS)

    # -- a pooled guest: its exec runs before a run owns it ------------------------------
    def early_kinds(self) -> set[str]:
        """What the exec reported before attach(): frame types, plus "end"/"error"."""
        with self.warm_state:
            return {item["t"] if kind == "frame" else kind for kind, item in self.early}

    def wait_warm(self, timeout: float) -> set[str]:
        """Block until the runner waits for its spec, the exec ended, or `timeout` passed."""
        deadline = time.monotonic() + timeout
        with self.warm_state:
            while True:
                kinds = {item["t"] if kind == "frame" else kind for kind, item in self.early}
                left = deadline - time.monotonic()
                if kinds & {"waiting", "end", "error"} or left <= 0:
                    return kinds
                self.warm_state.wait(min(left, 1.0))

    def alive(self) -> bool:
        """Still waiting for a spec, as far as this process can tell without a request."""
        return not self._closed.is_set() and not self.early_kinds() & {"end", "error"}

    def attach(self) -> list[tuple[str, Any]]:
        """Hand the exec to the calling run: from now on its reports go to `queue` on this
        event loop. Returns what it reported before."""
        with self.warm_state:
            self.loop = asyncio.get_running_loop()
            self.queue = asyncio.Queue()
            self.attached = True
            early, self.early = self.early, []
        return early

    def discard(self) -> None:
        """Unused: the pool that holds the guest's lease ends it; this exec must report nothing
        more."""
        self._closed.set()

    # -- the exec, on its own thread ----------------------------------------------------
    def _push(self, kind: str, item: Any) -> None:
        if kind == "frame" and item.get("t") == "hello" and self.guest_process is None:
            pid, started = item.get("pid"), item.get("start")
            if isinstance(pid, int) and isinstance(started, int) and pid > 1:
                self.guest_process = (pid, started)
        if self._closed.is_set():
            return
        if not self.attached:
            with self.warm_state:
                if not self.attached:
                    self.early.append((kind, item))
                    self.warm_state.notify_all()
                    return
        loop = self.loop
        if loop is None:  # attached without a loop: nothing to report to
            return
        try:
            loop.call_soon_threadsafe(self.queue.put_nowait, (kind, item))
        except RuntimeError:  # the loop is gone; the consumer left
            self._closed.set()

    def _on_stderr(self, text: str) -> None:
        self.stderr_tail.append(text)
        self._stderr_chars += len(text)
        while self._stderr_chars > STDERR_KEEP_CHARS and len(self.stderr_tail) > 1:
            self._stderr_chars -= len(self.stderr_tail.pop(0))

    def _on_refused(self, refused: Exception) -> None:
        """Flow code that learnt the frame secret sent a frame the host will not decode."""
        logger.warning("CreateOS executor: guest %s sent %s; the run fails", self.sandbox_id, refused)
        self._push(
            "error",
            SandboxExecutionError(
                f"CreateOS executor: the guest sent {refused} (docs/executor.md, frame limits); "
                "the run was stopped."
            ),
        )

    def _on_plain(self, line: str) -> None:
        self.plain_lines += 1
        logger.debug("CreateOS executor: unframed guest stdout: %s", line[:500])

    def _exec_blocking(self, stdin: str) -> None:
        reader = FrameReader(
            key=bytes.fromhex(self.token),
            on_frame=lambda frame: self._push("frame", frame),
            on_plain=self._on_plain,
            on_refused=self._on_refused,
        )

        def on_output(stream: str, text: str) -> None:
            if self._closed.is_set():
                return
            if stream == "stdout":
                reader.feed(text)
            else:
                self._on_stderr(text)

        try:
            with failures.native_errors("run the flow in the executor guest"):
                result = self.guest.exec(
                    PYTHON,
                    self.argv,
                    stdin=stdin,
                    timeout=self.exec_timeout,
                    max_output_bytes=self.cfg.max_output_bytes,
                    stream=True,
                    on_output=on_output,
                )
            if not result.streamed:  # buffered fallback: no live output, parse it all now
                reader.feed(result.stdout)
                self._on_stderr(result.stderr)
            reader.close()
            self.exec_result = result
            self._push("end", result)
        except BaseException as exc:  # never lose an exception on this thread
            self.exec_error = exc
            self._push("error", exc)
        finally:
            self.exec_done.set()

    def _wire_spec(self) -> dict[str, Any]:
        assert self.spec is not None
        return {**self.spec, "runtime": encode_runtime(self.spec["runtime"])}

    async def deliver(self, spec: dict[str, Any]) -> bool:
        """Upload this run's spec to where its runner, started ahead, waits for it. False when
        the guest refused it (paused: 409, gone: 404): the runner cannot have seen it."""
        self.spec = spec
        body = compact_json(self._wire_spec()).encode()
        data = spec_mac(bytes.fromhex(self.token), body).encode("ascii") + b"\n" + body
        native = load_native()
        with failures.native_errors("upload the run spec to the executor guest's waiting runner"):
            try:
                await asyncio.to_thread(self.guest.upload, self.spec_path, data)
            except native.CreateOSError as exc:
                if getattr(exc, "status", None) in (404, 409):
                    return False
                raise
        return True

    async def stage(self) -> str:
        """The exec's stdin; a large spec is uploaded first and only its path travels on stdin.
        A reused guest's warm runner has the program: its stdin is the boot document alone."""
        boot = boot_stdin if self.reused is not None else runner_stdin
        spec_json = compact_json(self._wire_spec())
        stdin = boot(self.token, spec=spec_json)
        if len(stdin) <= STDIN_SPEC_MAX_BYTES:
            return stdin
        path = f"{SPEC_DIR}/{guest_spec.random_name('s')}.json"
        # the run user's variables stay on stdin: never in a file of the guest's /workspace
        wire = self._wire_spec()
        secret = {name: wire.pop(name, None) for name in STDIN_ONLY_FIELDS}
        data = compact_json(wire).encode()
        with failures.native_errors("upload the run spec to the executor guest"):
            await asyncio.to_thread(self.guest.upload, path, data)
        return boot(self.token, spec_path=json.dumps(path), secret=compact_json(secret))

    async def reply(self, name: str, answer: Mapping[str, Any]) -> None:
        """Answer a request the guest waits on (`reply-<n>`: a stored message's id; `sandbox-<n>`:
        a sandboxed node's result) with a file in its reply directory."""
        data = json.dumps(dict(answer), separators=(",", ":")).encode()
        with failures.native_errors("answer a request of the executor guest"):
            await asyncio.to_thread(self.guest.upload, f"{self.reply_dir}/{name}", data)

    @property
    def reply_dir(self) -> str:
        """Where the guest waits for this run's answers (a reused guest's runs: one each)."""
        chosen = self.spec.get("reply_dir") if self.spec is not None else None
        return chosen if isinstance(chosen, str) else REPLY_DIR

    def start_exec(self, stdin: str) -> None:
        threading.Thread(
            target=self._exec_blocking, args=(stdin,), name="createos-executor-exec", daemon=True
        ).start()

    def stderr_text(self) -> str:
        return "".join(self.stderr_tail)


# --- mapping the end of a run onto an error -----------------------------------------------


def _timeout_error(cfg: ExecutorSettings, detail: str = "") -> SandboxExecutionError:
    return SandboxExecutionError(
        f"The flow timed out in the CreateOS guest after {cfg.timeout_seconds} s "
        f"(CREATEOS_EXECUTOR_TIMEOUT_SECONDS). Raise it for long flows.{detail}"
    )


def run_failure(
    cfg: ExecutorSettings, frames: dict[str, Mapping[str, Any]], result: Any, stderr: str
) -> SandboxExecutionError | None:
    """The error a finished run stands for, or None for a clean run. `result` is the exec's,
    or None when the run ended at the runner's `done` frame (its exit is not waited for: after
    `done` the runner only leaves, with os._exit)."""
    if "timeout" in frames:
        return _timeout_error(cfg)
    if "install_failed" in frames:
        frame = frames["install_failed"]
        status = "timed out" if frame.get("timed_out") else f"pip exited {frame.get('status')}"
        return SandboxExecutionError(
            f"CreateOS executor: the per-run install (CREATEOS_EXECUTOR_INSTALL_LFX) failed: {status}. "
            f"Packages: {' '.join(map(str, frames.get('installing', {}).get('packages', [])))}. "
            f"Tail of pip's output:\n{frame.get('tail', '')}\n{ROOTFS_HINT}"
        )
    if "missing_lfx" in frames:
        return SandboxUnavailableError(
            f"CreateOS executor: the guest (rootfs {cfg.rootfs!r}) has no importable lfx, so it cannot "
            f"rebuild the flow. {ROOTFS_HINT}"
        )
    if "fatal" in frames:
        frame = frames["fatal"]
        module = frame.get("missing_module")
        trace = frame.get("traceback", "")
        if isinstance(module, str) and module:
            return SandboxExecutionError(
                f"The flow failed inside the CreateOS guest: no module named {module!r} there "
                f"(rootfs {cfg.rootfs!r}). A component needs it. {ROOTFS_HINT}\n"
                f"Guest traceback (tail):\n{trace}"
            )
        return SandboxExecutionError(
            f"The flow failed inside the CreateOS guest: {frame.get('error')}\n"
            f"Guest traceback (tail):\n{trace}"
        )
    if result is not None:  # how the exec ended
        if result.error:
            return SandboxExecutionError(
                f"CreateOS executor: the guest could not start {PYTHON}: {result.error}. The guest rootfs "
                f"({cfg.rootfs!r}, CREATEOS_EXECUTOR_ROOTFS) must provide {PYTHON} with lfx installed."
            )
        if result.timed_out or result.exit_code == EXIT_TIMEOUT:
            return _timeout_error(cfg)
        if result.stdout_truncated:
            return SandboxExecutionError(
                "CreateOS executor: the guest's results exceeded the output cap "
                f"({cfg.max_output_bytes} bytes, CREATEOS_SANDBOX_MAX_OUTPUT_BYTES) and were cut off."
            )
        if result.exit_code != 0:
            return SandboxExecutionError(
                f"CreateOS executor: the guest runner exited {result.exit_code} without reporting why. "
                f"Guest stderr (tail):\n{tail(stderr, 2000)}"
            )
    if "outputs" not in frames or "done" not in frames:
        return SandboxExecutionError(
            "CreateOS executor: the guest runner ended without reporting the run's outputs "
            f"(a component may have exited the interpreter). Guest stderr (tail):\n{tail(stderr, 2000)}"
        )
    return None


# --- the executor ---------------------------------------------------------------------------
