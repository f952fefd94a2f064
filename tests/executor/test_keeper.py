"""No executor guest outlives its process: a run's guest (`lf-x-`, or a pooled `lf-xw-` one a
run took) is held in the pool keeper from its create until the run deleted it, so a process
killed while the flow runs leaves it to the keeper, and a run that ends releases it.

The benchmark that found this (docs/performance.md, S8 finding 3) killed a Langflow server
mid-load and found 8 `lf-x-` guests of runs in flight still running."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import pytest
from keeper_child import KEEPER_LINE, WAYS, every_id, run_child, wait_exited, wait_gone

from langflow_sandbox_createos.core import admission, pool_keeper
from langflow_sandbox_createos.executor import CreateOSExecutor

from .conftest import EXECUTOR_ROOTFS, REPO, chat_unit, drain
from .test_warm_pool import status

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]

# ChatInput -> Sleeper (120 s) -> ChatOutput; the child reports once the guest is ready and the
# flow is under way. With CREATEOS_EXECUTOR_WARM_POOL the pool is filled first, so the run takes
# a pooled guest.
IN_FLIGHT = f"""
import asyncio
sys.path.insert(0, {str(REPO / "tests" / "executor" / "flow_components")!r})
from sleeper import Sleeper
from lfx.components.input_output import ChatInput, ChatOutput
from lfx.execution.types import Unit
from lfx.graph import Graph
from lfx.schema.schema import InputValueRequest
from langflow_sandbox_createos.core import connection, settings
from langflow_sandbox_createos.executor import CreateOSExecutor
from langflow_sandbox_createos.executor import pool as executor_pool
from langflow_sandbox_createos.executor.results import GuestStatus

pooled = bool(os.environ.get("CREATEOS_EXECUTOR_WARM_POOL"))
if pooled:
    executor_pool.take(connection.endpoints.get(), settings.executor_settings(), {{}})
    assert executor_pool.pool().wait_full(240), executor_pool.pool().stats()
chat_in, middle, chat_out = ChatInput(_id="chat-in"), Sleeper(_id="middle"), ChatOutput(_id="chat-out")
middle.set(input_value=chat_in.message_response)
chat_out.set(input_value=middle.nap)
unit = Unit(graph=Graph(chat_in, chat_out), runtime_options={{"initial_inputs": InputValueRequest(input_value="x")}})

async def main():
    async for item in CreateOSExecutor().execute(unit):
        guest = getattr(item, "payload", None)
        if isinstance(guest, GuestStatus):
            if pooled:  # the refill's create is not in flight at the kill
                assert executor_pool.pool().wait_full(240), executor_pool.pool().stats()
            time.sleep(1.0)  # the flow is under way (Sleeper naps)
            report(run=[guest.sandbox_id], pooled=guest.pooled)
            die(HOW)
            raise SystemExit("died")

asyncio.run(main())
"""


def child_env(**extra: str) -> dict[str, str]:
    return dict(os.environ, CREATEOS_EXECUTOR_ROOTFS=EXECUTOR_ROOTFS, **extra)


def killed_mid_run(cp: Any, how: str, **extra: str) -> dict[str, Any]:
    """Run IN_FLIGHT in a child that dies by `how`; every guest it created must go."""
    before = every_id(cp)
    report, stderr = run_child(IN_FLIGHT, how, child_env(**extra))
    (guest,) = report["run"]
    assert guest in report["held"], report
    assert KEEPER_LINE in stderr, stderr
    created = every_id(cp) - before
    assert guest in created
    wait_gone(cp, created)
    wait_exited(report["keeper"])
    return report


@pytest.mark.parametrize("how", WAYS)
def test_a_killed_process_leaves_no_guest_of_a_run_in_flight(executor_env: Any, how: str) -> None:
    report = killed_mid_run(executor_env, how)
    assert report["pooled"] is False


def test_a_pooled_guest_taken_by_a_run_in_flight_goes_with_the_process(executor_env: Any) -> None:
    """The pool used to release a guest at take: a run in flight on it was no longer held."""
    report = killed_mid_run(executor_env, "SIGKILL", CREATEOS_EXECUTOR_WARM_POOL="1")
    assert report["pooled"] is True


CLEAN = """
import asyncio
from lfx.components.input_output import ChatInput, ChatOutput
from lfx.execution.types import Unit
from lfx.graph import Graph
from lfx.schema.schema import InputValueRequest
from langflow_sandbox_createos.executor import CreateOSExecutor

chat_in, chat_out = ChatInput(_id="chat-in"), ChatOutput(_id="chat-out")
chat_out.set(input_value=chat_in.message_response)
unit = Unit(graph=Graph(chat_in, chat_out), runtime_options={"initial_inputs": InputValueRequest(input_value="bye")})

async def main():
    return [item async for item in CreateOSExecutor().execute(unit)]

asyncio.run(main())
from langflow_sandbox_createos.executor import run
run.wait_for_deletes(60)  # the run returned before its guest's delete did
report(run=[])
die(HOW)
"""


def test_a_clean_run_leaves_the_keeper_nothing_to_do(executor_env: Any) -> None:
    before = every_id(executor_env)
    report, stderr = run_child(CLEAN, "exit", child_env())
    assert report["held"] == []  # the run deleted its guest and released it
    wait_exited(report["keeper"])
    assert KEEPER_LINE not in stderr, stderr
    created = every_id(executor_env) - before
    assert created
    wait_gone(executor_env, created)


async def _until(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not within the time"
        await asyncio.sleep(0.01)


async def test_a_run_releases_its_guest_and_a_failed_delete_keeps_it_held(
    executor: CreateOSExecutor, executor_env: Any
) -> None:
    cp = executor_env
    ok = status(await drain(executor.execute(chat_unit("one")))).sandbox_id
    await _until(lambda: ok not in pool_keeper.keepers.held_ids())  # deleted just after the run

    cp.set_faults({"rules": [{"route": "delete", "status": 500, "times": 1}]})
    failed = status(await drain(executor.execute(chat_unit("two")))).sandbox_id
    await _until(lambda: admission.executor_line.in_flight == 0)  # its delete returned (failed)
    assert cp.fault_hits() == [1]
    cp.clear_faults()
    assert failed in pool_keeper.keepers.held_ids()  # the keeper still deletes it at exit
    cp.delete_sandbox(failed)  # what the keeper would do; so the cp fixture's check holds
    pool_keeper.release(failed)
