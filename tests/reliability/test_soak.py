"""Soak: mixed traffic from 16 threads across the three surfaces (backend; component with
reuse off, with files, with reuse; executor) against one createos-local injecting random
faults on every route at 5 % (the fault API's ``probability``), then at the end:

- every role mostly succeeds: for each role (backend, component, component with files,
  reused component, executor) the successes are not improbably few for a success rate of
  75 % (one-sided binomial test, P < 1e-4); one success overall is not enough;
- every failure is an lfx error without the API key in it, whose message says a control-plane
  call failed the way an injected fault fails it (``FAULT_CAUSES``): an lfx error is not
  acceptable just for being one;
- zero leaked guests: every guest still live is a deliberately reused one (``lf-c-``) or
  one whose failed delete was logged as a warning (the documented behaviour: auto-pause
  bounds it) -- anything else is a leak;
- the heap in use (malloc's, every arena) measured with no run in flight before and after
  the traffic grows by at most 1 MiB + 3 KiB per operation (a leak of 24 KiB per backend run
  is about 12 KiB per operation);
- client RSS flat after warm-up: the least-squares slope over 1 s samples, projected over
  the measured window, stays under max(24 MiB, 10 % of RSS);
- no file-descriptor growth (/proc/self/fd) and no thread growth once traffic stops.

``SOAK_SECONDS`` sets the length: 90 s by default (``make test``, the CI length), 1800 s with
``make soak``. tests/mutations/run.py breaks the product in a copy (every reused-guest run
failing; 24 KiB leaked per backend run) and checks that this test fails.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import math
import os
import random
import re
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from native.heap import heap_in_use  # tests/ is on sys.path (rootdir without __init__.py)

from langflow_sandbox_createos.component import reuse, wrapper
from langflow_sandbox_createos.core import budget, lease, network, settings
from langflow_sandbox_createos.local import faults

from . import harness
from .conftest import SUMMARY
from .harness import driver, leaks_key

SOAK_SECONDS = float(os.environ.get("SOAK_SECONDS", "90"))
THREADS = 16
FAULT_RATE = 0.05
SAMPLE_EVERY = 1.0
WARMUP_FRACTION = 0.3
EXECUTOR_TAIL_SECONDS = 20.0  # no new flow this close to the end
MiB = 1024 * 1024

# Each role must mostly succeed: its successes must not be improbably few (one-sided binomial
# test at RATE_ALPHA) for a run that succeeds with probability MIN_OK_RATE. Measured: 0.90-0.94
# per role at 5 % faults; with every Guest Reuse run failing, 0 of ~100 fails at once.
MIN_OK_RATE = 0.75
RATE_ALPHA = 1e-4
# The heap in use (every malloc: the native client, libcurl, jansson, Python objects over 512
# bytes), measured with no run in flight before and after the traffic, may grow by at most
# HEAP_FIXED_MIB + HEAP_PER_OP_KIB per operation. Measured: +0.3 MiB over 458 operations
# (0.6 KiB each); a leak of 24 KiB per backend run (half the operations) is 12 KiB each.
HEAP_FIXED_MIB = 1.0
HEAP_PER_OP_KIB = 3.0
# An lfx error is a result of the injected faults only when its message says a control-plane
# call failed the way one of them fails it (failures.describe's hints, spelled out here) or a
# deadline such a failure leads to; any other error is a finding.
FAULT_CAUSES = (
    "the CreateOS control plane failed; retry later",  # 500, 503, non-json (502), reflect-headers
    "the control plane is rate limiting this account",  # 429
    "the sandbox or file does not exist",  # 404
    "the sandbox is not in a state that allows this",  # 409
    "the control plane did not answer in time",  # hang, drip
    "the control plane answered with something that is not the CreateOS API",  # bodies, reset-mid
    "the control plane could not be reached",  # reset
    "the exec stream ended without an exit status",  # a stream cut short
    "did not become running within",  # the reused guest's readiness deadline, after 404/409
    "could not find or create the reused guest",
    "The flow timed out in the CreateOS guest",  # the executor's stream dripped past its deadline
)

# Sixteen threads: what each one drives.
ROLES = ["backend"] * 8 + ["component"] * 2 + ["component-files"] * 2 + ["component-reuse"] * 3 + ["executor"]

FAULT_KINDS: list[dict[str, Any]] = [
    {"status": 500},
    {"status": 503},
    {"status": 429, "retry_after": 1},
    {"status": 404},
    {"status": 409},
    {"body": "non-json"},
    {"body": "wrong-envelope"},
    {"body": "truncated"},
    {"body": "reflect-headers"},
    {"reset": True},
    {"reset": True, "after_bytes": 20},
    {"hang": True},
    {"drip_bytes_per_sec": 200},
]

PROGRAMS: list[tuple[str, str]] = [  # (code, expected stdout)
    ("print('soak')", "soak\n"),
    ("import sys\nsys.stdout.write('x' * 200000)", "x" * 200000),
    ("import sys\nprint('err', file=sys.stderr)\nprint('out')\nsys.exit(3)", "out\n"),
    ("import time\ntime.sleep(0.3)\nprint('slept')", "slept\n"),
]


# A 404 from DELETE means "already gone" (the native client counts it as deleted): injected on
# a live guest it fakes a state CreateOS cannot be in, so the soak injects 404 on every other
# route (the matrix covers delete x 404 as documented).
ROUTES_BUT_DELETE = tuple(sorted(faults.ROUTE_NAMES - {"delete", "healthz", "readyz"}))


def fault_rules() -> list[dict[str, Any]]:
    p = FAULT_RATE / len(FAULT_KINDS)
    rules: list[dict[str, Any]] = []
    for kind in FAULT_KINDS:
        routes = ROUTES_BUT_DELETE if kind.get("status") == 404 else ("*",)
        rules += [{"route": route, "probability": p, **kind} for route in routes]
    return rules


def _shape(message: str) -> str:
    """A message with its ids and numbers blanked, to count errors by kind."""
    message = re.sub(r"\b(sb|req|lf(-c)?)-[0-9a-z-]+", r"\1-…", message)
    return re.sub(r"\d+(\.\d+)?", "N", message)[:240]


def _proc_status(field_name: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise KeyError(field_name)


def rss_mib() -> float:
    return _proc_status("VmRSS") / 1024


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def os_threads() -> int:
    return _proc_status("Threads")


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope (units per second)."""
    n = len(points)
    if n < 3:
        return 0.0
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    var = sum((t - mx) ** 2 for t, _ in points)
    return 0.0 if var == 0 else sum((t - mx) * (v - my) for t, v in points) / var


