"""The sandbox bridge under bursts (issue 42): a guest that sends more sandbox requests than a
run may make, in one chunk, gets the first MAX_REQUESTS_PER_RUN served and each one past them
refused, in arrival order; at most MAX_IN_FLIGHT of a run's requests run at once; and the
host's side runs on the bridge's own threads, so hostile runs holding them leave the event
loop's default pool, and every other run, alone.

The host's sandbox backend here is a probe of the test's own (registered in lfx's registry as
any backend is): it runs nothing, counts the calls in flight at once, and holds them until the
test lets go. The guests are real executor runs on createos-local; the hostile flow code is
`flow_components/bridge_burst.py`, which writes its requests in one write."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from lfx.utils.sandbox.base import Capabilities, SandboxExecutionError, SandboxResult

from langflow_sandbox_createos.executor import CreateOSExecutor, bridge

from .conftest import chat_unit, drain
from .flow_components.bridge_burst import BridgeBurst
from .parity.test_parity import FLOW_ID, USER_ID, HostMemory, Run, memory, run_flow

__all__ = ["memory"]  # the fixture, imported for this module's tests
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(600)]

PROBE_NAME = "bridge-probe"
HOLD_SECONDS = 240  # a guard against a test that never lets go, never a verdict


class BridgeProbe:
    """The host's sandbox backend in these tests (lfx's SandboxBackend protocol)."""

    name = PROBE_NAME

    def __init__(self) -> None:
        self.arm()

    def arm(
        self,
        hold_from: int | None = None,
        release_at: int | None = None,
        full_at: int = 4,
        release_if: Any = None,
    ) -> None:
        """Calls from the `hold_from`-th (1-based) wait until `release_at` are in flight at
        once, or `release_if(in_flight)` holds (None: until `gate` is set); `full` is set once
        `full_at` are in flight."""
        self._lock = threading.Lock()
        self.calls = self.in_flight = self.peak = 0
        self.hold_from, self.release_at, self.full_at = hold_from, release_at, full_at
        self.release_if = release_if
        self.gate, self.full = threading.Event(), threading.Event()

    def _hold(self) -> bool:
        """Until the gate opens (or `release_if` opens it): False if it never did."""
        deadline = threading.Event()
        timer = threading.Timer(HOLD_SECONDS, deadline.set)
        timer.start()
        try:
            while not self.gate.is_set() and not deadline.is_set():
                if self.release_if is not None and self.release_if(self.in_flight):
                    self.gate.set()
                self.gate.wait(0.005)  # a look at the condition again, never a verdict
            return self.gate.is_set()
        finally:
            timer.cancel()

    def capabilities(self) -> Capabilities:
        return Capabilities(
            isolation="hardware-virtualized", supports_deny_all_egress=True, supports_domain_allowlist=True
        )

    def run(self, code: str, *, env: dict[str, str] | None = None) -> SandboxResult:
        with self._lock:
            self.calls += 1
            index = self.calls
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            if self.release_at is not None and self.in_flight >= self.release_at:
                self.gate.set()
            if self.in_flight >= self.full_at:
                self.full.set()
        try:
            if self.hold_from is not None and index >= self.hold_from and not self._hold():
                raise SandboxExecutionError("the test never let the probe go")
            return SandboxResult(stdout=f"probe call {index}\n", stderr="", exit_code=0, execution_time_ms=0)
        finally:
            with self._lock:
                self.in_flight -= 1

    def shutdown(self) -> None:
        self.gate.set()

    def reset_after_fork(self) -> None:
        self.arm()


PROBE = BridgeProbe()


@pytest.fixture
def probe(executor_env: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[BridgeProbe]:
    """This process as a Langflow host whose sandbox backend is the probe."""
    import lfx.utils.sandbox as dispatch
    from lfx.utils.sandbox import registry

    if PROBE_NAME not in registry.known_sandbox_backends():
        registry.register_sandbox_backend(PROBE_NAME, lambda: PROBE)
    for module in (registry, dispatch):
        monkeypatch.setattr(module, "get_sandbox_backend", lambda: PROBE_NAME)
    PROBE.arm()
    yield PROBE
    PROBE.gate.set()  # nothing stays held past its test


def burst_graph(count: int, tag: str) -> Any:
    """Python Interpreter (its own run: one request) -> Bridge Burst (`count` more, for the
    Python Interpreter node) -> Chat Output."""
    from lfx.components.input_output import ChatOutput
    from lfx.components.utilities.python_repl_core import PythonREPLComponent
    from lfx.graph import Graph

    repl = PythonREPLComponent(
        _id=f"PythonREPLComponent-{tag}", global_imports="math", python_code="print(1)"
    )
    burst = BridgeBurst(_id=f"BridgeBurst-{tag}", target=f"PythonREPLComponent-{tag}", count=count)
    burst.set(seen=repl.run_python_repl)
    out = ChatOutput(_id=f"ChatOutput-{tag}")
    out.set(input_value=burst.burst)
    return Graph(repl, out, flow_id=FLOW_ID, user_id=USER_ID)


def report(run: Run) -> dict[str, Any]:
    return json.loads(next(m[1] for m in run.messages if m[1].startswith("{")))


async def until(event: threading.Event) -> None:
    """Wait for a threading.Event on a thread of its own (never a pool the test watches)."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def wait() -> None:
        event.wait(HOLD_SECONDS)
        loop.call_soon_threadsafe(done.set_result, None)

    threading.Thread(target=wait, daemon=True).start()
    await done


