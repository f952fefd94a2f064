"""One run of the CreateOS Sandbox component, without lfx: find or create the guest, run the
program under the guest's own timeout, bring the files back.

The canvas component (`components/createos/createos_sandbox.py`) only validates its inputs,
reports progress and turns a `RunOutcome` into its two outputs. Everything that talks to
the control plane is here, so it is importable once per process (the bundle file itself
is loaded by lfx under a private module name) and its per-process guest cache is shared.

How one run goes in the guest (`GUEST_WRAPPER`): a `/bin/sh` wrapper takes the guest's
artifacts lock (reused guests only) and waits for an earlier run's archive to be fetched,
creates the run's own directory and only then writes the program into it (from stdin, or
moves the staged upload in and checks its sha256), empties `/workspace/artifacts` when
files are to be returned, runs the program under `timeout --signal=KILL N` from
`/workspace`, then, outside that timeout and under a budget of its own, archives
`/workspace/artifacts` and moves the archive out of the run directory into
`/tmp/.createos-out/` before it exits (and so releases the lock). The archive is downloaded
with a byte cap, read by `artifacts.extract` within its byte and time budgets, and removed.

A run's own guest (Guest Reuse off) is held in the process's `pool_keeper` from its create
until its delete: a process that ends mid-run, however it ends, leaves it to the keeper, which
deletes it. A reused guest is not held: it outlives the run and the process on purpose (other
workers of the same flow share it; the product page's "Before you turn Guest Reuse on"), and
idle expiry, the sweep, auto-pause and `reap` bound it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeVar

from lfx.utils.sandbox.base import SandboxExecutionError, SandboxUnavailableError

from langflow_sandbox_createos.component import artifacts
from langflow_sandbox_createos.core import (
    admission,
    budget,
    clock,
    connection,
    failures,
    guest_spec,
    network,
    pool_keeper,
    program_clock,
    settings,
    shape_catalog,
)
from langflow_sandbox_createos.core.native import load_native
from langflow_sandbox_createos.core.settings import DEFAULT_COMPONENT_SHAPE

logger = logging.getLogger("langflow_sandbox_createos.component")

NAME_PREFIX = "lf-c-"
MAX_TIMEOUT_SECONDS = settings.MAX_TIMEOUT_SECONDS
ARCHIVE_BUDGET_SECONDS = 30  # the archive step's own budget, outside the program's timeout
GUEST_READY_SECONDS = 120.0  # waiting for a reused guest to finish a transition or resume
INLINE_COMMAND_MAX = 64 * 1024  # longer commands go up as a file (one argv string is capped)
RUN_DIR_PREFIX = "/tmp/createos-run-"
ARTIFACTS_DIR = "/workspace/artifacts"
LOCK_PATH = "/tmp/.createos-sandbox.lock"

LIVE_TRANSITIONS = frozenset({"creating", "pausing", "resuming", "forking"})
TERMINAL = frozenset({"destroyed", "failed"})

PENDING_WAIT_SECONDS = 20  # a reused run waits this long for an earlier run's archive to be fetched
ARCHIVE_DIR = "/tmp/.createos-out"  # finished archives wait here for their host, out of later runs' way

# $1 run dir (created by the wrapper, after the lock), $2 program timeout, $3 collect (1/0),
# $4 archive budget, $5 archive byte cap, $6 lock wait (0 = no lock), $7 pending-archive wait,
# $8 where the program file goes ("" = none: an inline command), $9 how it arrives: "stdin"
# (the exec's stdin) or the sha256 of "$1.upload" (uploaded before the exec); then argv.
GUEST_WRAPPER = (
    r"""
