"""Admission control (issue 30): at most CREATEOS_EXECUTOR_MAX_GUESTS executor runs hold a
guest at once per process; the others wait in line, first come first served, and say so."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from typing import Any

import pytest

from langflow_sandbox_createos.core import admission
from langflow_sandbox_createos.executor import CreateOSExecutor

from .conftest import chat_unit, drain

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]


async def test_a_line_serves_first_come_first_served_and_never_over_its_limit() -> None:
    line = admission.Line("test")
    order: list[int] = []
    peak = 0
    waits: list[tuple[int, int]] = []

    async def run(i: int) -> None:
        nonlocal peak
        async with line.slot(2, lambda ahead, in_flight: waits.append((ahead, in_flight))):
            peak = max(peak, line.in_flight)
            order.append(i)
            await asyncio.sleep(0.05)

    tasks = []
    for i in range(6):
        tasks.append(asyncio.create_task(run(i)))
        await asyncio.sleep(0)  # arrive in order
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3, 4, 5]
    assert peak == 2 and line.in_flight == 0 and line.waiting == 0
    assert waits == [(0, 2), (1, 2), (2, 2), (3, 2)]


async def test_a_run_cancelled_in_line_leaves_it_and_loses_no_slot() -> None:
    line = admission.Line("test")
    await line.enter(1, lambda *_: None)
    waiter = asyncio.create_task(line.enter(1, lambda *_: None))
    await asyncio.sleep(0.01)
    assert line.waiting == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert line.waiting == 0
    line.leave()
    assert line.in_flight == 0
    # and one cancelled in the instant its slot arrived passes the slot on
    await line.enter(1, lambda *_: None)
    first = asyncio.create_task(line.enter(1, lambda *_: None))
    second = asyncio.create_task(line.enter(1, lambda *_: None))
    await asyncio.sleep(0.01)
    line.leave()  # granted to `first` (scheduled) ...
    first.cancel()  # ... which is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.wait_for(second, 5)
    assert line.in_flight == 1
    line.leave()
    assert line.in_flight == 0


def test_a_line_is_shared_by_the_event_loops_of_several_threads() -> None:
    line = admission.Line("test")
    active = 0
    peak = 0
    lock = threading.Lock()

    async def hold() -> None:
        nonlocal active, peak
        async with line.slot(1, lambda *_: None):
            with lock:
                active += 1
                peak = max(peak, active)
            await asyncio.sleep(0.02)
            with lock:
                active -= 1

    threads = [threading.Thread(target=lambda: asyncio.run(hold())) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert peak == 1 and line.in_flight == 0


def _recording_manager(logs: list[dict[str, Any]]) -> Any:
    """lfx's own event manager, its on_log recording what the run said."""
    from lfx.events.event_manager import create_default_event_manager

    manager = create_default_event_manager(None)
    manager.events["on_log"] = lambda *, data: logs.append(data)
    return manager