def watch_bridges(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every SandboxBridge made from now on (the host's side of each run)."""
    made: list[Any] = []
    original = bridge.SandboxBridge.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(bridge.SandboxBridge, "__init__", init)
    return made


async def test_a_burst_past_the_cap_is_served_up_to_it_and_refused_beyond_in_arrival_order(
    probe: BridgeProbe, memory: HostMemory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """300 requests in one write, after the Python Interpreter's own (reply 1): replies 2-256
    are served (256 with the node's own), 257-301 each refused, and no more than 4 ran on the
    host at once (the probe holds the burst's calls until 4 are in flight together). Fails on
    ac8509d: the cap was compared after waiting for a slot, when all 301 had arrived, so the
    burst was refused whole."""
    cap, slots = bridge.MAX_REQUESTS_PER_RUN, bridge.MAX_IN_FLIGHT
    bridges = watch_bridges(monkeypatch)
    # held until the cap is seen to hold (a full set in flight and one more waiting for a slot),
    # or seen broken (more than a full set in flight): a verdict by state, not by time
    probe.arm(
        hold_from=2,
        release_if=lambda in_flight: (
            in_flight > slots or (in_flight == slots and any(b.waiting for b in bridges))
        ),
    )
    ours = await run_flow(CreateOSExecutor(), burst_graph(300, "burst"), memory, "s-burst", [])
    got = report(ours)
    assert got["served"] == list(range(2, cap + 1)), got["served"][:10]
    assert [int(n) for n in got["refused"]] == list(range(cap + 1, 302))
    assert all(f"more than {cap} sandbox requests" in m for m in got["refused"].values()), got["refused"]
    assert probe.calls == cap
    assert probe.peak == slots


async def test_runs_filling_the_bridge_threads_leave_the_default_pool_and_other_runs_alone(
    probe: BridgeProbe, memory: HostMemory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two hostile runs each hold 4 sandbox calls on the host (8 asked) with the bridge's threads
    set to 4 and the event loop's default pool to 4: at most 4 run at once, and meanwhile the
    default pool serves other work and an ordinary executor run completes. Fails on ac8509d,
    where the bridge ran its calls on the default pool: held calls filled it, and the default
    pool's next job (and every run of the process) waited for them."""
    loop = asyncio.get_running_loop()
    default = ThreadPoolExecutor(max_workers=4, thread_name_prefix="test-default")
    loop.set_default_executor(default)
    monkeypatch.setattr(bridge, "BRIDGE_THREADS", 4)
    monkeypatch.setattr(bridge, "_pool", None)
    probe.arm(hold_from=3, full_at=4)  # each run's Python Interpreter call passes; the bursts wait
    hostile = [
        asyncio.create_task(
            run_flow(CreateOSExecutor(), burst_graph(4, f"hold{i}"), memory, f"s-hold{i}", [])
        )
        for i in range(2)
    ]
    try:
        await asyncio.wait_for(until(probe.full), HOLD_SECONDS)
        assert await asyncio.wait_for(loop.run_in_executor(None, lambda: "default pool free"), 120) == (
            "default pool free"
        )
        items = await asyncio.wait_for(
            drain(CreateOSExecutor().execute(chat_unit("still served"))), HOLD_SECONDS
        )
        assert type(items[-1]).__name__ == "RunComplete", items[-1]
        assert (probe.in_flight, probe.peak) == (4, 4)  # 8 asked, the bridge's 4 threads at work
    finally:
        probe.gate.set()
        runs = await asyncio.gather(*hostile, return_exceptions=True)
        pool = bridge._pool
        if pool is not None:
            pool.shutdown(wait=False)
        default.shutdown(wait=False)
    for run in runs:
        assert isinstance(run, Run), run
        assert report(run) == {"served": [2, 3, 4, 5], "refused": {}}
    assert probe.calls == 10 and probe.peak == 4