run=$1 limit=$2 collect=$3 budget=$4 cap=$5 lockwait=$6 pendwait=$7 src=$8 from=$9
shift 9
art=/workspace/artifacts outdir=/tmp/.createos-out
# Builtins where a process is not needed (each one started costs the run about a millisecond):
# whole seconds from /proc/uptime (monotonic), or from date(1) where it cannot be read
if read now _ 2>/dev/null </proc/uptime; then clock=uptime; else clock=date; fi
secs() {
  now=
  if [ "$clock" = uptime ] && read now _ 2>/dev/null </proc/uptime; then now=${now%.*}; fi
  case $now in ''|*[!0-9]*) now=$(date +%s) ;; esac
}
# whether $1 exists, a dangling link included
there() { [ -e "$1" ] || [ -L "$1" ]; }
# whether the directory $outdir holds anything
pending() {
  for f in "$outdir"/* "$outdir"/.[!.]* "$outdir"/..?*; do
    if there "$f"; then return 0; fi
  done
  return 1
}
[ -d /workspace ] || mkdir -p /workspace 2>/dev/null
cd /workspace 2>/dev/null || cd /
if [ "$lockwait" -gt 0 ] && command -v flock >/dev/null 2>&1; then
  secs; began=$now
  exec 9>>/tmp/.createos-sandbox.lock
  if ! flock -w "$lockwait" 9; then
    echo "CreateOS Sandbox: another run kept this reused guest busy for more than ${lockwait}s" >&2
    exit 125
  fi
  # an earlier run's archive waits for its host: this run's program starts once it is gone
  # (the lock wait and this wait share one budget, $lockwait)
  secs; left=$(( lockwait - (now - began) ))
  if [ "$left" -lt "$pendwait" ]; then pendwait=$left; fi
  n=0
  while pending && [ "$n" -lt $((pendwait * 10)) ]; do
    sleep 0.1 2>/dev/null || sleep 1
    n=$((n + 1))
  done
  if there "$outdir"; then rm -rf -- "$outdir"; fi
fi
if ! mkdir -m 700 -- "$run" 2>/dev/null; then
  echo "CreateOS Sandbox: could not create the run directory $run" >&2
  exit 125
fi
if [ "$from" = stdin ]; then
  cat > "$src" || exit 125
elif [ -n "$src" ]; then
  mv -f -- "$run.upload" "$src" 2>/dev/null
  sum=$(sha256sum < "$src" 2>/dev/null) || sum=
  if [ -L "$src" ] || [ ! -f "$src" ] || { [ "${sum%% *}" != "$from" ] && { [ -n "$sum" ] || [ "$lockwait" -gt 0 ]; }; }; then
    echo "CreateOS Sandbox: the uploaded program is missing or was changed before it ran" >&2
    rm -rf -- "$run"
    exit 125
  fi
fi
if [ "$collect" = 1 ] && there "$art"; then rm -rf -- "$art"; fi
[ -d "$art" ] || mkdir -p -- "$art" 2>/dev/null
secs; start=$now
"""
    + program_clock.SH_START
    + r"""
# timeout's own stderr is discarded (it can print "Killed"); the program gets the real one
( timeout --signal=KILL "$limit" /bin/sh -c 'exec "$@" 2>&3 3>&-' program "$@" </dev/null 9>&-
  exit $? ) 3>&2 2>/dev/null
rc=$?
"""
    + program_clock.sh_stop(2)
    + r"""
if [ "$rc" -eq 137 ]; then secs; if [ $((now - start)) -ge "$limit" ]; then rc=124; fi; fi
if [ "$collect" = 1 ]; then
  ( timeout --signal=KILL "$budget" /bin/sh -c \
      'tar -czf - -C "$1" . 2>/dev/null | head -c "$2" > "$3"' archive "$art" "$cap" "$run/files.tar.gz" \
      </dev/null 9>&-
    exit $? ) 2>/dev/null
  rm -rf -- "$art"
  mkdir -p -- "$art" 2>/dev/null
  # out of the run directory before the lock is released; the host fetches and removes it
  mkdir -p -- "$outdir" 2>/dev/null
  mv -f -- "$run/files.tar.gz" "$outdir/${run##*/}.tar.gz" 2>/dev/null
fi
rm -rf -- "$run"
exit "$rc"
"""
)

Mode = Literal["python", "command"]
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
SWEEP_INTERVAL_SECONDS = 60.0  # at most one sweep of idle reused guests per process per minute
SWEEP_MAX_DELETES = 50
OutputCallback = Callable[[Literal["stdout", "stderr"], str], None]
T = TypeVar("T")


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
    (executor_sandbox), whose entries the guest replays with ``replay``."""

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
    the host flow's fields for a node that runs in a guest (executor_sandbox)."""
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


def reuse_name(flow_id: str, component_id: str, egress: tuple[str, ...], owner: tuple[str, ...]) -> str:
    """The guest's name for (flow, component, owner, network policy): 22 characters, `lf-c-`
    prefix. The parts are hashed as one JSON list, so no choice of a session id (which the
    caller picks) can make its parts read as another owner's."""
    return guest_spec.stable_name(NAME_PREFIX, json.dumps([flow_id, component_id, list(owner), list(egress)]))