@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    ops: Counter = field(default_factory=Counter)
    ok: Counter = field(default_factory=Counter)
    outcomes: Counter = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    errors: Counter = field(default_factory=Counter)  # (role, class, message) -> count
    unexplained: list[str] = field(default_factory=list)  # errors no injected fault explains
    total: int = 0

    def add(self, role: str, outcome: str, problem: str | None = None) -> None:
        with self.lock:
            self.ops[role] += 1
            self.total += 1
            if outcome == "ok":
                self.ok[role] += 1
            self.outcomes[f"{role}:{outcome}"] += 1
            if problem and len(self.problems) < 50:
                self.problems.append(f"{role}: {problem}")

    def error(self, role: str, exc: BaseException) -> None:
        message = str(exc)
        with self.lock:
            if len(self.errors) < 2000:
                self.errors[(role, type(exc).__name__, _shape(message))] += 1
            if not any(cause in message for cause in FAULT_CAUSES) and len(self.unexplained) < 50:
                self.unexplained.append(f"{role}: {type(exc).__name__}: {message[:600]}")


def _one(role: str, index: int, rng: random.Random, tally: Tally) -> None:
    code, expected = rng.choice(PROGRAMS)
    if role == "backend":
        out = driver.backend(code, shared=True)
    elif role == "executor":
        out = driver.executor("soak")
        expected = "soak"
    else:
        component_id = f"CreateOSSandbox-soak{index % 2 if role == 'component-reuse' else index}"
        out = driver.component(
            code
            if role == "component"
            else "import os\nos.makedirs('/workspace/artifacts', exist_ok=True)\n"
            "open('/workspace/artifacts/f.txt', 'w').write('f')\n" + code,
            component_id=component_id,
            reuse=role == "component-reuse",
            collect=role != "component",
            timeout=5,
        )
        expected = expected.strip()  # the component trims stdout
    if any(leaks_key(t) for t in (*out.exc_texts(), *out.reprs)):
        tally.add(role, "key-leak", "the API key appears in an error or repr")
        return
    if out.exc is not None:
        name = type(out.exc).__name__
        if type(out.exc).__module__ != "lfx.utils.sandbox.base":
            tally.add(role, f"raw:{name}", f"not an lfx error: {name}: {out.exc}"[:300])
        else:
            tally.add(role, name)
            tally.error(role, out.exc)
        return
    if out.timed_out or out.exit_code == -1:
        tally.add(role, "timed-out")  # a dripped or cut stream past its deadline: a result
        return
    if out.stdout != expected:
        tally.add(
            role,
            "wrong-output",
            f"stdout {out.stdout[:80]!r} != {expected[:80]!r} (exit {out.exit_code}, "
            f"stderr {str(out.details.get('stderr', ''))[-200:]!r}, {sorted(out.details)}; "
            f"ended at CLOCK_MONOTONIC {time.monotonic():.3f})",
        )
        return
    tally.add(role, "ok")


