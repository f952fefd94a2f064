"""One run of the CreateOS Sandbox component, without lfx: find or create the guest, run the
program under the guest's own timeout, bring the files back.

The canvas component (`components/createos/createos_sandbox.py`) only validates its inputs,
reports progress and turns a `RunOutcome` into its two outputs. Everything that talks to
the control plane is here, so it is importable once per process (the bundle file itself
is loaded by lfx under a private module name) and its per-process guest cache is shared.


The guest side of a run is the `/bin/sh` wrapper of `wrapper.py`; Guest Reuse (named
guests kept per flow, node, user and network setting) is `reuse.py`; the returned files
are read by `artifacts.py`.

A run's guest and its slot in the component's admission line are a guest lease's
(`core/lease.py`): a run's own guest (Guest Reuse off) is held by the guest keeper from its
create until its delete, so a process that ends mid-run, however it ends, leaves it to the
keeper, which deletes it. A reused guest is leased unheld: it outlives the run and the process on purpose (other
workers of the same flow share it; the product page's "Before you turn Guest Reuse on"), and
idle expiry, the sweep, auto-pause and `reap` bound it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from lfx.utils.sandbox.base import SandboxUnavailableError

from langflow_sandbox_createos.component import artifacts, reuse, wrapper
from langflow_sandbox_createos.component.reuse import NAME_PREFIX
from langflow_sandbox_createos.component.wrapper import Mode
from langflow_sandbox_createos.core import (
    connection,
    failures,
    guest_spec,
    lease,
    network,
    settings,
    shape_catalog,
)
from langflow_sandbox_createos.core.native import load_native
from langflow_sandbox_createos.core.settings import DEFAULT_COMPONENT_SHAPE

if TYPE_CHECKING:
    from langflow_sandbox_createos._createos import ExecResult

logger = logging.getLogger("langflow_sandbox_createos.component")

MAX_TIMEOUT_SECONDS = settings.MAX_TIMEOUT_SECONDS

REUSE_MODES = ("off", "flow", "session")
# Langflow's namespace for an anonymous end user's run (lfx.workflow.end_user_identity)
_ANONYMOUS_SESSION_PREFIX = "anon::"
# Allow Network off is the deny-all rule, which CreateOS applies after accepting the link-local
# range: the component runs (as the product page says) and says so in every such run's Results.
NETWORK_OFF_NOTICE = (
    f"Allow Network is off: the guest's egress is denied, except {network.LINK_LOCAL} (the link-local "
    "range that carries the VM metadata service), which CreateOS accepts before the deny-all rule."
)
NO_OWNER_NOTICE = (
    "Guest Reuse is on, but this run has no Langflow user id (or, for session reuse, no session id; "
    "an anonymous end user of a served flow has neither), so a reused guest could be shared with "
    "anyone else who runs the flow without one: it ran on a fresh guest, deleted afterwards."
)
OutputCallback = Callable[[Literal["stdout", "stderr"], str], None]


@dataclass(frozen=True)
class RunRequest:
    program: str
    mode: Mode
    reuse: bool
    collect: bool
    allow_network: bool
    timeout: int
    shape: str
    flow_id: str
    component_id: str
    # Whose guest a reused run gets: ("user:<id>",) for flow, plus ("session:<id>",) for
    # session; None when reuse was asked for but the run has no such identity.
    owner: tuple[str, ...] | None = ()


@dataclass
class RunOutcome:
    stdout: str
    stderr: str
    exit_code: int
    sandbox_id: str | None
    reused_guest: bool
    timeout: int
    timed_out: bool = False
    start_error: str | None = None
    output_truncated: bool = False
    exec_ms: float | None = None
    files: list[artifacts.ArtifactFile] = field(default_factory=list)
    artifacts_truncated: bool = False
    artifacts_message: str = ""
    reuse_notice: str = ""
    network_notice: str = ""

    @property
    def error(self) -> str | None:
        if self.timed_out:
            return f"Timed out after {self.timeout} s"
        if self.start_error:
            return f"The command could not start: {self.start_error}"
        if self.exit_code != 0:
            last = next((line for line in reversed(self.stderr.strip().splitlines()) if line.strip()), "")
            return f"Exited with code {self.exit_code}" + (f": {last[:500]}" if last else "")
        return None

    def results(self) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "result": self.stdout.strip(),
            "stderr": self.stderr.strip(),
            "exit_code": self.exit_code,
            "sandbox_id": self.sandbox_id,
            "reused_guest": self.reused_guest,
            "artifact_count": len(self.files),
            "artifacts_truncated": self.artifacts_truncated,
            "timed_out": self.timed_out,
            "output_truncated": self.output_truncated,
            "exec_ms": self.exec_ms,
        }
        if self.artifacts_message:
            payload["artifacts_message"] = self.artifacts_message
        if self.reuse_notice:
            payload["reuse_notice"] = self.reuse_notice
        if self.network_notice:
            payload["network_notice"] = self.network_notice
        error = self.error
        if error is not None:
            payload["error"] = error
        return payload

    def rows(self) -> list[dict[str, Any]]:
        return [f.row() for f in self.files]


# --- progress --------------------------------------------------------------------------


PROGRESS_LOG_INTERVAL = 2.0  # seconds between progress log entries while output streams
PROGRESS_LOG_MAX = 30
STATUS_TAIL_CHARS = 2000


class Progress:
    """Shows a run while it streams: the component's status holds the latest output, and a log
    entry is added every few seconds (lfx forwards logs to the canvas as they happen).

    ``component`` is anything with a ``status`` attribute and lfx's ``log(message, name=)``:
    the canvas component, or the executor host's recorder of what a guest's node should show
    (executor/bridge.py), whose entries the guest replays with ``replay``."""

    def __init__(self, component: Any) -> None:
        self._component = component
        self._tail = ""
        self._last_log = 0.0
        self._logs = 0

    def note(self, text: str) -> None:
        self._component.status = text

    def on_output(self, stream: Literal["stdout", "stderr"], chunk: str) -> None:
        self._tail = (self._tail + chunk)[-STATUS_TAIL_CHARS:]
        self._component.status = self._tail
        now = time.monotonic()
        if self._logs < PROGRESS_LOG_MAX and now - self._last_log >= PROGRESS_LOG_INTERVAL:
            self._last_log = now
            self._logs += 1
            lines = [line for line in self._tail.splitlines() if line.strip()]
            self._log(f"[{stream}] {lines[-1] if lines else ''}"[:500])

    def replay(self, logs: list[str], tail: str) -> None:
        """What the host's run of this node showed, shown here (the status ends on its tail)."""
        for message in logs[:PROGRESS_LOG_MAX]:
            self._log(str(message)[:500])
        if tail:
            self._component.status = tail[-STATUS_TAIL_CHARS:]

    def _log(self, message: Any) -> None:
        with contextlib.suppress(Exception):  # progress is best effort; it must never fail the run
            self._component.log(message, name="progress")