def idle_seconds(record: dict[str, Any], now: float | None = None) -> float | None:
    """How long a reused guest has sat unused: since it paused, which CreateOS does after
    `auto_pause_after_seconds` without an exec. None while it is not paused (it ran within
    its auto-pause window) or when the control plane gave no pause time."""
    return clock.paused_seconds(record, time.time() if now is None else now)


def idle_expired(record: dict[str, Any], limit: float, now: float | None = None) -> bool:
    idle = idle_seconds(record, now)
    return idle is not None and idle > limit


# --- the per-process guest cache ---------------------------------------------------------


class _GuestIds:
    """name -> sandbox id of reused guests seen by this process. Only a hint: every use is
    verified with a GET, and a restarted worker finds its guest again by name."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: dict[str, str] = {}

    def get(self, name: str) -> str | None:
        with self._lock:
            return self._ids.get(name)

    def remember(self, name: str, sandbox_id: str) -> None:
        with self._lock:
            self._ids[name] = sandbox_id

    def forget(self, name: str, sandbox_id: str | None = None) -> None:
        with self._lock:
            if sandbox_id is None or self._ids.get(name) == sandbox_id:
                self._ids.pop(name, None)

    def clear(self) -> None:
        with self._lock:
            self._ids.clear()


guest_ids = _GuestIds()


def _after_acquire(client: Any, sandbox_id: str) -> None:
    """Test seam: runs between finding the guest and using it."""


# --- guest lookup --------------------------------------------------------------------------


class _GuestGone(Exception):
    """The guest vanished or is being destroyed: look it up again."""


def _sleep_step(attempt: int) -> float:
    return min(2.0, 0.25 * (1.25 ** max(0, attempt - 4)))


def _pick(rows: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    """The guest holding `name`: running first, then the oldest (so racing lookups agree)."""
    alive = [r for r in rows if r.get("name") == name and r.get("status") not in TERMINAL]
    if not alive:
        return None
    alive.sort(key=lambda r: (r.get("status") != "running", str(r.get("created_at") or ""), str(r.get("id"))))
    return alive[0]


def _wait_running(client: Any, native: Any, sandbox_id: str, deadline: float) -> dict[str, Any]:
    """Bring a guest to `running`: resume it when paused, wait out transitions."""
    attempt = 0
    while True:
        try:
            record = client.get(sandbox_id)
        except native.NotFoundError:
            raise _GuestGone from None
        status = record.get("status")
        if status == "running":
            return record
        if status == "paused":
            remaining = max(1.0, deadline - time.monotonic())
            try:
                record = client.resume(sandbox_id, wait=remaining)
            except native.ConflictError:
                pass  # another worker resumed it first: poll
            except native.NotFoundError:
                raise _GuestGone from None
            else:
                if record.get("status") == "running":
                    return record
        elif status in ("destroying", *TERMINAL):
            raise _GuestGone
        elif status not in LIVE_TRANSITIONS:
            raise SandboxUnavailableError(
                f"CreateOS: the reused guest {sandbox_id} is in state {status!r} and cannot run code. "
                f"Delete it (DELETE /v1/sandboxes/{sandbox_id}); the next run creates a fresh one."
            )
        if time.monotonic() >= deadline:
            raise SandboxExecutionError(
                f"CreateOS: the reused guest {sandbox_id} did not become running within "
                f"{GUEST_READY_SECONDS:g} s (last state {status!r}); retry later."
            )
        attempt += 1
        time.sleep(_sleep_step(attempt))


def _check_drift(record: dict[str, Any], wanted: tuple[str, ...], allow_network: bool) -> None:
    live = record.get("egress")
    if not network.egress_matches(live, wanted):
        raise SandboxUnavailableError(
            f"Refusing to reuse guest {record.get('id')} ({record.get('name')}): its egress rules are "
            f"{list(live or ['*'])}, but Allow Network {'on' if allow_network else 'off'} needs "
            f"{list(wanted)}. The rules were changed after the guest was created, so the network policy "
            f"this component shows would not be the one applied. Delete the guest "
            f"(DELETE /v1/sandboxes/{record.get('id')}) and the next run creates a fresh one."
        )


def acquire_reused_guest(
    endpoint: connection.Endpoint,
    native: Any,
    name: str,
    spec: dict[str, Any],
    wanted: tuple[str, ...],
    allow_network: bool,
    *,
    idle_limit: float | None = None,
    expired: list[str] | None = None,
) -> tuple[dict[str, Any], bool]:
    """The running guest named `name`, and whether it already existed (False: created now).

    Tries the id this process remembers (one GET), then a full, paginated lookup by name,
    then a create; a duplicate-name conflict means another worker won the race, so the
    lookup runs again and adopts its guest. A guest idle longer than `idle_limit` seconds is
    deleted instead of used (its id appended to `expired`), and a fresh one is created.

    A guest created here is not held in the pool keeper: other workers may be using it when
    this process ends (idle expiry, the sweep, auto-pause and reap bound it)."""
    client: Any = endpoint.client
    deadline = time.monotonic() + GUEST_READY_SECONDS
    attempt = 0
    while True:
        record: dict[str, Any] | None = None
        cached = guest_ids.get(name)
        if cached is not None:
            try:
                record = client.get(cached)
            except native.NotFoundError:
                record = None
            if record is not None and (record.get("name") != name or record.get("status") in TERMINAL):
                record = None
            if record is None:
                guest_ids.forget(name, cached)
        from_get = record is not None  # a full view; a list row may be abridged
        if record is None:
            record = _pick(client.list(prefix=name), name)
        if record is None:
            try:
                created = client.create(spec)
            except native.ConflictError:
                logger.debug("guest name %s was taken concurrently; adopting the winner", name)
            else:
                guest_ids.remember(name, created["id"])
                return created, False
        elif record.get("status") != "destroying":
            sandbox_id = str(record["id"])
            try:
                # decide on drift (and state) from a GET, never from a list row
                current = record if from_get else client.get(sandbox_id)
                if idle_limit is not None and idle_expired(current, idle_limit):
                    _delete_expired(client, native, current, idle_limit)
                    if expired is not None:
                        expired.append(sandbox_id)
                    raise _GuestGone
                _check_drift(current, wanted, allow_network)
                running = (
                    current
                    if current.get("status") == "running"
                    else _wait_running(client, native, sandbox_id, deadline)
                )
            except (_GuestGone, native.NotFoundError):
                guest_ids.forget(name, sandbox_id)
            else:
                guest_ids.remember(name, sandbox_id)
                return running, True
        if time.monotonic() >= deadline:
            raise SandboxExecutionError(
                f"CreateOS: could not find or create the reused guest {name} within "
                f"{GUEST_READY_SECONDS:g} s (it may still be being destroyed); retry later."
            )
        attempt += 1
        time.sleep(_sleep_step(attempt))


def _delete_expired(client: Any, native: Any, record: dict[str, Any], limit: float) -> None:
    sandbox_id = str(record["id"])
    logger.info(
        "deleting reused guest %s (%s): idle %.0f s, past CREATEOS_SANDBOX_REUSE_IDLE_SECONDS=%g",
        sandbox_id,
        record.get("name"),
        idle_seconds(record) or 0.0,
        limit,
    )
    pool_keeper.delete(client, sandbox_id)  # already gone (404) is as good


class _Sweeper:
    """Deletes every reused guest (`lf-c-`) idle past the lifetime, at most once per
    SWEEP_INTERVAL_SECONDS per process, from reused runs: a guest whose user never comes back
    is gone by the next reused run anyone makes after its lifetime, without a cron job."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last = float("-inf")

    def due(self) -> bool:
        with self._lock:
            now = time.monotonic()
            if now - self._last < SWEEP_INTERVAL_SECONDS:
                return False
            self._last = now
            return True

    def reset(self) -> None:
        with self._lock:
            self._last = float("-inf")

    def sweep(self, client: Any, native: Any, limit: float) -> list[str]:
        """Best effort: a failure is logged and the run goes on."""
        deleted: list[str] = []
        try:
            rows = client.list(prefix=NAME_PREFIX)
            now = time.time()
            for row in rows:
                if len(deleted) >= SWEEP_MAX_DELETES:
                    break
                name = str(row.get("name") or "")
                if not name.startswith(NAME_PREFIX) or row.get("status") != "paused":
                    continue
                record = row if "paused_at" in row else client.get(str(row["id"]))
                if idle_expired(record, limit, now):
                    _delete_expired(client, native, record, limit)
                    guest_ids.forget(name, str(record["id"]))
                    deleted.append(str(record["id"]))
        except native.CreateOSError as exc:
            logger.warning("sweeping idle reused guests failed: %s", failures.describe(exc))
        return deleted