def _server_kills(plane: Any) -> list[str]:
    """What createos-local says it killed (its deletes of guests with an exec running), to
    tell a wrong output caused by a delete from one caused by something else."""
    try:
        lines = plane.log_path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    kills = [line for line in lines if "running exec" in line]
    return [f"createos-local killed running execs {len(kills)} times; the last:", *kills[-10:]]


@pytest.fixture
def soak_plane(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    # info: the server names every delete that kills a running exec (read on a wrong output)
    (plane,) = harness.start_planes(1, extra_args=("--log-level", "info"))
    monkeypatch.setattr(settings, "_lfx_sandbox_settings", lambda: None)
    for name in ("CREATEOS_API_KEY", "LANGFLOW_SANDBOX_ALLOWED_DOMAINS", "CREATEOS_SANDBOX_WARM_POOL"):
        monkeypatch.delenv(name, raising=False)
    env = {
        "CREATEOS_SANDBOX_API_KEY": plane.api_key,
        "CREATEOS_SANDBOX_BASE_URL": plane.url,
        "LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS": "true",
        "CREATEOS_SANDBOX_ACCEPT_LOCAL_ISOLATION": "true",  # createos-local
        "LANGFLOW_SANDBOX_TIMEOUT_SECONDS": "5",
        "CREATEOS_SANDBOX_CONTROL_TIMEOUT_SECONDS": "5",
        "CREATEOS_EXECUTOR_TIMEOUT_SECONDS": "45",
        "CREATEOS_SANDBOX_MAX_OUTPUT_BYTES": str(1024 * 1024),
        **harness.TEMPLATE_ENV,
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    # short graces so that a hung exec costs seconds, not minutes
    monkeypatch.setattr(budget, "BACKEND_GRACE_SECONDS", 3.0)
    monkeypatch.setattr(budget, "COMPONENT_GRACE_SECONDS", 3)
    monkeypatch.setattr(wrapper, "ARCHIVE_BUDGET_SECONDS", 5)
    monkeypatch.setattr(wrapper, "lock_wait_seconds", lambda timeout: 10)
    # inside that 10 s: a run waits at most 1 s for the archive of the run before it (its
    # host may be the one a fault hit), so the run after it still gets its turn
    monkeypatch.setattr(wrapper, "PENDING_WAIT_SECONDS", 1)
    monkeypatch.setattr(reuse, "GUEST_READY_SECONDS", 20.0)
    monkeypatch.setattr(budget, "EXECUTOR_GRACE_SECONDS", 5.0)
    try:
        yield plane
    finally:
        harness.forget_endpoint(plane.url)
        plane.stop()


@contextlib.contextmanager
def _pytest_log_capture_detached() -> Iterator[None]:
    """pytest's own log capture keeps every record of a test (at DEBUG here: the soak lowers
    the root logger to scan every record for the key) in memory until the test ends: tens of
    MiB over a soak, which would be the heap growth the soak measures. Detached meanwhile; the
    soak keeps its own (the texts of warnings, counted in ``kept_bytes``)."""
    root = logging.getLogger()
    ours = [h for h in root.handlers if type(h).__module__ == "_pytest.logging"]
    for handler in ours:
        root.removeHandler(handler)
    try:
        yield
    finally:
        for handler in ours:
            root.addHandler(handler)


def _quiet_heap_mib(extra: float = 0.0) -> float:
    """The heap in use with no run in flight (after a full collection), in MiB."""
    gc.collect()
    return heap_in_use() / MiB - extra


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p), summed in log space (no underflow for large n)."""
    if k >= n:
        return 1.0
    if k < 0:
        return 0.0
    lp, lq = math.log(p), math.log1p(-p)
    terms = [
        math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq
        for i in range(k + 1)
    ]
    top = max(terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))


@pytest.mark.slow
@pytest.mark.timeout(int(SOAK_SECONDS) + 600)
def test_soak(soak_plane: Any) -> None:
    plane = soak_plane
    driver.component_cls()
    harness.chat_graph()
    tally = Tally()
    # (t, rss MiB, fds, os threads, heap in use MiB, operations finished)
    samples: list[tuple[float, float, int, int, float, int]] = []
    stop = threading.Event()
    with harness.capture_all_logs(keep_level=logging.WARNING) as logs, _pytest_log_capture_detached():
        # one clean run of each role first: the clients, their I/O threads, the catalog and
        # lfx's modules exist before t0 (the executor's flow is warm-up too)
        for role in ("backend", "component", "component-files", "component-reuse", "executor"):
            warm = Tally()
            _one(role, 0, random.Random(0), warm)
            assert warm.ok[role] == 1, f"the warm-up {role} run failed: {dict(warm.outcomes)} {warm.problems}"
        threads_before = os_threads()
        heap_start = _quiet_heap_mib(logs.kept_bytes / MiB)
        blocks_start = sys.getallocatedblocks()
        plane.set_faults({"rules": fault_rules()})
        started = time.monotonic()

        def worker(index: int) -> None:
            rng = random.Random(index)
            role = ROLES[index]
            while not stop.is_set():
                late = time.monotonic() - started > SOAK_SECONDS - EXECUTOR_TAIL_SECONDS
                if role == "executor" and late and tally.ops[role]:
                    return  # a whole flow would run past the end: do not start one

                try:
                    _one(role, index, rng, tally)
                except BaseException as exc:  # a crash of the harness itself is a finding too
                    tally.add(role, "crash", f"{type(exc).__name__}: {exc}"[:300])

        workers = [threading.Thread(target=worker, args=(i,), name=f"soak-{i}") for i in range(THREADS)]
        for w in workers:
            w.start()
        while time.monotonic() - started < SOAK_SECONDS:
            samples.append(
                (
                    time.monotonic() - started,
                    rss_mib(),
                    fd_count(),
                    os_threads(),
                    heap_in_use() / MiB - logs.kept_bytes / MiB,
                    tally.total,
                )
            )
            time.sleep(SAMPLE_EVERY)
        stop.set()
        for w in workers:
            w.join(timeout=180)
        stuck = [w.name for w in workers if w.is_alive()]
        traffic_seconds = time.monotonic() - started
        fault_hits = plane.fault_hits()
        plane.clear_faults()
        stats = plane.stats()
        # what lfx's shutdown and process exit do: finish and log the queued deletes
        harness.drain_backend_deletes()
        lease.drain_deletes(15.0)
        deadline = time.monotonic() + 20
        while (
            any(sb["status"] == "destroying" for sb in plane.live_sandboxes()) and time.monotonic() < deadline
        ):
            time.sleep(0.2)
        reused = {
            reuse.reuse_name(
                "noflow", f"CreateOSSandbox-soak{i}", network.egress_rules(False), harness.REUSE_OWNER
            )
            for i in (0, 1)
        }
        leftovers = [sb for sb in plane.live_sandboxes() if sb["name"] not in reused]
        explained = [
            sb
            for sb in leftovers
            if logs.mentioning(sb["id"], logging.WARNING) or logs.mentioning(sb["name"], logging.WARNING)
        ]
        unexplained = [sb for sb in leftovers if sb not in explained]
        time.sleep(1.0)
        threads_after = os_threads()
        fds_after = fd_count()
        heap_end = _quiet_heap_mib(logs.kept_bytes / MiB)
        blocks_end = sys.getallocatedblocks()
        key_leaks = list(logs.leaked)
        scanned = logs.scanned
        kept_mib = logs.kept_bytes / MiB
    plane.delete_all()
    reuse.guest_ids.clear()

    warm = [s for s in samples if s[0] >= WARMUP_FRACTION * SOAK_SECONDS]
    rss_points = [(t, r) for t, r, *_ in warm]
    rss_slope = slope(rss_points) * 60  # MiB per minute
    window = (warm[-1][0] - warm[0][0]) if len(warm) > 1 else 0.0
    rss_median = statistics.median(r for _, r in rss_points) if rss_points else 0.0
    projected = rss_slope / 60 * window
    rss_allowed = max(24.0, 0.10 * rss_median)
    fd_warm_max = max((f for t, _, f, *_ in samples if t < WARMUP_FRACTION * SOAK_SECONDS), default=0)
    fd_slope = slope([(t, f) for t, _, f, *_ in warm]) * 60
    # the heap against the operations finished (after warm-up): KiB per operation (reported)
    heap_per_op_kib = slope([(float(n), h) for *_, h, n in warm]) * 1024
    ops_total = tally.total
    heap_growth = heap_end - heap_start
    heap_allowed = HEAP_FIXED_MIB + HEAP_PER_OP_KIB * ops_total / 1024

    rates = {role: (tally.ok[role], tally.ops[role]) for role in sorted(set(ROLES))}
    improbable = {
        role: f"{ok} of {n} succeeded: P = {binomial_cdf(ok, n, MIN_OK_RATE):.1e} at a success rate of {MIN_OK_RATE}"
        for role, (ok, n) in rates.items()
        if binomial_cdf(ok, n, MIN_OK_RATE) < RATE_ALPHA
    }
    report = {
        "seconds": round(traffic_seconds, 1),
        "worker_threads": THREADS,
        "fault_rate": FAULT_RATE,
        "operations": dict(tally.ops),
        "ok_rate_by_role": {r: f"{ok}/{n} = {ok / n:.2f}" if n else "0/0" for r, (ok, n) in rates.items()},
        "outcomes": dict(sorted(tally.outcomes.items())),
        "errors": [f"{n} x {r} {c}: {m}" for (r, c, m), n in tally.errors.most_common(40)],
        "control_plane_requests": sum(stats["requests"].values()),
        "responses_by_status": stats["responses_by_status"],
        "fault_hits": sum(fault_hits),
        "guests_created": len(stats["sandboxes"]),
        "leftovers_explained": len(explained),
        "leftovers_unexplained": unexplained,
        "heap_mib": {
            "start": round(heap_start, 2),
            "end": round(heap_end, 2),
            "growth": round(heap_growth, 2),
            "allowed": round(heap_allowed, 2),
            "pymalloc_blocks": [blocks_start, blocks_end],
            "per_op_kib_slope": round(heap_per_op_kib, 2),
            "per_op_kib_quiet": round(heap_growth * 1024 / max(1, ops_total), 2),
            "log_texts_kept_mib": round(kept_mib, 2),
        },
        "rss_mib": {
            "first": round(samples[0][1], 1),
            "median_after_warmup": round(rss_median, 1),
            "last": round(samples[-1][1], 1),
            "slope_mib_per_min": round(rss_slope, 2),
            "projected_growth_mib": round(projected, 1),
            "allowed_mib": round(rss_allowed, 1),
        },
        "fds": {"warmup_max": fd_warm_max, "after": fds_after, "slope_per_min": round(fd_slope, 2)},
        "os_threads": {"before": threads_before, "after": threads_after},
        "log_records_scanned": scanned,
    }
    SUMMARY["soak"] = [f"{k}: {v}" for k, v in report.items()]
    print(json.dumps(report, indent=1))
    path = os.environ.get("RELIABILITY_SOAK_REPORT")
    if path:
        with open(path, "w") as fh:
            json.dump({**report, "samples": samples}, fh, indent=1)

    assert not stuck, f"threads still running after the soak: {stuck}"
    assert not tally.problems, "\n".join([*tally.problems, *_server_kills(plane)])
    assert not key_leaks, key_leaks[:3]
    assert all(tally.ops[r] > 0 for r in set(ROLES)), tally.ops
    assert not improbable, f"roles that did not mostly succeed: {improbable}; {report['ok_rate_by_role']}"
    assert not tally.unexplained, "errors no injected fault explains:\n" + "\n".join(tally.unexplained)
    assert unexplained == [], f"leaked guests (no warning names them): {unexplained}"
    assert heap_growth < heap_allowed, (
        f"the heap in use grew {heap_growth:.2f} MiB over {ops_total} operations (allowed "
        f"{HEAP_FIXED_MIB:g} MiB + {HEAP_PER_OP_KIB:g} KiB per operation = {heap_allowed:.2f}): {report['heap_mib']}"
    )
    assert projected < rss_allowed, (
        f"RSS grows: {rss_slope:.2f} MiB/min over {window:.0f} s ({report['rss_mib']})"
    )
    assert fds_after <= fd_warm_max + 4, f"file descriptors grew: {report['fds']}"
    assert threads_after <= threads_before + 2, f"threads grew: {report['os_threads']}"
