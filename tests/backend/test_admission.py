"""Admission control for the blocking surfaces (issue 30): at most CREATEOS_SANDBOX_MAX_GUESTS
backend runs, and as many component runs, hold a guest at once per process; the others wait
in line in arrival order, and a caller interrupted while waiting gives its place up."""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import time
from typing import Any

import pytest

from langflow_sandbox_createos.backend.engine import CreateOSBackend
from langflow_sandbox_createos.component import engine
from langflow_sandbox_createos.core import admission

# prints when the program started and ended, by the host's clock (createos-local guests share it)
SPAN = "import time\nt0 = time.time()\ntime.sleep(0.6)\nprint(t0, time.time())\n"


def _overlaps(spans: list[tuple[float, float]]) -> int:
    """The most spans that share one instant."""
    points = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    peak = depth = 0
    for _, step in points:
        depth += step
        peak = max(peak, depth)
    return peak


def test_a_sync_line_serves_in_order_and_never_over_its_limit() -> None:
    """Six callers, a limit of 2: they arrive one after another (each starts once the one
    before holds its ticket), hold their slot until the test lets them go, and are let go
    one at a time; after each leaves, the next caller in, and only it, is the next in line.
    Each step waits for an event, never for a time, so delaying any thread cannot change the
    verdict (the old test relied on a 5 ms gap between thread starts: 42 of 200 runs failed
    at load 13)."""
    line = admission.SyncLine("test")
    callers = 6
    lock = threading.Lock()
    active = peak = 0
    waits: list[tuple[int, int]] = []
    entries: queue.Queue[int] = queue.Queue()  # who came in, in the order they did
    ticketed = [threading.Event() for _ in range(callers)]  # in line, or in
    release = [threading.Event() for _ in range(callers)]

    def on_wait(i: int, ahead: int, in_flight: int) -> None:
        waits.append((ahead, in_flight))
        ticketed[i].set()

    def run(i: int) -> None:
        nonlocal active, peak
        line.enter(2, lambda ahead, in_flight: on_wait(i, ahead, in_flight))
        try:
            with lock:
                active += 1
                peak = max(peak, active)
            entries.put(i)
            ticketed[i].set()  # after the put: the next caller starts only then
            assert release[i].wait(60)
            with lock:
                active -= 1
        finally:
            line.leave()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(callers)]
    for i, thread in enumerate(threads):
        thread.start()
        assert ticketed[i].wait(30), f"caller {i} never took a ticket"
    assert [entries.get(timeout=30), entries.get(timeout=30)] == [0, 1]
    assert entries.empty() and line.in_flight == 2 and line.waiting == 4
    for i in range(callers):
        release[i].set()
        threads[i].join(30)
        if i + 2 < callers:
            assert entries.get(timeout=30) == i + 2, f"after caller {i} left, not the next in line came in"
        with lock:
            assert entries.empty() and active <= 2, (i, active)
    for thread in threads:
        thread.join(30)
        assert not thread.is_alive()
    assert peak == 2 and line.in_flight == 0 and line.waiting == 0
    assert waits == [(0, 2), (1, 2), (2, 2), (3, 2)], waits


def test_a_caller_interrupted_in_line_gives_its_place_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """An interrupt (KeyboardInterrupt, lfx's timeout) that lands while a caller waits."""
    line = admission.SyncLine("test")
    line.enter(1, lambda *_: None)
    original = threading.Condition.wait

    def wait(self: threading.Condition, timeout: float | None = None) -> bool:
        if threading.current_thread().name == "impatient":
            raise KeyboardInterrupt
        return original(self, timeout)

    monkeypatch.setattr(threading.Condition, "wait", wait)
    outcome: list[str] = []

    def impatient() -> None:
        try:
            line.enter(1, lambda *_: None)
            outcome.append("entered")
        except KeyboardInterrupt:
            outcome.append("interrupted")

    thread = threading.Thread(target=impatient, name="impatient")
    thread.start()
    thread.join(10)
    monkeypatch.undo()
    assert outcome == ["interrupted"]
    patient = threading.Thread(target=lambda: (line.enter(1, lambda *_: None), line.leave()))
    patient.start()
    line.leave()
    patient.join(10)
    assert not patient.is_alive(), "the line stalled behind a ticket given up"
    assert line.in_flight == 0 and line.waiting == 0


def test_backend_runs_beyond_the_limit_wait(
    backend: CreateOSBackend, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("CREATEOS_SANDBOX_MAX_GUESTS", "1")
    caplog.set_level("INFO", logger="langflow_sandbox_createos")
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda _: backend.run(SPAN), range(3)))
    assert all(r.exit_code == 0 for r in results), results
    spans = [tuple(map(float, r.stdout.split())) for r in results]
    assert _overlaps(spans) == 1, spans  # the programs ran one after another
    waited = [r.getMessage() for r in caplog.records if "waits in line" in r.getMessage()]
    assert len(waited) == 2 and all("CREATEOS_SANDBOX_MAX_GUESTS" in m for m in waited), waited