async def test_runs_beyond_the_limit_wait_in_line_and_say_so(
    executor: CreateOSExecutor, executor_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three real executor runs with CREATEOS_EXECUTOR_MAX_GUESTS=1: never two executor guests
    live at once, all three answer, and the two that waited said so in their own events."""
    monkeypatch.setenv("CREATEOS_EXECUTOR_MAX_GUESTS", "1")
    live_peak = 0
    done = threading.Event()

    def watch() -> None:
        nonlocal live_peak
        while not done.is_set():
            live = [
                sb
                for sb in executor_env.sandboxes()
                if sb.get("name", "").startswith("lf-x-") and sb["status"] in ("creating", "running")
            ]
            live_peak = max(live_peak, len(live))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    logs: list[list[dict[str, Any]]] = [[], [], []]

    async def one(i: int) -> list[Any]:
        unit = chat_unit(f"hello {i}")
        unit.runtime_options["event_manager"] = _recording_manager(logs[i])
        return await drain(executor.execute(unit))

    try:
        results = await asyncio.gather(*(one(i) for i in range(3)))
    finally:
        done.set()
        watcher.join(5)
    assert all(type(items[-1]).__name__ == "RunComplete" for items in results), results
    assert live_peak == 1, live_peak
    said = [log["message"] for run in logs for log in run if "waits in line" in str(log.get("message"))]
    assert len(said) == 2, logs
    assert all("CREATEOS_EXECUTOR_MAX_GUESTS=1" in text for text in said), said
    await _line_empties()  # the last run's slot is free once its guest's delete returned


async def _line_empties(timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while admission.executor_line.in_flight or admission.executor_line.waiting:
        assert time.monotonic() < deadline, (
            admission.executor_line.in_flight,
            admission.executor_line.waiting,
        )
        await asyncio.sleep(0.01)


async def test_a_run_returns_before_its_guest_is_deleted_and_holds_its_slot_until_then(
    executor: CreateOSExecutor, executor_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The delete is off the run's critical path, but the run's slot in the line is held
    until it returned: never more guests alive than CREATEOS_EXECUTOR_MAX_GUESTS."""
    from langflow_sandbox_createos.core import pool_keeper

    gate = threading.Event()
    deleting: list[str] = []
    real_delete = pool_keeper.delete

    def held_delete(client: Any, sandbox_id: str) -> None:
        deleting.append(sandbox_id)
        assert gate.wait(60)
        real_delete(client, sandbox_id)

    monkeypatch.setattr(pool_keeper, "delete", held_delete)
    try:
        items = await asyncio.wait_for(drain(executor.execute(chat_unit("quick"))), 120)
        assert type(items[-1]).__name__ == "RunComplete"
        deadline = time.monotonic() + 5
        while not deleting:
            assert time.monotonic() < deadline, "the run's guest delete never started"
            await asyncio.sleep(0.01)
        assert admission.executor_line.in_flight == 1  # held while its guest is being deleted
        assert deleting[0] in {sb["id"] for sb in executor_env.live_sandboxes()}
    finally:
        gate.set()
    await _line_empties()
    assert executor_env.wait_until_no_live(timeout=5.0) == []


async def test_a_run_whose_bridge_close_is_cancelled_still_deletes_its_guest_and_leaves_the_line(
    executor: CreateOSExecutor, executor_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The consumer's task cancelled while the run's sandbox bridge closes (its finally
    awaits): the guest is deleted and the slot left all the same."""
    from langflow_sandbox_createos.core import lease
    from langflow_sandbox_createos.executor import bridge as executor_bridge

    async def cancelled_close(self: Any) -> None:
        raise asyncio.CancelledError

    monkeypatch.setattr(executor_bridge.SandboxBridge, "close", cancelled_close)
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(drain(executor.execute(chat_unit("quick"))), 120)
    lease.wait_for_deletes(60)
    await _line_empties()
    assert executor_env.wait_until_no_live(timeout=5.0) == []


async def test_a_run_that_waits_past_its_deadline_leaves_the_line() -> None:
    line = admission.Line("test")
    await line.enter(1, lambda *_: None)
    behind = asyncio.create_task(line.enter(1, lambda *_: None))  # waits with no deadline
    await asyncio.sleep(0.01)
    with pytest.raises(admission.WaitedTooLong) as caught:
        await line.enter(1, lambda *_: None, 0.2)
    assert caught.value.ahead == 1 and caught.value.in_flight == 1
    assert line.waiting == 1 and line.gave_up == 1
    line.leave()  # to `behind`, the run still in line
    await asyncio.wait_for(behind, 5)
    line.leave()
    assert line.in_flight == 0


async def test_a_slot_handed_over_at_the_deadline_is_passed_on() -> None:
    line = admission.Line("test")
    await line.enter(1, lambda *_: None)
    late = asyncio.create_task(line.enter(1, lambda *_: None, 0.05))
    after = asyncio.create_task(line.enter(1, lambda *_: None))
    await asyncio.sleep(0.01)
    line.leave()  # granted to `late` (scheduled) ...
    time.sleep(0.1)  # ... whose deadline passes before its loop runs the grant
    try:
        await late
        line.leave()  # it got the slot in time after all: give it back
    except admission.WaitedTooLong:
        pass
    await asyncio.wait_for(after, 5)
    assert line.in_flight == 1
    line.leave()
    assert line.in_flight == 0 and line.waiting == 0


async def test_spare_slots_go_to_the_pool_only_when_no_run_waits() -> None:
    line = admission.Line("test")
    spare: list[int] = []
    line.when_spare(lambda: spare.append(line.in_flight))
    assert line.try_enter_spare(2) and line.try_enter_spare(2)
    assert not line.try_enter_spare(2)  # at the limit
    waiter = asyncio.create_task(line.enter(2, lambda *_: None))
    await asyncio.sleep(0.01)
    line.leave()  # passes to the waiting run: no spare slot
    await asyncio.wait_for(waiter, 5)
    assert spare == []
    line.leave()
    assert spare == [1]  # a free slot nobody waited for
    assert line.has_spare(2) and line.try_enter_spare(2)
    line.leave()
    line.leave()
    assert line.in_flight == 0


async def test_a_run_waiting_past_CREATEOS_EXECUTOR_MAX_WAIT_SECONDS_fails_before_any_guest(
    executor: CreateOSExecutor, executor_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lfx.utils.sandbox.base import SandboxUnavailableError

    monkeypatch.setenv("CREATEOS_EXECUTOR_MAX_GUESTS", "1")
    monkeypatch.setenv("CREATEOS_EXECUTOR_MAX_WAIT_SECONDS", "1")
    before = {sb["id"] for sb in executor_env.sandboxes()}
    await admission.executor_line.enter(1, lambda *_: None)  # the only slot, held by another "run"
    try:
        with pytest.raises(SandboxUnavailableError) as caught:
            await asyncio.wait_for(drain(executor.execute(chat_unit("hello"))), 60)
    finally:
        admission.executor_line.leave()
    text = str(caught.value)
    assert "CREATEOS_EXECUTOR_MAX_GUESTS=1" in text and "CREATEOS_EXECUTOR_MAX_WAIT_SECONDS" in text, text
    assert {sb["id"] for sb in executor_env.sandboxes()} == before
    assert admission.executor_line.in_flight == 0 and admission.executor_line.waiting == 0


async def test_pool_refills_hold_a_slot_and_never_make_a_run_wait_longer(
    executor: CreateOSExecutor, executor_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CREATEOS_EXECUTOR_MAX_GUESTS=1 with a pool of 1: the refill does not start while a run
    holds the only slot; once it is free the refill boots the guest holding the slot, a run
    arriving meanwhile waits in line (says so) and then gets that warm guest. Never more than
    one guest boots or runs at once.

    That the refill does not start is read from the pool's own decision, which take() makes
    at once and without I/O: it asked the line, was told no, and started no worker (the test
    waited 1.5 s for a refill not to appear before, which a slow thread could outlast)."""
    from langflow_sandbox_createos.core import connection, settings
    from langflow_sandbox_createos.executor import pool

    monkeypatch.setenv("CREATEOS_EXECUTOR_MAX_GUESTS", "1")
    monkeypatch.setenv("CREATEOS_EXECUTOR_WARM_POOL", "1")
    line = admission.executor_line
    peak = 0
    done = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, line.in_flight)
            time.sleep(0.005)

    answers: list[bool] = []  # the line's answers to the pool's "is a slot spare?"
    real_has_spare = line.has_spare

    def has_spare(limit: int) -> bool:
        answer = real_has_spare(limit)
        answers.append(answer)
        return answer

    monkeypatch.setattr(line, "has_spare", has_spare)
    await asyncio.to_thread(pool.shutdown)  # no pooled guest and no worker of an earlier test
    warm = pool.pool()
    assert warm.stats()["workers"] == 0, warm.stats()
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        await line.enter(1, lambda *_: None)  # a run holds the only slot
        created = warm.stats()["created"]  # the process's pool: earlier tests' counts stay
        run, _ = pool.take(connection.endpoints.get(), settings.executor_settings(), {})
        assert run is None
        # take() decided then and there: the line said no, so no worker was started to refill
        assert answers and not any(answers), answers
        stats = warm.stats()
        assert stats["workers"] == 0 and stats["pending"] == 0 and stats["created"] == created, stats
        live = [sb for sb in executor_env.live_sandboxes() if sb["name"].startswith("lf-xw-")]
        assert not live, live
        line.leave()  # the refill may start now, and holds the slot while it warms
        deadline = time.monotonic() + 30
        while warm.stats()["pending"] == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert warm.stats()["pending"] == 1 and line.in_flight == 1, warm.stats()
        logs: list[dict[str, Any]] = []
        unit = chat_unit("after the refill")
        unit.runtime_options["event_manager"] = _recording_manager(logs)
        items = await drain(executor.execute(unit))
        statuses = [i.payload for i in items if type(getattr(i, "payload", None)).__name__ == "GuestStatus"]
        assert [s.pooled for s in statuses] == [True], statuses
        assert any("waits in line" in str(log.get("message")) for log in logs), logs
        assert type(items[-1]).__name__ == "RunComplete"
        assert warm.wait_full(240), warm.stats()  # the run's take started the next refill
    finally:
        done.set()
        watcher.join(5)
        pool.shutdown()
    assert peak == 1, peak
    assert line.in_flight == 0 and line.waiting == 0


# --- load shedding (issue 45): a run the line cannot serve in time is refused at once ----------
#
# The line's estimate is fed here with hold times the test states (observe_hold), never with
# measured ones; the refusals are decided at arrival, before anything awaits, so no test below
# depends on how fast a thread or the loop runs.


def test_the_expected_wait_is_the_slots_ahead_times_the_mean_hold_over_the_slots() -> None:
    assert admission.expected_wait(None, 3, 2) is None  # nothing observed: no estimate
    assert admission.expected_wait(10.0, 0, 1) == 10.0
    assert admission.expected_wait(10.0, 2, 2) == 15.0  # 3 slots must free, 2 at a time
    line = admission.Line("test")
    line.observe_hold(10.0)
    assert line.mean_hold == 10.0
    line.observe_hold(20.0)  # the newest weighs HOLD_WEIGHT
    assert line.mean_hold == pytest.approx(10.0 + admission.HOLD_WEIGHT * 10.0)


async def test_a_run_the_line_cannot_serve_within_its_wait_is_refused_at_once() -> None:
    """Two slots held, runs of 10 s each, 22 s allowed: a run that would wait 5 s, or 10 s, and
    then hold its guest 10 s waits in line; the next would wait about 15 s and then 10 s more,
    past 22 s, and is refused at arrival, without ever standing in line or taking a slot, with
    the estimate it was refused on."""
    line = admission.Line("test")
    for _ in range(3):
        line.observe_hold(10.0)
    await line.enter(2, lambda *_: None)
    await line.enter(2, lambda *_: None)
    queued = asyncio.Event()
    waits: list[tuple[int, int]] = []

    def said(ahead: int, in_flight: int) -> None:
        waits.append((ahead, in_flight))
        if len(waits) == 2:
            queued.set()

    first = asyncio.create_task(line.enter(2, said, 22.0))
    second = asyncio.create_task(line.enter(2, said, 22.0))
    await asyncio.wait_for(queued.wait(), 30)
    assert waits == [(0, 2), (1, 2)] and line.waiting == 2
    with pytest.raises(admission.Shed) as caught:
        await line.enter(2, said, 22.0)
    refused = caught.value
    assert (
        refused.expected == 15.0
        and refused.max_wait == 22.0
        and refused.waited == 0.0
        and refused.hold == 10.0
    )
    assert refused.ahead == 2 and refused.in_flight == 2
    assert line.shed == 1 and line.waiting == 2 and line.in_flight == 2 and len(waits) == 2
    # the runs in line were let in, and still are served in order
    line.leave()
    await asyncio.wait_for(first, 30)
    line.leave()
    await asyncio.wait_for(second, 30)
    line.leave()
    line.leave()
    assert line.in_flight == 0 and line.waiting == 0


async def test_nothing_is_shed_without_a_hold_observed_or_without_a_deadline() -> None:
    line = admission.Line("test")
    await line.enter(1, lambda *_: None)
    queued = asyncio.Event()
    unestimated = asyncio.create_task(line.enter(1, lambda *_: queued.set(), 0.5))
    await asyncio.wait_for(queued.wait(), 30)  # no hold observed: it stood in line
    line.observe_hold(1000.0)
    queued.clear()
    no_deadline = asyncio.create_task(line.enter(1, lambda *_: queued.set(), None))
    await asyncio.wait_for(queued.wait(), 30)  # no deadline: nothing to miss, it waits too
    assert line.shed == 0 and line.waiting == 2
    for task in (unestimated, no_deadline):
        task.cancel()
    await asyncio.gather(unestimated, no_deadline, return_exceptions=True)
    assert line.waiting == 0 and line.in_flight == 1
    line.leave()


async def test_a_slot_given_back_reports_how_long_it_was_held() -> None:
    from langflow_sandbox_createos.core import lease

    line = admission.Line("test")
    await line.enter(1, lambda *_: None)
    lease.Slot(line).leave()
    assert line.mean_hold is not None and line.mean_hold >= 0.0 and line.in_flight == 0


async def test_a_refused_executor_run_is_a_503_langflow_can_answer_with() -> None:
    """The refusal users see stays lfx's SandboxUnavailableError naming both settings; it is
    chained from an IntegrationError with status 503, retryable, with the estimate as
    retry_after, which Langflow's run API turns into its HTTP answer (tests/e2e: the real
    server's 503)."""
    from lfx.integrations.errors import IntegrationError
    from lfx.utils.sandbox.base import SandboxUnavailableError

    from langflow_sandbox_createos.core import lease

    line = admission.Line("test")  # the executor's admission on a line of the test's own
    executor_admission = dataclasses.replace(lease.EXECUTOR, line=line)
    await line.enter(1, lambda *_: None)  # the only slot, held by another "run"
    line.observe_hold(1000.0)
    with pytest.raises(SandboxUnavailableError) as caught:
        await executor_admission.enter(1, 120.0, subject="test")
    line.leave()
    text = str(caught.value)
    assert "refused at once" in text and "CREATEOS_EXECUTOR_MAX_GUESTS=1" in text, text
    assert "CREATEOS_EXECUTOR_MAX_WAIT_SECONDS=120" in text, text
    cause = caught.value.__cause__
    assert isinstance(cause, IntegrationError)
    assert cause.http_status == 503 and cause.retryable and getattr(cause, "retry_after", None) == 1000.0
    assert cause.code == "provider-unavailable" and "CREATEOS_EXECUTOR_MAX_GUESTS" in (cause.hint or "")
    assert line.in_flight == 0 and line.waiting == 0


async def test_a_burst_that_arrived_before_any_estimate_is_judged_when_the_first_run_ends() -> None:
    """Issue 45's timeouts at 64 in flight: a burst that arrives before any run has ended
    stands in line unjudged (nothing is known yet). When the first run gives its slot back (a
    hold of 10 s observed, one slot, 25 s allowed), the line judges every waiting run again:
    the first takes the slot, the second (10 s more, then 10 s of its own) stays, and the rest,
    who could not be served within 25 s, are refused then, not at their deadline; their
    refusal says how long they waited and that nothing of them ran."""
    line = admission.Line("test")
    await line.enter(1, lambda *_: None)
    queued: list[int] = []
    burst = [
        asyncio.create_task(line.enter(1, lambda ahead, _: queued.append(ahead), 25.0)) for _ in range(5)
    ]
    while len(queued) < 5:
        await asyncio.sleep(0.01)
    assert queued == [0, 1, 2, 3, 4] and line.shed == 0
    line.observe_hold(10.0)
    line.leave()
    done, pending = await asyncio.wait(burst, timeout=5)
    refused = [t.exception() for t in burst[2:]]
    assert burst[0] in done and burst[0].exception() is None, "the first run did not take the slot"
    assert pending == {burst[1]}, (
        "the second run should still wait (10 s more and 10 s of its own fit in 25 s)"
    )
    assert all(isinstance(exc, admission.Shed) for exc in refused), refused
    # each judged behind the two kept: 20 s more in line (the first's run, the second's), then 10
    assert [exc.ahead for exc in refused] == [2, 2, 2]
    assert all(0 < exc.waited < 5 and exc.hold == 10.0 and exc.expected == 20.0 for exc in refused), refused
    assert line.shed == 3 and line.waiting == 1 and line.in_flight == 1 and line.gave_up == 0
    text = admission.gave_up_text("A run", refused[0], "LIMIT", 1, "WAIT")
    assert "refused after 0 s in line" in text and "hold it about 10 s" in text and "WAIT=25" in text, text
    line.leave()  # the first run ends: the second takes its slot
    await asyncio.wait_for(burst[1], 5)
    line.leave()
    assert line.in_flight == 0 and line.waiting == 0


def test_a_sync_line_judges_its_waiting_callers_again_when_a_slot_is_given_back() -> None:
    """The same for the backend's and the component's line: a caller that waited unjudged is
    refused, when a slot is given back and the estimate says it cannot be served in time,
    rather than at its deadline."""
    import threading

    line = admission.SyncLine("test")
    line.enter(1, lambda *_: None)
    results: list[BaseException | None] = [None, None]
    waiting = threading.Barrier(3)

    def caller(i: int) -> None:
        try:
            line.enter(1, lambda *_: waiting.wait(), 25.0)
        except BaseException as exc:  # the test reads it
            results[i] = exc

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(2)]
    threads[0].start()
    while line.waiting < 1:
        time.sleep(0.01)
    threads[1].start()
    waiting.wait(timeout=10)
    started = time.monotonic()
    line.observe_hold(20.0)  # one slot, runs of 20 s: the second caller needs 20 + 20 > 25
    line.leave()
    threads[1].join(timeout=10)
    assert not threads[1].is_alive() and time.monotonic() - started < 10
    assert isinstance(results[1], admission.Shed) and results[1].waited > 0, results
    threads[0].join(timeout=10)
    assert results[0] is None and line.in_flight == 1 and line.shed == 1
    line.leave()