sweeper = _Sweeper()


# --- one run -------------------------------------------------------------------------------


def _max_output_bytes() -> int:
    with failures.refusing_bad_settings():
        return settings.max_output_bytes()


@dataclass(frozen=True)
class _GuestProgram:
    run_dir: str
    argv: list[str]
    files: list[tuple[str, bytes]]  # uploaded before the exec
    stdin: str | None  # or sent as the exec's stdin, which the wrapper writes to a file
    exec_timeout: float

    @property
    def archive_path(self) -> str:
        """Where the wrapper leaves the archive for the host (outside the run directory)."""
        return f"{ARCHIVE_DIR}/{self.run_dir.rsplit('/', 1)[-1]}.tar.gz"


def lock_wait_seconds(timeout: int) -> int:
    """How long a run on a reused guest waits for its turn: one whole run of another (its own
    wait for the archive before it, its program, its archive step), then the wait for that
    run's archive to be fetched."""
    return PENDING_WAIT_SECONDS + timeout + ARCHIVE_BUDGET_SECONDS + 15 + PENDING_WAIT_SECONDS


def build_program(req: RunRequest, *, lock: bool) -> _GuestProgram:
    """The exec argv (`/bin/sh -c GUEST_WRAPPER ...`) and the files to upload first."""
    run_dir = RUN_DIR_PREFIX + secrets.token_hex(8)
    files: list[tuple[str, bytes]] = []
    stdin: str | None = None
    source = ""
    try:
        data = req.program.encode("utf-8")
        json_safe = True
    except UnicodeEncodeError:
        # lone surrogates cannot travel in a JSON string: the bytes are uploaded, and the
        # guest reports the invalid source exactly as it would locally
        data = req.program.encode("utf-8", "surrogatepass")
        json_safe = False
    if req.mode == "python":
        source = f"{run_dir}/main.py"
        program = ["python3", "-u", source]
    elif len(data) > INLINE_COMMAND_MAX:
        source = f"{run_dir}/main.sh"
        program = ["/bin/sh", source]
    else:
        program = ["/bin/sh", "-c", req.program]
    arrives = ""
    if source:
        if json_safe and len(data) <= guest_spec.STDIN_PROGRAM_MAX_BYTES:
            stdin = req.program  # written to `source` by the wrapper: one round trip fewer
            arrives = "stdin"
        else:
            # staged next to the run directory, which only exists once the wrapper holds the
            # lock; the wrapper moves it in and checks it is still these bytes
            files.append((f"{run_dir}.upload", data))
            arrives = hashlib.sha256(data).hexdigest()
    archive_budget = ARCHIVE_BUDGET_SECONDS if req.collect else 0
    lock_wait = lock_wait_seconds(req.timeout) if lock else 0
    pending_wait = PENDING_WAIT_SECONDS if lock else 0
    argv = [
        "-c",
        GUEST_WRAPPER,
        "createos-sandbox",
        run_dir,
        str(req.timeout),
        "1" if req.collect else "0",
        str(ARCHIVE_BUDGET_SECONDS),
        str(artifacts.MAX_ARCHIVE_BYTES),
        str(lock_wait),
        str(pending_wait),
        source,
        arrives,
        *program,
    ]
    exec_timeout = budget.component(lock_wait + req.timeout + archive_budget).exec_timeout()
    return _GuestProgram(run_dir, argv, files, stdin, exec_timeout)