# --- inputs ------------------------------------------------------------------------------


def check_timeout(value: object) -> int:
    """The timeout in whole seconds, or a ValueError that says what is allowed."""
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str):
        number = settings.whole_number(value)  # ASCII digits: not "٣", not "--5"
    if number is None:
        raise ValueError(f"Timeout (seconds) must be a whole number of seconds, not {value!r}.")
    if number < 1 or number > MAX_TIMEOUT_SECONDS:
        raise ValueError(
            f"Timeout (seconds) must be between 1 and {MAX_TIMEOUT_SECONDS}; got {number}. "
            "(0 would mean no limit at all inside the guest, so it is refused.)"
        )
    return number


def resolve_shape(value: str | None) -> str:
    """The Shape input, else CREATEOS_SANDBOX_SHAPE, else the component default."""
    return (value or "").strip() or settings.pinned_shape() or DEFAULT_COMPONENT_SHAPE


def build_request(
    fields: Mapping[str, Any],
    *,
    component_id: str,
    flow_id: object,
    user_id: object,
    session_id: object,
) -> RunRequest:
    """The run a CreateOS Sandbox node's fields ask for (`python_code`, `command`,
    `session_mode`, `collect_artifacts`, `allow_network`, `timeout_seconds`, `shape`), for that
    node in that flow, user and session. Raises ValueError for a field the node cannot run
    with. The component builds its request with it in-process, and the executor's host with
    the host flow's fields for a node that runs in a guest (executor/bridge.py)."""
    timeout = check_timeout(fields.get("timeout_seconds"))
    command = str(fields.get("command") or "").strip()
    code = fields.get("python_code")
    code = str(getattr(code, "text", code) or "")
    mode: Mode = "command" if command else "python"
    raw_session = fields.get("session_mode")
    session = str(raw_session or "off").strip().lower()
    if session not in REUSE_MODES:
        modes = ", ".join(repr(m) for m in REUSE_MODES)
        raise ValueError(f"Guest Reuse must be one of {modes}, not {raw_session!r}.")
    return RunRequest(
        program=command if command else code,
        mode=mode,
        reuse=session != "off",
        owner=reuse_owner(session, user_id, session_id),
        collect=bool(fields.get("collect_artifacts")),
        allow_network=bool(fields.get("allow_network")),
        timeout=timeout,
        shape=resolve_shape(fields.get("shape")),
        flow_id=str(flow_id or "noflow"),
        component_id=component_id,
    )


