"""The fault matrix (see matrix.py for the contract): every control-plane call each surface
makes x every fault createos-local injects x every surface, with five checks per case:

1. the outcome is the contract's (the exact lfx class, a message naming the status and the
   fix; or a result where the contract says the run goes on);
2. the API key appears nowhere: messages, reprs, tracebacks, and every log record at DEBUG
   of every logger (for a delete fault, also every record of any thread naming the case's
   guests: the executor's "could not delete guest" line comes from its delete thread);
3. the call returns within its configured deadline plus a small margin; a case that runs a
   whole flow in a guest, within 3 x a healthy run of that flow measured in the same lane
   just before it, plus its own deadlines;
4. once the faults are cleared, no guest is left behind, except a deliberately reused one
   or, for a delete fault, one whose failed delete was logged (the documented behaviour);
5. the fault fired: createos-local counts each rule's hits, and a case whose rule never fired
   proves nothing (a clean result would pass whether or not the fault happened).

All cases run up front in parallel lanes (one createos-local per lane, RELIABILITY_LANES,
default 8), then each case is reported as its own test. Only cells that exist are generated
(a call a surface never makes has no cell: matrix.NOT_MADE says why), and every one of them
runs; the summary prints the coverage.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import queue
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from waiting import wait_status

from langflow_sandbox_createos.component import reuse, wrapper
from langflow_sandbox_createos.core import budget, connection, lease, network
from langflow_sandbox_createos.executor import run as executor_module

from . import harness, matrix
from .conftest import SUMMARY
from .harness import Lane, Outcome, driver, lane_env, leaks_key
from .matrix import Case, expect

LANES = int(os.environ.get("RELIABILITY_LANES", "8"))
RUN_CASES = matrix.all_cases()
ONLY = os.environ.get("RELIABILITY_MATRIX_ONLY")  # e.g. "backend" or "backend-create" (debugging)
if ONLY:
    RUN_CASES = [c for c in RUN_CASES if c.id.startswith(ONLY)]

OK_TEXT = "matrix-ok"
PY_OK = f"print({OK_TEXT!r})"
PY_FILES = (
    "import os\nos.makedirs('/workspace/artifacts', exist_ok=True)\n"
    "open('/workspace/artifacts/r.txt', 'w').write('r')\n" + PY_OK
)
# Over the 256 KiB stdin limit (guest_spec.STDIN_PROGRAM_MAX_BYTES), so the program goes up
# with PUT .../files: what the upload cases need, on the backend and the component alike.
PAD = "_pad = '" + "x" * (300 * 1024) + "'\n"
PY_BIG = PAD + PY_OK


@dataclass
class CaseResult:
    case: Case
    outcome: Outcome | None = None
    failures: list[str] = field(default_factory=list)
    leftovers: list[dict[str, Any]] = field(default_factory=list)
    crashed: str | None = None
    hits: list[int] = field(default_factory=list)  # createos-local's count for the case's rule
    healthy: float | None = None  # full-flow cases: a healthy run's seconds, just before
    created: set[str] = field(default_factory=set)  # guests the case's run made
    delete_warnings: list[str] = field(default_factory=list)  # delete faults: the lines logged


# --- one case, in one lane ----------------------------------------------------------------------


def _component_id(case: Case) -> str:
    return "CreateOSSandbox-" + hashlib.blake2s(case.id.encode(), digest_size=5).hexdigest()


def _reuse_name(case: Case) -> str:
    return reuse.reuse_name("noflow", _component_id(case), network.egress_rules(False), harness.REUSE_OWNER)


def _env(case: Case, lane: Lane) -> dict[str, str]:
    short_exec = case.exec_call and case.slow
    control = matrix.CONTROL_TIMEOUT if case.slow and not case.exec_call else matrix.CONTROL_TIMEOUT_NORMAL
    return lane.env(
        CREATEOS_SANDBOX_CONTROL_TIMEOUT_SECONDS=str(control),
        LANGFLOW_SANDBOX_TIMEOUT_SECONDS=str(matrix.PROGRAM_TIMEOUT_SHORT if short_exec else 30),
        CREATEOS_EXECUTOR_TIMEOUT_SECONDS=str(matrix.EXECUTOR_TIMEOUT_SHORT if short_exec else 180),
    )


def _faults(case: Case) -> dict[str, Any]:
    rule = {"route": case.route, **matrix.FAULTS[case.fault]}
    faults: dict[str, Any] = {"rules": [rule]}
    if case.call == "exec" and case.surface != "component-reuse":
        faults["streaming"] = False  # the buffered exec is the fallback of a 404 on streaming
    return faults


def _run_surface(case: Case) -> Outcome:
    s = case.surface
    if s == "backend":
        return driver.backend(PY_BIG if case.call == "upload" else PY_OK)
    if s == "executor":
        return driver.executor(OK_TEXT)
    timeout = matrix.PROGRAM_TIMEOUT_SHORT if (case.exec_call and case.slow) else 30
    program = PY_FILES if s != "component" else PY_OK
    return driver.component(
        PAD + program if case.call == "upload" else program,
        component_id=_component_id(case),
        reuse=s == "component-reuse",
        collect=s in ("component-files", "component-reuse"),
        timeout=timeout,
    )


def _prepare_reuse(case: Case, lane: Lane) -> None:
    """get and resume need a guest this process already knows; resume needs it paused."""
    if case.surface != "component-reuse" or case.call not in ("get", "resume"):
        return
    warm = driver.component(PY_FILES, component_id=_component_id(case), reuse=True, collect=True, timeout=30)
    if warm.raised:
        raise AssertionError(f"warm-up run failed: {warm.exc!r}")
    if case.call == "resume":
        client: Any = lane.endpoint().client
        sandbox_id = warm.details["sandbox_id"]
        client.pause(sandbox_id)
        wait_status(client, sandbox_id, "paused")


def _healthy_flow(case: Case) -> float:
    """A healthy run of the case's flow, in the same lane and settings, just before the case:
    the yardstick of its time bound (matrix.deadline)."""
    out = driver.executor(OK_TEXT)
    if out.exc is not None or OK_TEXT not in out.stdout:
        raise AssertionError(f"the healthy run before the case failed: {out.exc or out.value!r:.300}")
    return out.elapsed


def _fired(case: Case, lane: Lane, exp: matrix.Expect) -> list[int]:
    """The case's rule hits, read before the faults are cleared. A delete may still be on its
    way when the run returns (the backend queues it): wait for it to meet the fault."""
    deadline = time.monotonic() + (matrix.CONTROL_TIMEOUT + 3.0 if exp.delete_fault else 0.0)
    while True:
        hits = lane.plane.fault_hits()
        if hits[0] or time.monotonic() >= deadline:
            return hits
        time.sleep(0.05)


def _settle(
    case: Case, lane: Lane, before: set[str], exp: matrix.Expect, logs: harness.LogCapture
) -> list[dict[str, Any]]:
    """Clear the faults, let deletes finish, return the guests of this case still live."""
    lane.plane.clear_faults()
    if case.surface == "backend":
        harness.drain_backend_deletes()
    elif exp.delete_fault and case.surface == "executor":
        # the run returned before its guest's delete did: wait for the delete threads (their
        # calls are bounded by the control timeout, a retry included)
        lease.wait_for_deletes(2.0 * matrix.CONTROL_TIMEOUT + 2.0)
    elif exp.delete_fault and case.surface.startswith("component"):
        # what the next run or process exit does: log the native client's retried deletes
        for endpoint in connection.endpoints.all():
            if endpoint.base_url == lane.plane.url:
                lease.collect_deletes(endpoint.client, 2.0 * matrix.CONTROL_TIMEOUT + 2.0)
    keep = _reuse_name(case) if case.surface == "component-reuse" else None
    # deletes were drained above; the executor's delete thread may still wait on its call
    wait = matrix.CONTROL_TIMEOUT + 2.0 if exp.delete_fault else 10.0
    deadline = time.monotonic() + wait
    while True:
        live = [sb for sb in lane.plane.live_sandboxes() if sb["id"] not in before and sb.get("name") != keep]
        if not live or time.monotonic() > deadline:
            return live
        if exp.delete_fault and all(logs.mentioning(sb["id"], min_level=30) for sb in live):
            return live  # every leftover is already accounted for by its warning
        time.sleep(0.1)


def _check(
    case: Case, exp: matrix.Expect, out: Outcome, logs: harness.LogCapture, lane: Lane, result: CaseResult
) -> list[str]:
    failures: list[str] = []
    leftovers = result.leftovers
    # 5. the fault fired (first: a case whose fault never fired passes for the wrong reason)
    if not result.hits or result.hits[0] < 1:
        failures.append(f"the fault never fired: {case.route} was not called under it (hits {result.hits})")
    # 1. outcome
    if exp.kind == "raise":
        if out.exc is None:
            failures.append(f"expected {exp.cls}, got a result: {out.value!r:.300}")
        else:
            name = type(out.exc).__name__
            module = type(out.exc).__module__
            if name != exp.cls or module != "lfx.utils.sandbox.base":
                failures.append(f"expected {exp.cls}, got {module}.{name}: {out.exc}")
            message = str(out.exc)
            missing = [f for f in exp.fragments if f not in message]
            if missing:
                failures.append(f"message lacks {missing}: {message}")
            if exp.any_of and not any(f in message for f in exp.any_of):
                failures.append(f"message has none of {list(exp.any_of)}: {message}")
    else:
        if out.exc is not None:
            failures.append(f"expected a {exp.kind} result, got {type(out.exc).__name__}: {out.exc}")
        elif exp.kind == "timed_out":
            if case.surface == "backend":
                stderr = out.details.get("stderr", "")
                if out.exit_code != -1 or "[createos: no exit status within" not in stderr:
                    failures.append(
                        f"expected exit -1 with a deadline note, got {out.exit_code} {stderr!r:.300}"
                    )
            elif not out.timed_out or out.exit_code != -1:
                failures.append(f"expected timed_out with exit -1, got {out.value!r:.300}")
        else:
            if OK_TEXT not in out.stdout or out.exit_code != 0:
                failures.append(f"expected a clean run printing {OK_TEXT}, got {out.value!r:.400}")
            if exp.files_missing:
                message = str(out.details.get("artifacts_message", ""))
                if not out.details.get("artifacts_truncated") or not message:
                    failures.append(f"a failed download must be reported, got {out.value!r:.300}")
                status = matrix.STATUS_OF.get(case.fault)
                if status and f"HTTP {status}" not in message and case.fault != "404":
                    failures.append(f"artifacts_message does not name HTTP {status}: {message}")
            elif (
                case.surface in ("component-files", "component-reuse")
                and out.details.get("artifact_count") != 1
            ):
                failures.append(f"expected the one returned file, got {out.value!r:.300}")
    # 2. the key, nowhere
    texts = out.exc_texts() + out.reprs + [repr(out.details)]
    if any(leaks_key(t) for t in texts):
        failures.append("the API key appears in the error, a repr or the result")
    leaked = [t for t in logs.texts(case.id) if leaks_key(t)]
    if leaked:
        failures.append(f"the API key appears in {len(leaked)} log record(s): {leaked[0][:300]}")
    if exp.delete_fault:
        # a failed delete is logged by whichever thread ran it (the executor's delete thread,
        # the native client's I/O thread): every record naming the case's guests, any thread
        naming = [t for sid in sorted(result.created) for t in logs.mentioning(sid)]
        result.delete_warnings = [t for t in naming if "could not delete guest" in t]
        if any(leaks_key(t) for t in naming):
            failures.append(f"the API key appears in a record naming the case's guest: {naming}")
        if case.surface == "executor" and case.fault in matrix.EXECUTOR_DELETE_WARNS:
            warned = [t for t in naming if "CreateOS executor: could not delete guest" in t]
            if not warned:
                failures.append(f"no 'could not delete guest' warning for {sorted(result.created)}: {naming}")
    # 3. the deadline
    if matrix.full_flow(case) and result.healthy is None:
        failures.append("a full-flow case without its healthy run")
    bound = matrix.deadline(case, result.healthy) + matrix.MARGIN
    if out.elapsed > bound:
        measured = f" (a healthy run took {result.healthy:.1f} s just before)" if result.healthy else ""
        failures.append(f"took {out.elapsed:.1f} s, over its deadline bound of {bound:.1f} s{measured}")
    # 4. no guest left behind (a failed delete may leave one, logged: the documented behaviour)
    for sb in leftovers:
        if exp.delete_fault:
            # left for auto-pause: the guest must carry its cost backstop
            view: Any = lane.endpoint().client.get(sb["id"])  # type: ignore[attr-defined]
            if (
                not isinstance(view.get("auto_pause_after_seconds"), int)
                or view["auto_pause_after_seconds"] < 60
            ):
                failures.append(f"guest {sb['id']} left without an auto-pause backstop: {view}")
            logged = logs.mentioning(sb["id"], min_level=30)
            if case.fault == "404":
                continue  # the native client counts 404 as "already deleted" (docs/native-client.md)
            if logged:
                continue
            failures.append(f"guest {sb['id']} left behind after a delete fault without a warning")
        else:
            failures.append(f"guest left behind: {sb}")
    return failures


def _run_case(case: Case, lane: Lane, logs: harness.LogCapture) -> CaseResult:
    result = CaseResult(case)
    exp = expect(case)
    with lane_env.use(_env(case, lane)), logs.case(case.id):
        try:
            harness.reset_preflight(lane.plane.url)
            _prepare_reuse(case, lane)
            if matrix.full_flow(case):
                result.healthy = _healthy_flow(case)
            before = lane.ids()
            lane.plane.set_faults(_faults(case))
            try:
                out = _run_surface(case)
                result.hits = _fired(case, lane, exp)
            finally:
                lane.plane.clear_faults()
            result.outcome = out
            result.leftovers = _settle(case, lane, before, exp, logs)
            result.created = lane.ids() - before
            result.failures = _check(case, exp, out, logs, lane, result)
        except BaseException:
            result.crashed = traceback.format_exc()
        finally:
            lane.plane.clear_faults()
            lane.plane.delete_all()
            reuse.guest_ids.forget(_reuse_name(case))
            lane.plane.wait_until_no_live(timeout=10.0)
    return result


# --- the whole matrix, up front ------------------------------------------------------------------


def _cost(case: Case) -> float:
    """Longest first, so the lanes finish together."""
    return (100.0 if matrix.full_flow(case) else 0.0) + matrix.deadline(case)


@contextlib.contextmanager
def _matrix_patches(phase: str) -> Iterator[None]:
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(budget, "BACKEND_GRACE_SECONDS", matrix.BACKEND_GRACE)
        mp.setattr(budget, "COMPONENT_GRACE_SECONDS", matrix.COMPONENT_GRACE)
        mp.setattr(wrapper, "ARCHIVE_BUDGET_SECONDS", matrix.COMPONENT_ARCHIVE)
        mp.setattr(wrapper, "lock_wait_seconds", lambda timeout: matrix.COMPONENT_LOCK_WAIT)
        mp.setattr(wrapper, "PENDING_WAIT_SECONDS", matrix.COMPONENT_PENDING_WAIT)
        mp.setattr(reuse, "GUEST_READY_SECONDS", matrix.COMPONENT_READY)
        mp.setattr(budget, "EXECUTOR_GRACE_SECONDS", matrix.EXECUTOR_GRACE)
        if phase == "spec-upload":
            # every executor run uploads its spec (normally only specs over 4 MiB do)
            mp.setattr(executor_module, "STDIN_SPEC_MAX_BYTES", 0)
        yield
    finally:
        mp.undo()


def _lane_loop(lane: Lane, work: queue.Queue[Case], logs: harness.LogCapture) -> None:
    while True:
        try:
            case = work.get_nowait()
        except queue.Empty:
            return
        RESULTS[case.id] = _run_case(case, lane, logs)


def _phase_of(case: Case) -> str:
    return "spec-upload" if (case.surface == "executor" and case.call == "upload") else "main"


RESULTS: dict[str, CaseResult] = {}
_STATS: dict[str, Any] = {}


@pytest.fixture(scope="module")
def matrix_results() -> Iterator[dict[str, CaseResult]]:
    if RESULTS:
        yield RESULTS
        return
    lanes_n = max(1, min(LANES, len(RUN_CASES)))
    planes = harness.start_planes(lanes_n)
    lanes = [Lane(i, p) for i, p in enumerate(planes)]
    driver.component_cls()  # load lfx's extension once, before the threads
    harness.chat_graph()  # and lfx's components
    started = time.monotonic()
    try:
        with harness.lane_settings_installed(), harness.capture_all_logs() as logs:
            for phase in ("main", "spec-upload"):
                cases = sorted((c for c in RUN_CASES if _phase_of(c) == phase), key=_cost, reverse=True)
                if not cases:
                    continue
                work: queue.Queue[Case] = queue.Queue()
                for case in cases:
                    work.put(case)
                with _matrix_patches(phase):
                    threads = [
                        threading.Thread(
                            target=_lane_loop, args=(lane, work, logs), name=f"lane-{lane.index}"
                        )
                        for lane in lanes
                    ]
                    for t in threads:
                        t.start()
                    for t in threads:
                        t.join()
            _STATS["unattributed_key_leaks"] = [t for c, t in logs.key_leaks()]
            _STATS["log_records"] = len(logs.records)
    finally:
        for lane in lanes:
            harness.forget_endpoint(lane.plane.url)
            lane.plane.stop()
    _STATS["seconds"] = time.monotonic() - started
    _STATS["lanes"] = lanes_n
    _summarize()
    report = os.environ.get("RELIABILITY_REPORT")
    if report:
        import json

        with open(report, "w") as fh:
            json.dump(
                {
                    "stats": {k: v for k, v in _STATS.items() if k != "unattributed_key_leaks"},
                    "cases": {
                        cid: {
                            "elapsed": r.outcome.elapsed if r.outcome else None,
                            "healthy_flow": r.healthy,
                            "hits": r.hits,
                            "delete_warnings": r.delete_warnings,
                            "failures": r.failures,
                            "crashed": bool(r.crashed),
                            "error": f"{type(r.outcome.exc).__name__}: {r.outcome.exc}"
                            if r.outcome and r.outcome.exc
                            else None,
                        }
                        for cid, r in RESULTS.items()
                    },
                },
                fh,
                indent=1,
            )
    yield RESULTS


def _summarize() -> None:
    failed = sum(1 for r in RESULTS.values() if r.failures or r.crashed)
    timed = sorted((r.outcome.elapsed, cid) for cid, r in RESULTS.items() if r.outcome)
    total = sum(t for t, _ in timed)
    flows = sorted(
        (r.outcome.elapsed / r.healthy, cid, r.healthy, r.outcome.elapsed)
        for cid, r in RESULTS.items()
        if r.outcome and r.healthy
    )
    lines = [
        *matrix.coverage(len(RUN_CASES)),
        f"run: {len(RESULTS)} cases ({failed} failing) in {_STATS.get('seconds', 0):.0f} s on {_STATS.get('lanes')} lanes; "
        f"{_STATS.get('log_records', 0)} log records scanned for the key",
        f"time in the surfaces: {total:.0f} s; slowest: "
        + ", ".join(f"{c} {t:.1f} s" for t, c in timed[-6:]),
    ]
    if flows:
        lines.append(
            f"full-flow cases ({len(flows)}), case / healthy run just before: "
            + ", ".join(f"{c} {t:.1f}/{h:.1f} s" for _, c, h, t in flows[-6:])
        )
    SUMMARY["fault matrix"] = lines


# --- the report, one test per case ------------------------------------------------------------


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in RUN_CASES])
def test_fault(case: Case, matrix_results: dict[str, CaseResult]) -> None:
    result = matrix_results[case.id]
    if result.crashed:
        pytest.fail(f"the case itself crashed:\n{result.crashed}")
    if result.failures:
        pytest.fail("\n".join(result.failures), pytrace=False)


@pytest.mark.timeout(1200)
def test_matrix_size_and_no_stray_key(matrix_results: dict[str, CaseResult]) -> None:
    """The matrix is generated and complete; its size is in the session summary."""
    assert len(RUN_CASES) == len(matrix.pairs()) * len(matrix.FAULTS) or ONLY
    assert not {(c.surface, c.call) for c in RUN_CASES} & set(matrix.NOT_MADE)
    assert set(matrix_results) >= {c.id for c in RUN_CASES}
    # records of helper threads (deletes, exec readers) belong to no case: checked here
    assert _STATS.get("unattributed_key_leaks") == [], _STATS.get("unattributed_key_leaks")
    print("\n".join(SUMMARY.get("fault matrix", [])))