def _outcome(result: Any, req: RunRequest, sandbox_id: str | None, reused: bool) -> RunOutcome:
    stderr, program_ms = program_clock.split_trailer(result.stderr)  # the wrapper's clock
    if result.stderr_truncated:
        stderr = program_clock.strip_cut_trailer(stderr)
    exit_code = int(result.exit_code)
    timed_out = bool(result.timed_out) or exit_code == 124
    start_error = result.error or None
    if start_error and exit_code == 0:
        exit_code = -1  # a command that never started must not read as a success
    if result.timed_out:
        exit_code = -1
    return RunOutcome(
        stdout=result.stdout,
        stderr=stderr,
        exit_code=exit_code,
        sandbox_id=sandbox_id,
        reused_guest=reused,
        timeout=req.timeout,
        timed_out=timed_out,
        start_error=start_error,
        output_truncated=bool(result.stdout_truncated or result.stderr_truncated),
        exec_ms=result.exec_ms if result.exec_ms is not None else program_ms,
    )


def _collect(
    client: Any, native: Any, sandbox_id: str, program: _GuestProgram, outcome: RunOutcome, retry: Callable
) -> None:
    """Download and read the run's archive into `outcome`; failures are reported, not raised."""
    try:
        blob = retry(
            lambda: client.download(sandbox_id, program.archive_path, max_bytes=artifacts.MAX_ARCHIVE_BYTES)
        )
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