def run_owner(graph: Any, user_id: object) -> object:
    """Whom a run belongs to for Guest Reuse, by Langflow's own rule for chat history
    (lfx's `resolve_message_owner_id`): the serving plane's end user when Langflow serves the
    run to one (`graph.end_user_id`), else the authenticated user. None for an anonymous
    caller of an end-user deployment (Langflow runs it in a random, non-persisting `anon::`
    session): such a run never shares a guest with anyone."""
    end_user = getattr(graph, "end_user_id", None) if graph is not None else None
    if end_user:
        from lfx.memory.flow_context import resolve_message_owner_id

        owner = resolve_message_owner_id(graph)
        return f"end-user:{owner}" if owner is not None else None
    session = str(getattr(graph, "session_id", None) or "") if graph is not None else ""
    if session.startswith(_ANONYMOUS_SESSION_PREFIX):
        return None
    return user_id


def reuse_owner(mode: str, user_id: object, session_id: object) -> tuple[str, ...] | None:
    """Who a reused guest belongs to: the run's Langflow user (flow), and its session too
    (session). None when that identity is missing: such a run must not share a guest."""
    if mode == "off":
        return ()
    user = str(user_id or "").strip()
    if not user:
        return None
    if mode == "flow":
        return (f"user:{user}",)
    session = str(session_id or "").strip()
    return (f"user:{user}", f"session:{session}") if session else None


# --- one run -------------------------------------------------------------------------------


def _max_output_bytes() -> int:
    with failures.refusing_bad_settings():
        return settings.max_output_bytes()


def _outcome(result: ExecResult, req: RunRequest, sandbox_id: str | None, reused: bool) -> RunOutcome:
    done = lease.finished(result)  # the wrapper's clock trailer off stderr, its 124 read
    exit_code = done.exit_code
    if done.start_error and exit_code == 0:
        exit_code = -1  # a command that never started must not read as a success
    if done.host_timed_out:
        exit_code = -1
    return RunOutcome(
        stdout=done.stdout,
        stderr=done.stderr,
        exit_code=exit_code,
        sandbox_id=sandbox_id,
        reused_guest=reused,
        timeout=req.timeout,
        timed_out=done.host_timed_out or done.guest_timed_out,
        start_error=done.start_error,
        output_truncated=done.stdout_truncated or done.stderr_truncated,
        exec_ms=done.exec_ms,
    )