def test_component_runs_beyond_the_limit_wait_and_say_so(
    backend_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CREATEOS_SANDBOX_MAX_GUESTS", "1")
    notes: list[list[str]] = [[], [], []]

    def one(i: int) -> Any:
        request = engine.RunRequest(
            SPAN, "python", False, False, False, 30, engine.resolve_shape(None), "flow-adm", f"c-{i}"
        )
        return engine.run(request, note=notes[i].append)

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        outcomes = list(pool.map(one, range(3)))
    assert all(o.exit_code == 0 for o in outcomes), outcomes
    assert _overlaps([tuple(map(float, o.stdout.split())) for o in outcomes]) == 1
    said = [text for run in notes for text in run if "waiting in line" in text]
    assert len(said) == 2 and all("CREATEOS_SANDBOX_MAX_GUESTS=1" in text for text in said), notes
    assert admission.component_line.in_flight == 0


def test_a_sync_line_caller_gives_up_at_its_wait_deadline() -> None:
    line = admission.SyncLine("test")
    line.enter(1, lambda *_: None)
    started = time.monotonic()
    with pytest.raises(admission.WaitedTooLong) as caught:
        line.enter(1, lambda *_: None, 0.3)
    assert time.monotonic() - started >= 0.3
    assert caught.value.in_flight == 1 and caught.value.ahead == 0
    assert line.waiting == 0 and line.gave_up == 1
    # the line moves past the ticket given up
    line.leave()
    line.enter(1, lambda *_: None, 0.3)
    line.leave()
    assert line.in_flight == 0


@pytest.mark.parametrize("surface", ["backend", "component"])
def test_a_run_that_waits_past_CREATEOS_SANDBOX_MAX_WAIT_SECONDS_fails_before_any_guest(
    surface: str, backend: CreateOSBackend, backend_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every slot held (here by the test itself): the run gives up after the deadline with an
    error that names both settings, and no guest was created for it."""
    from lfx.utils.sandbox.base import SandboxUnavailableError

    monkeypatch.setenv("CREATEOS_SANDBOX_MAX_GUESTS", "1")
    monkeypatch.setenv("CREATEOS_SANDBOX_MAX_WAIT_SECONDS", "1")
    line = admission.backend_line if surface == "backend" else admission.component_line
    before = {sb["id"] for sb in backend_env.sandboxes()}
    line.enter(1, lambda *_: None)
    try:
        with pytest.raises(SandboxUnavailableError) as caught:
            if surface == "backend":
                backend.run("print('ran')")
            else:
                request = engine.RunRequest(
                    "print('ran')",
                    "python",
                    False,
                    False,
                    False,
                    30,
                    engine.resolve_shape(None),
                    "f",
                    "c",
                )
                engine.run(request)
    finally:
        line.leave()
    text = str(caught.value)
    assert "CREATEOS_SANDBOX_MAX_GUESTS=1" in text and "CREATEOS_SANDBOX_MAX_WAIT_SECONDS" in text, text
    assert "Nothing of it ran" in text
    assert {sb["id"] for sb in backend_env.sandboxes()} == before
    assert line.in_flight == 0 and line.waiting == 0


def test_a_sync_line_refuses_at_once_a_caller_it_cannot_serve_within_its_wait() -> None:
    """Load shedding (issue 45) on the backend's and the component's line: one slot held by
    runs of 10 s, a caller that may wait 5 s is refused at arrival (the estimate is the test's
    own, so no thread's speed decides it), takes no ticket, and the line serves on."""
    line = admission.SyncLine("test")
    line.observe_hold(10.0)
    line.enter(1, lambda *_: None)
    with pytest.raises(admission.Shed) as caught:
        line.enter(1, lambda *_: None, 5.0)
    assert caught.value.expected == 10.0 and caught.value.waited == 0.0 and caught.value.ahead == 0
    assert line.shed == 1 and line.waiting == 0 and line.waited == 0
    line.leave()
    line.enter(1, lambda *_: None, 5.0)  # a free slot: admitted, whatever the estimate
    line.leave()
    assert line.in_flight == 0 and line.waiting == 0


@pytest.mark.parametrize("surface", ["backend", "component"])
def test_a_sandbox_run_the_line_cannot_serve_in_time_is_refused_at_once_before_any_guest(
    surface: str, backend: CreateOSBackend, backend_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every slot held, runs of 1000 s observed: the run is refused at once (not after
    CREATEOS_SANDBOX_MAX_WAIT_SECONDS=100), names both settings, and is chained from the 503
    Langflow's run API answers with; no guest was created for it."""
    from lfx.integrations.errors import IntegrationError
    from lfx.utils.sandbox.base import SandboxUnavailableError

    monkeypatch.setenv("CREATEOS_SANDBOX_MAX_GUESTS", "1")
    monkeypatch.setenv("CREATEOS_SANDBOX_MAX_WAIT_SECONDS", "100")
    line = admission.backend_line if surface == "backend" else admission.component_line
    saved = line.mean_hold
    before = {sb["id"] for sb in backend_env.sandboxes()}
    line.enter(1, lambda *_: None)
    try:
        line._mean_hold = None  # the process's line: earlier runs' holds do not count here
        line.observe_hold(1000.0)
        with pytest.raises(SandboxUnavailableError) as caught:
            if surface == "backend":
                backend.run("print('ran')")
            else:
                request = engine.RunRequest(
                    "print('ran')", "python", False, False, False, 30, engine.resolve_shape(None), "f", "c"
                )
                engine.run(request)
    finally:
        line.leave()
        line._mean_hold = saved  # the process's line: leave its estimate as found
    text = str(caught.value)
    assert "refused at once" in text and "CREATEOS_SANDBOX_MAX_GUESTS=1" in text, text
    assert "CREATEOS_SANDBOX_MAX_WAIT_SECONDS=100" in text, text
    cause = caught.value.__cause__
    assert isinstance(cause, IntegrationError) and cause.http_status == 503 and cause.retryable
    assert {sb["id"] for sb in backend_env.sandboxes()} == before
    assert line.in_flight == 0 and line.waiting == 0
