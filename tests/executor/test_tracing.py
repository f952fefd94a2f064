"""An executor run reaches the host's tracers as an in-process run does (issue 41).

A tracing service is registered on the host (lfx's service seam, where Langflow registers its
own and its tracers hang: the native trace view, LangSmith, Langfuse, ...). It records what
lfx hands it, with the same per-task context rules as Langflow's service: the trace a run
opens, each component span (its vertex, name, type, inputs, metadata, logs, outputs, error),
and the trace's end. Each flow runs in-process and through the executor, and the two span
trees must be the same. On ac8509d the executor's runs reached no tracer at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from lfx.execution.backends.in_process import InProcessExecutor
from lfx.utils.sandbox.base import SandboxExecutionError

from langflow_sandbox_createos.executor import CreateOSExecutor

from .flow_components.chatty import Chatty
from .flow_components.raiser import Raiser
from .parity.test_parity import HostMemory, memory, middle, run_flow

__all__ = ["memory"]
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]


def _plain(value: Any) -> Any:
    """What a tracer stores of a value: lfx's serialization, as JSON (timestamps, ids and run ids
    dropped: they differ between any two runs; the trace's run id is compared apart)."""
    from lfx.serialization.serialization import serialize

    data = json.loads(json.dumps(serialize(value), default=str))
    return _drop(data, {"timestamp", "id", "flow_id", "run_id", "session_metadata"})


def _drop(data: Any, keys: set[str]) -> Any:
    if isinstance(data, dict):
        return {k: _drop(v, keys) for k, v in data.items() if k not in keys}
    if isinstance(data, list):
        return [_drop(v, keys) for v in data]
    return data


@dataclass
class Span:
    vertex: str
    name: str
    trace_type: str
    inputs: Any
    metadata: Any
    logs: list[Any] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


@dataclass
class Trace:
    start: dict[str, Any]
    spans: list[Span] = field(default_factory=list)
    end: dict[str, Any] | None = None


_TRACE: contextvars.ContextVar[Trace | None] = contextvars.ContextVar("test_trace", default=None)
_SPAN: contextvars.ContextVar[Span | None] = contextvars.ContextVar("test_span", default=None)


class RecordingTracing:
    """A tracing service that records what it is handed (Langflow's service's API and
    context rules: the trace is the caller's context's, a span its task's)."""

    name = "tracing_service"
    deactivated = False
    ready = True

    def __init__(self) -> None:
        self.traces: list[Trace] = []

    def set_ready(self) -> None:
        self.ready = True

    async def start_tracers(
        self, run_id: Any, run_name: Any, user_id: Any, session_id: Any, **kw: Any
    ) -> None:
        trace = Trace(
            start={
                "run_id": str(run_id),
                "run_name": run_name,
                "user_id": str(user_id),
                "session_id": session_id,
                **{k: v for k, v in kw.items() if k != "project_name"},
            }
        )
        self.traces.append(trace)
        _TRACE.set(trace)

    async def end_tracers(self, outputs: dict[str, Any], error: BaseException | None = None) -> None:
        trace = _TRACE.get()
        assert trace is not None, "end_tracers outside a trace"
        kept = {k: v for k, v in outputs.items() if k in ("flow_id", "flow_name")}
        trace.end = {"outputs": kept, "error": str(error) if error else None}

    @contextlib.asynccontextmanager
    async def trace_component(
        self, component: Any, trace_name: str, inputs: Any, metadata: Any = None
    ) -> Any:
        trace = _TRACE.get()
        assert trace is not None, "trace_component outside a trace"
        span = Span(
            vertex=str(component.get_vertex().id),
            name=trace_name,
            trace_type=component.trace_type,
            inputs=_plain(inputs),
            metadata=_plain(metadata or {}),
        )
        trace.spans.append(span)
        token = _SPAN.set(span)
        try:
            yield self
        except Exception as exc:
            span.error = str(exc)
            raise
        finally:
            _SPAN.reset(token)

    def add_log(self, trace_name: str, log: Any) -> None:
        span = _SPAN.get()
        assert span is not None and span.name == trace_name
        entry = log.model_dump() if hasattr(log, "model_dump") else log
        span.logs.append(_plain({k: entry.get(k) for k in ("name", "message", "type")}))

    def set_outputs(self, trace_name: str, outputs: dict[str, Any], output_metadata: Any = None) -> None:
        span = _SPAN.get()
        assert span is not None and span.name == trace_name
        span.outputs.update(_plain(outputs))

    def get_langchain_callbacks(self) -> list[Any]:
        return []

    def get_tracer(self, tracer_name: str) -> Any:
        return None

    @property
    def project_name(self) -> Any:
        return None