def _collect(guest: lease.Lease, program: wrapper.GuestProgram, outcome: RunOutcome, retry: Callable) -> None:
    """Download and read the run's archive into `outcome`; failures are reported, not raised."""
    native = load_native()
    try:
        blob = retry(lambda: guest.download(program.archive_path, artifacts.MAX_ARCHIVE_BYTES))
    except native.NotFoundError:
        outcome.artifacts_truncated = True
        outcome.artifacts_message = (
            "The guest produced no file archive (the archive step did not run or was removed), "
            "so no files could be returned."
        )
        return
    except native.CreateOSError as exc:
        outcome.artifacts_truncated = True
        outcome.artifacts_message = (
            f"The files could not be brought back (limit {artifacts.MAX_ARCHIVE_BYTES} bytes compressed): "
            f"{failures.describe(exc)}"
        )
        return
    extraction = artifacts.extract(blob)
    outcome.files = extraction.files
    outcome.artifacts_truncated = extraction.truncated
    outcome.artifacts_message = extraction.message


def _stage_and_exec(
    guest: lease.Lease, program: wrapper.GuestProgram, max_output: int, on_output: OutputCallback | None
) -> ExecResult:
    """Run `program` on the guest: its files go up first, then one exec."""
    guest.stage(program.files)
    return guest.exec(
        "/bin/sh",
        program.argv,
        stdin=program.stdin,
        timeout=program.exec_timeout,
        max_output_bytes=max_output,
        on_output=on_output,
    )


@dataclass(frozen=True)
class _Run:
    """What both kinds of run are made of, judged before any guest exists."""

    endpoint: connection.Endpoint
    req: RunRequest
    guest: guest_spec.GuestSpec
    max_output: int
    on_output: OutputCallback | None
    note: Callable[[str], None]


def _run_reused(run: _Run, doing: failures.Doing, idle_limit: int) -> RunOutcome:
    req, endpoint, note = run.req, run.endpoint, run.note
    native = load_native()
    name = reuse.reuse_name(req.flow_id, req.component_id, run.guest.egress, req.owner or ())
    if reuse.sweeper.due():
        doing.action = "delete idle reused guests"
        reuse.sweeper.sweep(endpoint, idle_limit)
    doing.action = f"find or create the reused guest {name}"
    note(f"Finding guest {name}…")
    expired: list[str] = []
    record, reused = reuse.acquire_reused_guest(
        endpoint, native, name, run.guest, req.allow_network, idle_limit=idle_limit, expired=expired
    )
    kept = lease.Lease.kept(endpoint, str(record["id"]))
    sandbox_id = kept.sandbox_id
    current_pause = record.get("auto_pause_after_seconds")
    if isinstance(current_pause, int) and current_pause < run.guest.auto_pause_seconds:
        doing.action = f"raise the auto-pause window of guest {sandbox_id}"
        endpoint.client.patch(sandbox_id, {"auto_pause_after_seconds": run.guest.auto_pause_seconds})
    reuse.after_acquire(endpoint.client, sandbox_id)
    program = wrapper.build_program(req, lock=True)
    retry = reuse.resume_retry(endpoint.client, native, sandbox_id)

    doing.action = f"run the program on guest {sandbox_id}"
    note(f"Running on {'reused' if reused else 'new'} guest {sandbox_id}…")
    result = retry(lambda: _stage_and_exec(kept, program, run.max_output, run.on_output))
    outcome = _outcome(result, req, sandbox_id, reused)
    if expired:
        outcome.reuse_notice = (
            f"The reused guest {', '.join(expired)} was idle longer than CREATEOS_SANDBOX_REUSE_IDLE_SECONDS="
            f"{idle_limit} and was deleted; this run started a fresh one."
        )
    if req.collect:
        note("Collecting files…")
        _collect(kept, program, outcome, retry)
        try:
            kept.exec("/bin/rm", ["-f", program.archive_path], timeout=30.0, stream=False)
        except native.CreateOSError as exc:  # the next run drops it after its pending wait
            logger.warning("could not remove %s on guest %s: %s", program.archive_path, sandbox_id, exc)
    return outcome