def _resume_retry(client: Any, native: Any, sandbox_id: str) -> Callable[[Callable[[], T]], T]:
    """Call `fn`; if the guest answers 409 because it paused meanwhile, resume it and retry once."""

    def call(fn: Callable[[], T]) -> T:
        try:
            return fn()
        except native.ConflictError as exc:
            try:
                status = client.get(sandbox_id).get("status")
            except native.CreateOSError:
                raise exc from None
            if status == "running" and "paused" not in str(exc):
                raise
            logger.info("guest %s was %s at use; resuming it and retrying once", sandbox_id, status)
            try:
                _wait_running(client, native, sandbox_id, time.monotonic() + GUEST_READY_SECONDS)
            except _GuestGone:
                raise exc from None
            return fn()

    return call


def _upload_and_exec(
    client: Any, sandbox_id: str, program: _GuestProgram, max_output: int, on_output: OutputCallback | None
) -> Any:
    """Run `program` on an existing guest: its files go up first, then one exec."""
    for path, data in program.files:
        client.upload(sandbox_id, path, data)
    return client.exec(
        sandbox_id,
        "/bin/sh",
        program.argv,
        stdin=program.stdin,
        timeout=program.exec_timeout,
        max_output_bytes=max_output,
        on_output=on_output,
    )


def _run_reused(
    endpoint: connection.Endpoint,
    native: Any,
    req: RunRequest,
    spec: dict[str, Any],
    egress: tuple[str, ...],
    max_output: int,
    on_output: OutputCallback | None,
    phase: failures.Doing,
    note: Callable[[str], None],
    idle_limit: int,
) -> RunOutcome:
    client: Any = endpoint.client
    name = str(spec["name"])
    if sweeper.due():
        phase.action = "delete idle reused guests"
        sweeper.sweep(client, native, idle_limit)
    phase.action = f"find or create the reused guest {name}"
    note(f"Finding guest {name}…")
    expired: list[str] = []
    record, reused = acquire_reused_guest(
        endpoint, native, name, spec, egress, req.allow_network, idle_limit=idle_limit, expired=expired
    )
    sandbox_id = str(record["id"])
    wanted_pause = int(spec["auto_pause_after_seconds"])
    current_pause = record.get("auto_pause_after_seconds")
    if isinstance(current_pause, int) and current_pause < wanted_pause:
        phase.action = f"raise the auto-pause window of guest {sandbox_id}"
        client.patch(sandbox_id, {"auto_pause_after_seconds": wanted_pause})
    _after_acquire(client, sandbox_id)
    program = build_program(req, lock=True)
    retry = _resume_retry(client, native, sandbox_id)

    phase.action = f"run the program on guest {sandbox_id}"
    note(f"Running on {'reused' if reused else 'new'} guest {sandbox_id}…")
    result = retry(lambda: _upload_and_exec(client, sandbox_id, program, max_output, on_output))
    outcome = _outcome(result, req, sandbox_id, reused)
    if expired:
        outcome.reuse_notice = (
            f"The reused guest {', '.join(expired)} was idle longer than CREATEOS_SANDBOX_REUSE_IDLE_SECONDS="
            f"{idle_limit} and was deleted; this run started a fresh one."
        )
    if req.collect:
        note("Collecting files…")
        _collect(client, native, sandbox_id, program, outcome, retry)
        try:
            client.exec(sandbox_id, "/bin/rm", ["-f", program.archive_path], timeout=30.0, stream=False)
        except native.CreateOSError as exc:  # the next run drops it after its pending wait
            logger.warning("could not remove %s on guest %s: %s", program.archive_path, sandbox_id, exc)
    return outcome


