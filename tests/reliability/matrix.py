"""The fault matrix, generated: every control-plane call a surface makes x every fault
createos-local can inject x every surface, with what the product contract says must happen.

The contract (docs/backend.md, docs/component.md, docs/executor.md, docs/native-client.md):

- a non-429 4xx is ``SandboxUnavailableError`` (fail closed: the account or a setting must
  change); 429, 5xx, transport failures, protocol violations and deadlines are
  ``SandboxExecutionError`` (transient);
- the backend's preflight (``GET /v1/whoami``) is the documented exception: a control plane
  that cannot be reached there, or that does not speak the CreateOS API, is
  ``SandboxUnavailableError`` (docs/backend.md, "Errors");
- a 404 on the streaming exec falls back to the buffered exec (native client), so the run
  succeeds;
- a fault on a delete never fails a run that succeeded; the failure is logged and the guest
  is left to auto-pause (docs/backend.md step 5, docs/executor.md "Closing early",
  docs/component.md);
- the component never raises for returned files: a failed download is reported in
  ``artifacts_truncated`` / ``artifacts_message``;
- a stream that started but did not finish by its deadline is a result with
  ``timed_out`` (backend: exit code -1 plus a note; component: ``timed_out``), except in the
  executor, where a run without outputs is an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

U = "SandboxUnavailableError"
E = "SandboxExecutionError"

RETRY_AFTER = 2
DRIP_BYTES_PER_SEC = 2
RESET_AFTER_BYTES = 20

# name -> fault rule (without route); every rule stays until the faults are cleared.
FAULTS: dict[str, dict[str, Any]] = {
    "401": {"status": 401},
    "402": {"status": 402},
    "403": {"status": 403},
    "404": {"status": 404},
    "409": {"status": 409},
    "429": {"status": 429, "retry_after": RETRY_AFTER},
    "500": {"status": 500},
    "503": {"status": 503},
    "non-json": {"body": "non-json"},  # an HTML proxy page, 502
    "wrong-envelope": {"body": "wrong-envelope"},  # 200, JSON that is not JSend
    "truncated": {"body": "truncated"},  # 200, Content-Length longer than the body
    "reflect-headers": {"body": "reflect-headers"},  # 500 quoting every request header
    "reset": {"reset": True},  # RST before any answer
    "reset-mid": {"reset": True, "after_bytes": RESET_AFTER_BYTES},  # real answer, cut mid-body
    "hang": {"hang": True},
    "drip": {"drip_bytes_per_sec": DRIP_BYTES_PER_SEC},  # real answer, a few bytes per second
}

STATUS_OF = {
    "401": 401,
    "402": 402,
    "403": 403,
    "404": 404,
    "409": 409,
    "429": 429,
    "500": 500,
    "503": 503,
    "non-json": 502,
    "reflect-headers": 500,
}

# call -> createos-local route name
CALLS: dict[str, str] = {
    "whoami": "whoami",
    "shapes": "shapes",
    "create": "create",
    "list": "list",
    "get": "get",
    "resume": "resume",
    "upload": "files_put",
    "exec": "exec",  # buffered
    "exec_stream": "exec_stream",
    "download": "files_get",
    "delete": "delete",
}

SURFACES = ("backend", "component", "component-files", "component-reuse", "executor")

_NO_REUSE = "makes no guest lookup: every run creates its own guest"
# (surface, call) pairs that do not exist: the surface never makes that call, so there is no
# cell to run (none is generated; the coverage line of the summary counts them).
NOT_MADE: dict[tuple[str, str], str] = {
    ("backend", "list"): "the backend " + _NO_REUSE,
    ("backend", "get"): "the backend " + _NO_REUSE,
    ("backend", "resume"): "the backend never pauses or resumes: its guests are deleted after each run",
    (
        "backend",
        "download",
    ): "the backend returns no files (lfx's protocol carries stdout/stderr/exit code only)",
    (
        "component",
        "whoami",
    ): "only the backend preflights with whoami; the component's first call is the shape catalog",
    ("component", "list"): "reuse off " + _NO_REUSE,
    ("component", "get"): "reuse off " + _NO_REUSE,
    ("component", "resume"): "reuse off never resumes: the guest is fresh",
    ("component", "download"): "Return Files off downloads nothing (covered by component-files)",
    ("component-files", "whoami"): "only the backend preflights with whoami",
    ("component-files", "list"): "reuse off " + _NO_REUSE,
    ("component-files", "get"): "reuse off " + _NO_REUSE,
    ("component-files", "resume"): "reuse off never resumes: the guest is fresh",
    ("component-reuse", "whoami"): "only the backend preflights with whoami",
    ("component-reuse", "delete"): "a reused guest is never deleted by the component (docs/component.md)",
    ("executor", "whoami"): "the executor makes no preflight: its first call is the create",
    (
        "executor",
        "shapes",
    ): "the executor pins its shape (CREATEOS_EXECUTOR_SHAPE) and never reads the catalog",
    ("executor", "list"): "the executor " + _NO_REUSE,
    ("executor", "get"): "the executor " + _NO_REUSE,
    ("executor", "resume"): "the executor never resumes: its guest is fresh and deleted after the run",
    (
        "executor",
        "download",
    ): "the executor downloads nothing: outputs come back as frames on the exec stream",
}

# Deadlines the matrix configures (short, so the hang and drip cases stay cheap).
CONTROL_TIMEOUT = 2  # CREATEOS_SANDBOX_CONTROL_TIMEOUT_SECONDS for hang/drip cases
CONTROL_TIMEOUT_NORMAL = 15  # for every other case: never the reason a case fails
PROGRAM_TIMEOUT_SHORT = 1  # program timeout when the exec itself hangs or drips
BACKEND_GRACE = 1.0  # budget.BACKEND_GRACE_SECONDS in the matrix
COMPONENT_GRACE = 1  # budget.COMPONENT_GRACE_SECONDS
COMPONENT_ARCHIVE = 3  # wrapper.ARCHIVE_BUDGET_SECONDS
COMPONENT_LOCK_WAIT = 2  # wrapper.lock_wait_seconds(...)
COMPONENT_PENDING_WAIT = 1  # wrapper.PENDING_WAIT_SECONDS (shares COMPONENT_LOCK_WAIT's budget)
COMPONENT_READY = 4.0  # reuse.GUEST_READY_SECONDS
EXECUTOR_GRACE = 2.0  # executor.EXEC_GRACE_SECONDS
EXECUTOR_TIMEOUT_SHORT = 2  # CREATEOS_EXECUTOR_TIMEOUT_SECONDS when the exec hangs or drips
EXECUTOR_CLOSE_WAIT = 5.0  # executor.CLOSE_WAIT_SECONDS (unchanged)
MARGIN = 4.0  # seconds over a deadline a case may take (a loaded 2-core CI box)
# A whole flow in a guest (lfx imported there: seconds of CPU) has no configured deadline that
# says how long it takes: the case's bound is this many times a healthy run of the same flow,
# measured in the same lane just before the case, plus the case's own deadlines.
HEALTHY_FACTOR = 3.0
FULL_FLOW_ESTIMATE = 20.0  # seconds: for ordering the cases only, before anything is measured


@dataclass(frozen=True)
class Case:
    surface: str
    call: str
    fault: str

    @property
    def id(self) -> str:
        return f"{self.surface}-{self.call}-{self.fault}"

    @property
    def route(self) -> str:
        return CALLS[self.call]

    @property
    def slow(self) -> bool:
        """hang or drip: the case is about a deadline."""
        return self.fault in ("hang", "drip")

    @property
    def exec_call(self) -> bool:
        return self.call in ("exec", "exec_stream")


@dataclass
class Expect:
    """What the contract says a case ends with."""

    kind: str  # "raise" | "ok" | "timed_out"
    cls: str | None = None  # U or E when kind == "raise"
    fragments: tuple[str, ...] = ()  # all must appear in the error message
    any_of: tuple[str, ...] = ()  # at least one must appear (when given)
    files_missing: bool = False  # component: artifacts_truncated with a message
    delete_fault: bool = False  # the guest may be left only as documented
    leak_ok_reason: str = ""
    notes: list[str] = field(default_factory=list)


def _generic(fault: str) -> Expect:
    """The contract for a fault that reaches the caller as an error."""
    status = STATUS_OF.get(fault)
    if fault in ("401", "402", "403", "404", "409"):
        hint = {
            "401": "CREATEOS_SANDBOX_API_KEY",
            "402": "credit",
            "403": "quota",
            "404": "does not exist",
            "409": "not in a state that allows this",
        }[fault]
        return Expect("raise", U, (f"HTTP {status}", hint))
    if fault == "429":
        return Expect("raise", E, ("HTTP 429", "retry later", f"Retry-After: {RETRY_AFTER}"))
    if status is not None:  # 5xx, the HTML page (502), reflected headers (500)
        return Expect("raise", E, (f"HTTP {status}", "retry later"))
    if fault in ("hang", "drip"):
        return Expect("raise", E, ("did not answer in time", "CREATEOS_SANDBOX_BASE_URL"))
    # wrong envelope, truncated body, reset before or during the answer
    return Expect("raise", E, ("CREATEOS_SANDBOX_BASE_URL",))


def expect(case: Case) -> Expect:
    s, c, f = case.surface, case.call, case.fault
    if c == "delete":
        return Expect("ok", delete_fault=True)
    if c == "download":  # component only: files are reported, never raised
        return Expect("ok", files_missing=True)
    if c == "exec_stream" and f == "404":
        return Expect("ok", notes=["404 on the streaming exec: buffered fallback"])
    if c == "exec_stream" and f == "drip":
        if s == "executor":
            return Expect("raise", E, ("timed out", "CREATEOS_EXECUTOR_TIMEOUT_SECONDS"))
        return Expect("timed_out")
    if s == "component-reuse" and c == "exec":
        # with streaming on, the reused guest's only buffered exec is the clean-up of the run
        # directory after the files were collected: logged, never fatal
        return Expect("ok", notes=["buffered exec = run-directory clean-up (warning only)"])
    if s == "backend" and c == "whoami":
        if f in ("wrong-envelope", "truncated", "reset-mid"):
            return Expect(
                "raise", U, ("did not answer like a CreateOS control plane", "CREATEOS_SANDBOX_BASE_URL")
            )
        if f in ("reset", "hang"):
            # nothing answered at all: "unreachable" (a drip did answer: a plain deadline)
            return Expect("raise", U, ("is unreachable", "CREATEOS_SANDBOX_BASE_URL"))
        if f == "404":
            return Expect("raise", U, ("HTTP 404", "GET /v1/whoami"))
        return _generic(f)
    if s == "executor" and c in ("exec", "exec_stream") and f in ("wrong-envelope",):
        # a 200 that is not an exec stream: no frames, no exit status -> the runner "exited"
        return Expect("raise", E, ())
    if s.startswith(("backend", "component")) and c == "exec_stream" and f == "wrong-envelope":
        # a 200 that is not an exec stream: no exit status
        return Expect("raise", E, ("ended without an exit status",))
    if s == "component-reuse":
        if c == "resume" and f in ("404", "409"):
            # 409: "another worker resumed it first" -> poll; 404: "gone" -> look it up again;
            # both end at the readiness deadline as a transient failure
            return Expect(
                "raise", E, ("retry later",), any_of=("did not become running", "could not find or create")
            )
        if c == "create" and f == "409":
            # a duplicate name means another worker won the race: look it up again, until
            # the readiness deadline
            return Expect("raise", E, ("could not find or create the reused guest", "retry later"))
        if c == "get" and f == "404":
            return Expect(
                "raise", E, ("retry later",), any_of=("did not become running", "could not find or create")
            )
    return _generic(f)


def deadline(case: Case, healthy_flow: float | None = None) -> float:
    """The longest a case may take by its configured deadlines (before MARGIN). A full-flow
    case (``full_flow``) is bounded by ``healthy_flow``, the seconds a healthy run of the same
    flow took in the same lane just before it (an estimate when None: ordering only)."""
    s, c, f = case.surface, case.call, case.fault
    healthy = 6.0 if s != "executor" else 8.0
    if full_flow(case):
        healthy = HEALTHY_FACTOR * (FULL_FLOW_ESTIMATE if healthy_flow is None else healthy_flow)
    if s == "component-reuse" and c in ("get", "resume", "create") and f in ("404", "409"):
        return COMPONENT_READY + 2 * CONTROL_TIMEOUT_NORMAL + healthy
    if not case.slow:
        return healthy
    if case.exec_call and f in ("hang", "drip"):
        if s == "backend":
            per = PROGRAM_TIMEOUT_SHORT + BACKEND_GRACE
        elif s == "component":
            per = PROGRAM_TIMEOUT_SHORT + COMPONENT_GRACE
        elif s == "component-files":
            per = PROGRAM_TIMEOUT_SHORT + COMPONENT_ARCHIVE + COMPONENT_GRACE
        elif s == "component-reuse":
            if c == "exec":  # the clean-up exec: 30 s budget of its own, stopped by the drip/hang
                per = 30.0
            else:
                per = COMPONENT_LOCK_WAIT + PROGRAM_TIMEOUT_SHORT + COMPONENT_ARCHIVE + COMPONENT_GRACE
        else:
            per = EXECUTOR_TIMEOUT_SHORT + EXECUTOR_GRACE
        return healthy + per + 1.0
    if c == "delete":
        if s == "backend":
            return healthy  # queued on the I/O thread: off the critical path
        if s == "executor":
            return healthy + EXECUTOR_CLOSE_WAIT
        return healthy + CONTROL_TIMEOUT + 1.0  # component: one synchronous delete
    if s == "component-reuse" and c == "resume":
        return healthy + COMPONENT_READY + CONTROL_TIMEOUT + 1.0
    return healthy + CONTROL_TIMEOUT + 1.0


# Delete faults after which the executor's delete thread logs "could not delete guest": every
# fault but 404 (the native client counts it as deleted, docs/native-client.md). Filled in from
# what the 16 cells log; see test_fault_matrix._check.
EXECUTOR_DELETE_WARNS = frozenset(FAULTS) - {"404"}


def full_flow(case: Case) -> bool:
    """Executor cases whose flow really runs in the guest (seconds of lfx import)."""
    if case.surface != "executor":
        return False
    if case.call == "delete":
        return True
    return (case.exec_call and case.fault == "reset-mid") or (
        case.call == "exec_stream" and case.fault == "404"
    )


def pairs() -> list[tuple[str, str]]:
    """Every (surface, call) pair that exists: the surface makes that call."""
    return [(s, c) for s in SURFACES for c in CALLS if (s, c) not in NOT_MADE]


def all_cases() -> list[Case]:
    """Every cell that exists: every existing pair x every fault. All of them run."""
    return [Case(s, c, f) for s, c in pairs() for f in FAULTS]


def coverage(run: int) -> list[str]:
    """The matrix's coverage, for the session summary."""
    existing = pairs()
    per_surface = {s: [c for t, c in existing if t == s] for s in SURFACES}
    cells = len(existing) * len(FAULTS)
    lines = [
        f"coverage: {len(existing)} of {len(SURFACES) * len(CALLS)} surface x call pairs exist "
        f"x {len(FAULTS)} faults = {cells} cells; {run} run",
    ]
    lines += [f"  {s}: {', '.join(calls)}" for s, calls in per_surface.items()]
    return lines