def _run_fresh(run: _Run, doing: failures.Doing) -> RunOutcome:
    program = wrapper.build_program(run.req, lock=False)
    doing.action = "create a guest"
    run.note("Creating a guest…")
    own = lease.Lease.create(run.endpoint, run.guest, guest_spec.random_name(NAME_PREFIX))
    sandbox_id = own.sandbox_id
    try:
        doing.action = f"run the program on guest {sandbox_id}"
        run.note(f"Running on new guest {sandbox_id}…")
        result = _stage_and_exec(own, program, run.max_output, run.on_output)
        outcome = _outcome(result, run.req, sandbox_id, False)
        if run.req.collect:
            run.note("Collecting files…")
            _collect(own, program, outcome, lambda fn: fn())
        return outcome
    finally:  # a failed delete leaves the guest held: the keeper tries again at exit
        own.end(
            lambda exc: logger.warning("could not delete guest %s: %s", sandbox_id, failures.describe(exc))
        )


def run(
    req: RunRequest, *, on_output: OutputCallback | None = None, note: Callable[[str], None] | None = None
) -> RunOutcome:
    """Run `req` on CreateOS. Infrastructure failures raise lfx's SandboxUnavailableError
    (fail closed: a setting or the account must change) or SandboxExecutionError (transient);
    the program's own failure is an outcome with a non-zero exit code, not an exception."""
    note = note or (lambda _text: None)
    refusal = guest_spec.nul_refusal(req.program, "Python Code" if req.mode == "python" else "Command")
    if refusal:
        raise ValueError(refusal)  # before any setting is read or guest exists
    with failures.refusing_bad_settings():
        rootfs = settings.rootfs()
        idle_limit = settings.reuse_idle_seconds()
        max_guests = settings.sandbox_max_guests()
        max_wait = settings.sandbox_max_wait_seconds()
    notice = ""
    if req.reuse and req.owner is None:
        # never a guest another identity could land on: this run gets its own, deleted after
        notice = NO_OWNER_NOTICE
        req = replace(req, reuse=False)
    max_output = _max_output_bytes()  # every setting is judged before a guest exists
    endpoint = connection.endpoints.get()
    shapes = shape_catalog.catalog(endpoint)
    if req.shape not in {shape_id for _, shape_id in shapes}:
        raise SandboxUnavailableError(
            f"Shape {req.shape!r} is not in the CreateOS shape catalog. "
            f"Available: {', '.join(s for _, s in shapes) or 'none'}. "
            "Set the Shape input or CREATEOS_SANDBOX_SHAPE to one of them."
        )
    one = _Run(endpoint, req, _guest_spec(endpoint, req, rootfs), max_output, on_output, note)
    with (
        lease.COMPONENT.slot(max_guests, max_wait, tell=note),
        failures.native_errors("reach the CreateOS control plane") as doing,
    ):
        if req.reuse:
            outcome = _run_reused(one, doing, idle_limit)
        else:
            outcome = _run_fresh(one, doing)
            outcome.reuse_notice = notice
    if not req.allow_network:
        outcome.network_notice = NETWORK_OFF_NOTICE
    return outcome


def _guest_spec(endpoint: connection.Endpoint, req: RunRequest, rootfs: str) -> guest_spec.GuestSpec:
    """What this run's guest is created with. Its auto-pause covers the longest run it may
    serve: one that returns files and, on a reused guest, waits for its turn first."""
    return guest_spec.GuestSpec.of(
        endpoint,
        shape=req.shape,
        rootfs=rootfs,
        egress=network.egress_rules(req.allow_network),
        budget=wrapper.time_budget(req.timeout, lock=req.reuse, collect=True),
    )