def _run_fresh(
    endpoint: connection.Endpoint,
    native: Any,
    req: RunRequest,
    spec: dict[str, Any],
    max_output: int,
    on_output: OutputCallback | None,
    phase: failures.Doing,
    note: Callable[[str], None],
) -> RunOutcome:
    client: Any = endpoint.client
    program = build_program(req, lock=False)
    spec = {**spec, "name": guest_spec.random_name(NAME_PREFIX)}
    phase.action = "create a guest"
    note("Creating a guest…")
    sandbox_id = _create_held(endpoint, native, spec)
    try:
        phase.action = f"run the program on guest {sandbox_id}"
        note(f"Running on new guest {sandbox_id}…")
        result = _upload_and_exec(client, sandbox_id, program, max_output, on_output)
        outcome = _outcome(result, req, sandbox_id, False)
        if req.collect:
            note("Collecting files…")
            _collect(client, native, sandbox_id, program, outcome, lambda fn: fn())
        return outcome
    finally:
        try:
            pool_keeper.delete(client, sandbox_id)
        except native.CreateOSError as exc:  # still held: the keeper tries again at exit
            logger.warning("could not delete guest %s: %s", sandbox_id, failures.describe(exc))


def _create_held(endpoint: connection.Endpoint, native: Any, spec: dict[str, Any]) -> str:
    """Create a run's own guest and hold it in the pool keeper until it is deleted, so a
    process killed mid-run leaves it to the keeper."""
    client: Any = endpoint.client
    try:
        sandbox_id = str(client.create(spec)["id"])
    except native.CreateOSError as exc:
        failures.reap_lost_create(client, spec["name"], exc)
        raise
    pool_keeper.hold(endpoint, sandbox_id)
    return sandbox_id


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
    native = load_native()
    shapes = shape_catalog.catalog(endpoint)
    if req.shape not in {shape_id for _, shape_id in shapes}:
        raise SandboxUnavailableError(
            f"Shape {req.shape!r} is not in the CreateOS shape catalog. "
            f"Available: {', '.join(s for _, s in shapes) or 'none'}. "
            "Set the Shape input or CREATEOS_SANDBOX_SHAPE to one of them."
        )
    egress = network.egress_rules(req.allow_network)

    def announce_wait(ahead: int, in_flight: int) -> None:
        text = (
            f"{in_flight} CreateOS Sandbox run(s) in flight, the limit (CREATEOS_SANDBOX_MAX_GUESTS={max_guests}); "
            f"waiting in line behind {ahead} other(s)…"
        )
        logger.info("CreateOS Sandbox: %s", text)
        note(text)

    try:
        admission.component_line.enter(max_guests, announce_wait, max_wait)
    except admission.WaitedTooLong as exc:
        raise SandboxUnavailableError(
            admission.gave_up_text(
                "CreateOS Sandbox: this run",
                exc,
                "CREATEOS_SANDBOX_MAX_GUESTS",
                max_guests,
                "CREATEOS_SANDBOX_MAX_WAIT_SECONDS",
            )
        ) from None
    try:
        with failures.native_errors("reach the CreateOS control plane") as phase:
            if req.reuse:
                busy = lock_wait_seconds(req.timeout) + req.timeout + ARCHIVE_BUDGET_SECONDS
                spec = _spec(endpoint, req, rootfs, egress, busy)
                outcome = _run_reused(
                    endpoint, native, req, spec, egress, max_output, on_output, phase, note, idle_limit
                )
            else:
                spec = _spec(endpoint, req, rootfs, egress, req.timeout + ARCHIVE_BUDGET_SECONDS)
                outcome = _run_fresh(endpoint, native, req, spec, max_output, on_output, phase, note)
                outcome.reuse_notice = notice
    finally:
        admission.component_line.leave()
    if not req.allow_network:
        outcome.network_notice = NETWORK_OFF_NOTICE
    return outcome


def _spec(
    endpoint: connection.Endpoint, req: RunRequest, rootfs: str, egress: tuple[str, ...], busy_seconds: int
) -> dict[str, Any]:
    """The create request of this run's guest; a reused guest has a stable name."""
    guest = guest_spec.GuestSpec.of(
        endpoint,
        shape=req.shape,
        rootfs=rootfs,
        egress=egress,
        auto_pause_seconds=guest_spec.auto_pause_seconds(busy_seconds),
    )
    name = reuse_name(req.flow_id, req.component_id, egress, req.owner or ()) if req.reuse else None
    return guest.create_request(name)