@pytest.fixture
def tracing(executor_env: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[RecordingTracing]:
    from lfx.services.manager import get_service_manager
    from lfx.services.schema import ServiceType

    recorder = RecordingTracing()
    monkeypatch.setitem(get_service_manager().services, ServiceType.TRACING_SERVICE, recorder)
    yield recorder


def tree(trace: Trace) -> dict[str, Any]:
    spans = sorted(
        (
            {
                "vertex": s.vertex,
                "name": s.name,
                "type": s.trace_type,
                "inputs": s.inputs,
                "metadata": s.metadata,
                "logs": s.logs,
                "outputs": s.outputs,
                "error": s.error,
            }
            for s in trace.spans
        ),
        key=lambda s: s["vertex"],
    )
    return {"start": trace.start, "spans": spans, "end": trace.end}


async def _both_traced(tracing: RecordingTracing, memory: HostMemory, make: Any, session: str) -> list[Any]:
    trees = []
    for executor in (InProcessExecutor(), CreateOSExecutor()):
        before = len(tracing.traces)
        graph = make()
        graph.set_run_id()  # Langflow gives each run its id before it runs (both get their own)
        try:
            await run_flow(executor, graph, memory, session, [{"input_value": "hello"}])
        except (ValueError, SandboxExecutionError) as exc:  # a failing flow: its trace is compared
            assert "parity-boom" in str(exc), exc
        for _ in range(5):  # lfx ends a trace in a task of its own
            await asyncio.sleep(0)
        new = tracing.traces[before:]
        assert len(new) == 1, (type(executor).__name__, new)
        found = tree(new[0])
        assert found["start"]["run_id"] == str(graph._run_id)  # the host graph's run, both ways
        found["start"].pop("run_id")
        trees.append(found)
    return trees


async def test_the_executor_runs_span_tree_is_the_in_process_one(
    tracing: RecordingTracing, memory: HostMemory
) -> None:
    reference, ours = await _both_traced(tracing, memory, lambda: middle(Chatty, "talk"), "s-trace")
    assert ours == reference
    assert [s["vertex"] for s in ours["spans"]] == ["chat_input", "chat_output", "middle"]
    chatty = next(s for s in ours["spans"] if s["vertex"] == "middle")
    assert [log["name"] for log in chatty["logs"]] == ["Log 1", "details"], chatty
    assert chatty["outputs"]["message"]["text"] == "said hello", chatty
    assert ours["end"] == {"outputs": {"flow_id": ours["start"]["flow_id"], "flow_name": None}, "error": None}


async def test_a_failing_component_is_an_error_span_and_ends_the_trace_with_it(
    tracing: RecordingTracing, memory: HostMemory
) -> None:
    reference, ours = await _both_traced(tracing, memory, lambda: middle(Raiser, "boom"), "s-trace-err")
    assert ours == reference
    raiser = next(s for s in ours["spans"] if s["vertex"] == "middle")
    assert "parity-boom on hello" in str(raiser["error"]), raiser
    assert ours["end"] is not None and "parity-boom on hello" in str(ours["end"]["error"]), ours["end"]


def split_loop_graph() -> Any:
    """The Split Text -> Loop -> Chat Output flow, as a served flow is: built from its JSON (lfx
    then runs each iteration as a subgraph of the run, which opens a trace of its own for the
    run's id from inside the Loop's build)."""
    from lfx.graph import Graph

    from .parity.test_parity import FLOW_ID, USER_ID, split_loop_flow

    return Graph.from_payload(split_loop_flow("loop"), flow_id=FLOW_ID, user_id=USER_ID)


async def test_a_loop_flow_gives_the_operator_one_ended_trace_as_in_process(
    tracing: RecordingTracing, memory: HostMemory
) -> None:
    """In-process each loop iteration's subgraph starts a trace for the run's id that is never
    ended (Langflow's service never flushes it: the operator sees one trace per run). At f7cbc2a
    the executor replayed each of those as a trace of the host's, ended them all with "the run
    ended before its trace did", and Langflow's trace view wrote one trace id four times at once
    (`UNIQUE constraint failed: trace.id`)."""
    found = []
    for executor in (InProcessExecutor(), CreateOSExecutor()):
        before = len(tracing.traces)
        graph = split_loop_graph()
        graph.set_run_id()
        await run_flow(executor, graph, memory, "s-loop", [{"input_value": "a,b,c"}])
        for _ in range(20):  # lfx ends a trace in a task of its own
            await asyncio.sleep(0.05)
        new = tracing.traces[before:]
        ended = [t for t in new if t.end is not None]
        assert len(ended) == 1, (type(executor).__name__, [tree(t) for t in new])
        assert ended[0].start["run_id"] == str(graph._run_id)
        found.append(tree(ended[0]))
        if isinstance(executor, CreateOSExecutor):  # nothing half-open is left on the host
            assert new == ended, [tree(t) for t in new]
    reference, ours = found
    reference["start"].pop("run_id")
    ours["start"].pop("run_id")
    assert _untimed(ours) == _untimed(reference)
    assert [s["vertex"] for s in ours["spans"]] == [
        "ChatInput-loop1",
        "LoopComponent-loop3",
        "SplitText-loop2",
    ]
    assert ours["end"]["error"] is None, ours["end"]


def _untimed(found: dict[str, Any]) -> Any:
    """The Loop logs how long its iterations took ("Completed 3 iteration(s) in 0.050s")."""
    return json.loads(re.sub(r"in \d+\.\d+s", "in <t>s", json.dumps(found, default=str)))


@pytest.mark.parametrize("numbers", [(1, 2), (5, 2, 3)], ids=["in-order", "out-of-order"])
async def test_traces_of_one_run_reach_the_tracers_one_after_another(
    tracing: RecordingTracing, numbers: tuple[int, ...]
) -> None:
    """A guest may open a run's next trace before the last one ended (Graph.arun's passes end
    theirs in a task); every trace of a run has the run's id, so the host starts the next only
    once the last has ended: Langflow's trace view writes a trace by id, two writers at once
    lose one. "The last" is the one started last, whatever number the guest gave it."""
    from langflow_sandbox_createos.executor.tracing import HostTrace

    calls: list[str] = []
    start, end = tracing.start_tracers, tracing.end_tracers

    async def slow_start(*args: Any, **kwargs: Any) -> None:
        calls.append("start")
        await start(*args, **kwargs)

    async def slow_end(outputs: dict[str, Any], error: BaseException | None = None) -> None:
        calls.append("end")
        await asyncio.sleep(0.2)  # the native tracer's flush
        await end(outputs, error)
        calls.append("flushed")

    tracing.start_tracers = slow_start  # type: ignore[method-assign]
    tracing.end_tracers = slow_end  # type: ignore[method-assign]
    run_id = "0f0f0f0f-0000-4000-8000-000000000001"
    host = HostTrace(None, {"tracing": {}, "run_id": run_id, "flow_id": "f", "graph": {"nodes": []}})
    for number in numbers:
        host.handle({"op": "start", "trace": number, "run_id": run_id})
    for number in numbers:
        host.handle({"op": "end", "trace": number, "outputs": {}})
    await host.close(None)
    assert calls == ["start", "end", "flushed"] * len(numbers), calls
    assert [t.start["run_id"] for t in tracing.traces] == [run_id] * len(numbers)
    assert all(
        t.end == {"outputs": {"flow_id": "f", "flow_name": None}, "error": None} for t in tracing.traces
    )
