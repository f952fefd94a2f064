"""Whole flows on createos-local guests: live events, framing, env forwarding and every
failure the executor must name. Real lfx on both sides; the devbox:1 guest runs this venv."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from lfx.execution.types import RunComplete, StepResult, Unit
from lfx.schema.schema import InputValueRequest
from lfx.utils.sandbox.base import SandboxExecutionError, SandboxUnavailableError

from langflow_sandbox_createos.executor import CreateOSExecutor
from langflow_sandbox_createos.executor.results import GuestStatus, RemoteVertexResult

from .conftest import chat_graph, drain, middle_graph
from .flow_components.digest import Digest
from .flow_components.env_reader import EnvReader
from .flow_components.forger import Forger
from .flow_components.needs_module import NeedsModule
from .flow_components.sleeper import Sleeper
from .flow_components.slow_echo import SlowEcho
from .flow_components.slow_exit import SlowExit

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(240)]


def _unit(graph: Any, text: str = "hi", **options: Any) -> Unit:
    return Unit(
        graph=graph, runtime_options={"initial_inputs": InputValueRequest(input_value=text), **options}
    )


def _vertex_ids(items: list[Any]) -> list[str]:
    return [
        i.payload.vertex.id
        for i in items
        if isinstance(i, StepResult) and isinstance(i.payload, RemoteVertexResult)
    ]


def _text(items: list[Any]) -> str:
    final = items[-1]
    assert isinstance(final, RunComplete)
    return final.outputs[0].outputs[0].results["message"].text


def _requests(cp: Any) -> dict[str, int]:
    return dict(cp.stats()["requests"])


async def test_vertex_events_arrive_live(executor: CreateOSExecutor, executor_env: Any) -> None:
    before = _requests(executor_env)
    arrivals: list[tuple[float, Any]] = []
    async for item in executor.execute(_unit(middle_graph(SlowEcho, "echo"))):
        arrivals.append((time.monotonic(), item))
    items = [item for _, item in arrivals]
    assert _vertex_ids(items) == ["chat-in", "middle", "chat-out"]
    assert _text(items) == "slow:hi"
    first_vertex_at = next(
        t for t, i in arrivals if isinstance(getattr(i, "payload", None), RemoteVertexResult)
    )
    # chat-in's event is in hand while the middle vertex still sleeps its 3 s in the guest
    assert arrivals[-1][0] - first_vertex_at >= 2.5
    assert isinstance(items[0].payload, GuestStatus) and items[0].payload.lfx_version
    # one guest, one exec, no file upload: the runner and spec travel on stdin
    assert executor_env.wait_until_no_live(timeout=5.0) == []  # deleted just after the run
    after = _requests(executor_env)
    delta = {
        k: after.get(k, 0) - before.get(k, 0)
        for k in ("create", "exec_stream", "exec", "files_put", "delete")
    }
    assert delta == {"create": 1, "exec_stream": 1, "exec": 0, "files_put": 0, "delete": 1}


async def test_forged_frames_and_scalars_change_nothing(executor: CreateOSExecutor) -> None:
    items = await drain(executor.execute(_unit(middle_graph(Forger, "forge"))))
    assert _vertex_ids(items) == ["chat-in", "middle", "chat-out"]
    assert _text(items) == "kept:hi"
    assert sum(isinstance(i, RunComplete) for i in items) == 1


async def test_only_allowlisted_env_reaches_the_guest(
    executor: CreateOSExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EXECUTOR_TEST_FORWARDED", "yes-forwarded")
    monkeypatch.setenv("EXECUTOR_TEST_NOT_FORWARDED", "must-not-cross")
    monkeypatch.setenv("CREATEOS_EXECUTOR_ENV", "EXECUTOR_TEST_FORWARDED")
    seen = json.loads(_text(await drain(executor.execute(_unit(middle_graph(EnvReader, "read"))))))
    assert seen == {
        "EXECUTOR_TEST_FORWARDED": "yes-forwarded",
        "EXECUTOR_TEST_NOT_FORWARDED": None,
        "CREATEOS_SANDBOX_API_KEY": None,
    }


async def test_missing_component_module_is_named(executor: CreateOSExecutor) -> None:
    with pytest.raises(SandboxExecutionError) as info:
        await drain(executor.execute(_unit(middle_graph(NeedsModule, "run_it"))))
    message = str(info.value)
    assert "createos_test_absent_module_xyz" in message
    assert "CREATEOS_EXECUTOR_ROOTFS" in message


def _guest_without_lfx(monkeypatch: pytest.MonkeyPatch) -> None:
    # devbox:1 is the plain image users start with: the system Python, no lfx.
    monkeypatch.setenv("CREATEOS_EXECUTOR_ROOTFS", "devbox:1")


async def test_guest_without_lfx_points_at_the_rootfs(
    executor: CreateOSExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    _guest_without_lfx(monkeypatch)
    with pytest.raises(SandboxUnavailableError) as info:
        await drain(executor.execute(_unit(chat_graph())))
    assert "no importable lfx" in str(info.value)
    assert "CREATEOS_EXECUTOR_ROOTFS" in str(info.value)


async def test_failed_install_is_reported_as_a_failed_install(
    executor: CreateOSExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    _guest_without_lfx(monkeypatch)
    monkeypatch.setenv("CREATEOS_EXECUTOR_INSTALL_LFX", "true")
    # --no-index keeps pip offline, so it fails at once and the same way every time.
    monkeypatch.setenv("CREATEOS_EXECUTOR_PIP", "--no-index some-package-that-does-not-exist-xyz")
    started = time.monotonic()
    with pytest.raises(SandboxExecutionError) as info:
        await drain(executor.execute(_unit(chat_graph())))
    message = str(info.value)
    assert "install (CREATEOS_EXECUTOR_INSTALL_LFX) failed: pip exited" in message
    assert "some-package-that-does-not-exist-xyz" in message
    assert "No matching distribution" in message or "Could not find a version" in message
    assert time.monotonic() - started < 60


async def test_timeout_is_reported_as_a_timeout(
    executor: CreateOSExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CREATEOS_EXECUTOR_TIMEOUT_SECONDS", "4")
    started = time.monotonic()
    with pytest.raises(SandboxExecutionError) as info:
        await drain(executor.execute(_unit(middle_graph(Sleeper, "nap"))))
    assert "timed out" in str(info.value)
    assert "CREATEOS_EXECUTOR_TIMEOUT_SECONDS" in str(info.value)
    assert time.monotonic() - started < 30


async def test_a_run_ends_at_the_runners_done_frame_not_at_its_exit(executor: CreateOSExecutor) -> None:
    """After `done` the runner only leaves; here its leaving takes a minute (a component's
    stderr flushes slowly). The run is complete at `done`, and its guest deleted."""
    arrivals: list[tuple[float, Any]] = []
    async for item in executor.execute(_unit(middle_graph(SlowExit, "leave_slowly"))):
        arrivals.append((time.monotonic(), item))
    items = [item for _, item in arrivals]
    assert _text(items) == "slow-exit:hi"
    last_vertex_at = max(
        t for t, i in arrivals if isinstance(getattr(i, "payload", None), RemoteVertexResult)
    )
    assert arrivals[-1][0] - last_vertex_at < 20  # not the minute the runner takes to exit


async def test_early_close_deletes_the_guest_quickly(executor: CreateOSExecutor, executor_env: Any) -> None:
    stream = executor.execute(_unit(middle_graph(Sleeper, "nap")))
    async for item in stream:
        if isinstance(item.payload, RemoteVertexResult):
            break  # chat-in is done; the sleeper is running in the guest
    assert executor_env.live_sandboxes(), "the guest should still be running"
    started = time.monotonic()
    await stream.aclose()
    assert time.monotonic() - started < 5
    assert executor_env.wait_until_no_live(timeout=5.0) == []


async def test_closing_a_run_wakes_when_its_guest_delete_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    """close() (a stale pooled guest's, before the run goes to a fresh one) is woken by the
    delete's thread, not by polling."""
    import asyncio
    import types

    from langflow_sandbox_createos.core import settings
    from langflow_sandbox_createos.core.lease import Lease
    from langflow_sandbox_createos.executor import run as executor_run

    returned: list[float] = []

    class Client:
        def delete(self, sandbox_id: str) -> None:
            time.sleep(0.3)
            returned.append(time.monotonic())

    def no_polling(*_: Any) -> None:
        raise AssertionError("close() polled")

    endpoint = types.SimpleNamespace(client=Client())
    guest = Lease(endpoint, "sb-test", held=False)  # type: ignore[arg-type]
    run = executor_run._Run(endpoint, settings.executor_settings({}), None, pooled=guest)  # type: ignore[arg-type]
    monkeypatch.setattr(asyncio, "sleep", no_polling)
    started = time.monotonic()
    await run.close()
    closed = time.monotonic()
    assert returned and returned[0] - started >= 0.3
    assert closed - returned[0] < 0.1


def test_wait_for_deletes_while_a_delete_thread_is_starting(
    executor_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run's guest delete goes to a thread of its own; wait_for_deletes (tests, interpreter
    exit, the reliability harness) may take the list of those threads while one is still
    being started. join() refuses a thread not yet started, so the list must never hold one:
    here every thread start is slowed down, and wait_for_deletes is called in that window."""
    import threading

    from langflow_sandbox_createos.core import connection, lease, pool_keeper, settings
    from langflow_sandbox_createos.executor import run as executor_run

    cp = executor_env
    endpoint = connection.endpoints.get()
    guests = [endpoint.client.create({"shape": "s-1vcpu-256mb"})["id"] for _ in range(2)]
    for guest in guests:
        pool_keeper.hold(endpoint, guest)
    runs = [
        executor_run._Run(
            endpoint, settings.executor_settings({}), None, pooled=lease.Lease(endpoint, guest, held=True)
        )
        for guest in guests
    ]
    real_start = threading.Thread.start
    starting = threading.Event()

    def slow_start(self: threading.Thread) -> None:
        if self.name == "createos-guest-delete":
            starting.set()
            time.sleep(0.3)  # the window in which the thread is listed but not started
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", slow_start)
    errors: list[BaseException] = []

    def waiter() -> None:
        starting.wait(10)
        try:
            lease.wait_for_deletes(30)
        except BaseException as exc:
            errors.append(exc)

    watchers = [threading.Thread(target=waiter) for _ in range(2)]
    for watcher in watchers:
        real_start(watcher)
    for run in runs:
        run.close_soon()
    for watcher in watchers:
        watcher.join(60)
    assert errors == []
    lease.wait_for_deletes(30)
    assert cp.wait_until_no_live(timeout=10.0) == []
    assert not set(guests) & set(pool_keeper.keepers.held_ids())


async def test_legacy_arun_inputs_and_output_selection(executor: CreateOSExecutor) -> None:
    """Graph.arun's shape: inputs on the unit, outputs picked by id, host-only options dropped."""
    unit = Unit(
        graph=chat_graph(),
        inputs=[{"input_value": "first"}, {"input_value": "second"}],
        runtime_options={
            "outputs": ["chat-out"],
            "session_id": "s1",
            "event_manager": object(),
            "_use_arun_legacy": True,
            "fallback_to_env_vars": False,
            "something_unknown": object(),
        },
    )
    items = await drain(executor.execute(unit))
    runs = items[-1].outputs
    assert [r.inputs for r in runs] == [{"input_value": "first"}, {"input_value": "second"}]
    # whatever lfx's own legacy path answers for the same graph and inputs (lfx 1.13 answers
    # "first" twice: the second pass reuses the chat input's built result)
    in_process = await chat_graph()._arun_legacy(
        inputs=[{"input_value": "first"}, {"input_value": "second"}], outputs=["chat-out"], session_id="s1"
    )
    expected = [r.outputs[0].results["message"].text for r in in_process]
    assert [r.outputs[0].results["message"].text for r in runs] == expected
    assert expected[0] == "first"


async def test_a_spec_over_4_mib_is_uploaded_and_runs(executor: CreateOSExecutor, executor_env: Any) -> None:
    """A flow whose spec is over STDIN_SPEC_MAX_BYTES travels as a file (one PUT), not stdin."""
    import hashlib

    from langflow_sandbox_createos.core import lease
    from langflow_sandbox_createos.executor import run as executor_module

    payload = "0123456789abcdef" * (executor_module.STDIN_SPEC_MAX_BYTES // 16 + 4096)  # 4 MiB + 64 KiB
    graph = middle_graph(Digest, "digest", payload=payload)
    before = _requests(executor_env)
    items = await drain(executor.execute(_unit(graph, "big")))
    lease.wait_for_deletes(30.0)  # the run returns before its guest's delete does
    after = _requests(executor_env)
    expected = f"big:{len(payload)}:{hashlib.sha256(payload.encode()).hexdigest()}"
    assert _text(items) == expected
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in ("create", "files_put", "exec_stream", "delete")}
    assert delta == {"create": 1, "files_put": 1, "exec_stream": 1, "delete": 1}
    assert executor_env.wait_until_no_live(timeout=5.0) == []
