"""One time value per run, in named phases: the exec deadline and the auto-pause budget are read
from it (core/budget.py), with the figures each surface had when they were hand-written sums."""

from __future__ import annotations

from langflow_sandbox_createos.component import wrapper
from langflow_sandbox_createos.core import budget


def test_the_backend_budget_is_the_program_and_its_grace() -> None:
    run = budget.backend(30)
    assert run.phases == (("program", 30.0),)
    assert run.exec_timeout() == 30 + 15
    assert run.auto_pause_seconds() == 30 + 120


def test_the_components_lock_wait_is_another_whole_run_then_its_fetch() -> None:
    # its pending wait 20, its program, its archive 30, the wrapper around them 15; then 20
    assert wrapper.lock_wait_seconds(60) == 20 + 60 + 30 + 15 + 20


def test_the_components_phases_make_its_deadline_and_its_guests_auto_pause() -> None:
    reused = wrapper.time_budget(60, lock=True, collect=True)
    assert reused.phases == (("lock wait", 145.0), ("program", 60.0), ("archive", 30.0))
    assert reused.exec_timeout() == 145 + 60 + 30 + 20
    assert reused.auto_pause_seconds() == 145 + 60 + 30 + 120
    fresh = wrapper.time_budget(60, lock=False, collect=False)
    assert fresh.exec_timeout() == 60 + 20
    # a fresh guest's auto-pause covers a run that returns files
    assert wrapper.time_budget(60, lock=False, collect=True).auto_pause_seconds() == 60 + 30 + 120


def test_a_pooled_executor_runners_spec_wait_is_a_phase() -> None:
    pooled = budget.executor(180, spec_wait=300 + 30)
    assert pooled.phase("spec wait") == 330 and pooled.phase("program") == 180
    assert pooled.exec_timeout() == 330 + 180 + 30
    assert pooled.auto_pause_seconds() == 330 + 180 + 120
    assert budget.executor(180).exec_timeout() == 180 + 30


def test_the_auto_pause_budget_is_bounded() -> None:
    assert budget.auto_pause_seconds(0) == 120
    assert budget.auto_pause_seconds(-100) == 60
    assert budget.auto_pause_seconds(10**6) == 86400
