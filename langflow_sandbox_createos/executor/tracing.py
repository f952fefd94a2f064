"""The run's trace, replayed into this process's tracing service (the operator's tracers).

In-process, lfx calls the tracing service as the graph runs: `start_tracers` when a run
begins, `trace_component` around each component's build (with `add_log` and `set_outputs`
inside it), `end_tracers` with the outputs or the error. Langflow's service hands each call
to the tracers the operator configured: its own trace view (the native tracer, on by
default), LangSmith, Langfuse, LangWatch and the rest. Under the executor the graph runs in
the guest, so the guest's relay (`guest/tracing.py`) sends each of those calls as a `trace`
frame, live, and this module makes the same calls here, in order, so the same tracers see
the run.

What comes from the guest is what lfx records in-process: the span's inputs, metadata, logs,
outputs and errors, and when each happens. Who the trace is for comes from the host: its run
id, name, user, session, flow and tracing label are this process's graph's, never the
guest's, and a span must name a vertex of this run's graph. Each span replays in a task of
its own (as each component builds in its own task in-process), so the tracing service's
per-task context is right. Every trace of a run has the run's id, so each starts only once
the one before it has ended (Langflow's trace view writes a trace by its id: two writers at
once lose one). Nothing here can fail a run: a tracer's error is logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger("langflow_sandbox_createos.executor")

MAX_TRACES = 64  # passes of one run (Graph.arun with several inputs opens one trace each)
MAX_OPEN_SPANS = 1024
MAX_SPANS = 100_000
# lfx's trace types (a component's `trace_type`); anything else is traced as "chain"
TRACE_TYPES = frozenset({"chain", "llm", "tool", "retriever", "embedding", "parser", "agent", "prompt"})
CLOSE_WAIT_SECONDS = 10.0  # at the run's end, for the tracers to take what is left


def active_view() -> dict[str, Any] | None:
    """What the guest needs to relay its trace (None: this process traces nothing)."""
    try:
        from lfx.services.deps import get_tracing_service

        service = get_tracing_service()
    except Exception:  # an lfx without services: no tracing, as in-process
        return None
    if service is None or getattr(service, "deactivated", False):
        return None
    return {"project_name": None}


class GuestError(Exception):
    """An error the guest's run reported, for the tracers (its class name and message)."""

    def __init__(self, error: Any) -> None:
        kind = error.get("type") if isinstance(error, Mapping) else None
        message = error.get("message") if isinstance(error, Mapping) else error
        super().__init__(str(message)[:4000])
        self.kind = str(kind)[:200] if kind else "Exception"


class _Component:
    """What lfx's tracing service reads of a component: its vertex and its trace type."""

    def __init__(self, vertex: Any, trace_type: str) -> None:
        self._vertex = vertex
        self.trace_type = trace_type

    def get_vertex(self) -> Any:
        return self._vertex


class _Vertex:
    """A vertex of a run given as flow JSON (no live graph): its id is all a tracer needs."""

    def __init__(self, vertex_id: str) -> None:
        self.id = vertex_id


class _Span:
    """One component span, replayed in a task of its own (started by its trace's task, so it
    runs in that trace's context); what the guest reports of it waits in `ops` meanwhile."""

    def __init__(self, component: _Component, trace_name: str, inputs: Any, metadata: Any) -> None:
        self.ops: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.args = (component, trace_name, inputs, metadata)
        self.task: asyncio.Task[None] | None = None

    def start(self, service: Any) -> None:
        self.task = asyncio.get_running_loop().create_task(self._replay(service, *self.args))

    async def _replay(
        self, service: Any, component: _Component, name: str, inputs: Any, metadata: Any
    ) -> None:
        try:
            async with service.trace_component(component, name, inputs, metadata):
                while True:
                    op, value = await self.ops.get()
                    if op == "end":
                        if value is not None:  # the tracers see the component's error, as in-process
                            raise GuestError(value)
                        return
                    if op == "log":
                        service.add_log(name, value)
                    elif op == "outputs":
                        service.set_outputs(name, value[0], value[1])
        except GuestError:
            return
        except Exception:  # a tracer's own failure never fails the run
            logger.debug("CreateOS executor: a tracer failed on span %s", name, exc_info=True)


class _Trace:
    """One trace of the run (start_tracers .. end_tracers), in a task of its own."""

    def __init__(self, service: Any, start: dict[str, Any], after: _Trace | None) -> None:
        self.service = service
        self.spans: dict[int, _Span] = {}
        self.ended = False
        self.ops: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.task = asyncio.get_running_loop().create_task(self._replay(start, after))

    def end(self, outputs: dict[str, Any], error: BaseException | None) -> None:
        if not self.ended:
            self.ended = True
            self.ops.put_nowait(("end", (outputs, error)))

    async def _replay(self, start: dict[str, Any], after: _Trace | None) -> None:
        if after is not None:  # the run's earlier trace is flushed first: one trace id, one writer
            await asyncio.wait([after.task])
        try:
            await self.service.start_tracers(**start)
        except Exception:
            logger.debug("CreateOS executor: the tracers did not start", exc_info=True)
            return
        while True:
            op, value = await self.ops.get()
            if op == "span":  # started here: the span's task inherits this trace's context
                value.start(self.service)
            elif op == "end":
                outputs, error = value
                await self._close_spans()
                try:
                    await self.service.end_tracers(outputs, error)
                except Exception:
                    logger.debug("CreateOS executor: the tracers did not end", exc_info=True)
                return

    async def _close_spans(self) -> None:
        """Spans still open when the trace ends end with it (their component never finished)."""
        tasks = [span.task for span in self.spans.values() if span.task is not None]
        for span in self.spans.values():
            if span.task is not None and not span.task.done():
                span.ops.put_nowait(("end", {"type": "SandboxExecutionError", "message": "the run ended"}))
        if tasks:
            await asyncio.wait(tasks, timeout=CLOSE_WAIT_SECONDS)


class HostTrace:
    """Replays one executor run's `trace` frames (see the module docstring)."""

    def __init__(self, graph: Any, spec: Mapping[str, Any]) -> None:
        self.enabled = isinstance(spec.get("tracing"), Mapping)
        self.graph = graph if graph is not None and not isinstance(graph, (str, bytes, Mapping)) else None
        self.spec = spec
        self.traces: dict[int, _Trace] = {}
        self.spans: dict[int, _Trace] = {}  # span -> its trace, while it is open
        self.seen_spans = 0
        self.dropped = 0

    def handle(self, frame: Mapping[str, Any]) -> None:
        """Apply one `trace` frame (never raises: tracing does not fail a run)."""
        if not self.enabled:
            self.dropped += 1
            return
        try:
            self._apply(frame)
        except Exception:
            self.dropped += 1
            logger.debug("CreateOS executor: a trace frame was not replayed", exc_info=True)

    def _apply(self, frame: Mapping[str, Any]) -> None:
        op = frame.get("op")
        number = frame.get("trace")
        if not isinstance(number, int) or isinstance(number, bool) or not 0 < number <= MAX_TRACES:
            raise ValueError(f"trace number {number!r}")
        if op == "start":
            if number in self.traces:
                raise ValueError(f"trace {number} started twice")
            last = next(reversed(self.traces.values()), None)  # the one started before it
            self.traces[number] = _Trace(self._service(), self._start_args(frame.get("run_id")), last)
            return
        trace = self.traces.get(number)
        if trace is None or trace.ended:
            raise ValueError(f"no open trace {number}")
        if op == "end":
            outputs = {**_mapping(frame.get("outputs")), **self._identity()}
            trace.end(outputs, GuestError(frame["error"]) if frame.get("error") else None)
            return
        span = frame.get("span")
        if not isinstance(span, int) or isinstance(span, bool) or not 0 < span <= MAX_SPANS:
            raise ValueError(f"span number {span!r}")
        if op == "span":
            self._open(trace, span, frame)
            return
        if self.spans.get(span) is not trace:
            raise ValueError(f"no open span {span}")
        target = trace.spans[span]
        if op == "span_end":
            target.ops.put_nowait(("end", frame.get("error") or None))
            del self.spans[span]
        elif op == "log":
            target.ops.put_nowait(("log", frame.get("log")))
        elif op == "outputs":
            target.ops.put_nowait(
                ("outputs", (_mapping(frame.get("outputs")), _mapping(frame.get("output_metadata"))))
            )
        else:
            raise ValueError(f"trace op {op!r}")

    def _open(self, trace: _Trace, span: int, frame: Mapping[str, Any]) -> None:
        if span in self.spans or span in trace.spans:
            raise ValueError(f"span {span} opened twice")
        if len(self.spans) >= MAX_OPEN_SPANS:
            raise ValueError("too many open spans")
        vertex = self._vertex(frame.get("vertex"))
        trace_type = frame.get("trace_type") if frame.get("trace_type") in TRACE_TYPES else "chain"
        name = str(frame.get("trace_name") or "")[:256]
        if not name.endswith(f" ({vertex.id})"):  # lfx names a span "<display name> (<vertex id>)"
            name = f"{getattr(vertex, 'display_name', None) or vertex.id} ({vertex.id})"
        inputs, metadata = _mapping(frame.get("inputs")), _mapping(frame.get("metadata"))
        self.spans[span] = trace
        self.seen_spans += 1
        trace.spans[span] = _Span(_Component(vertex, str(trace_type)), name, inputs, metadata)
        trace.ops.put_nowait(("span", trace.spans[span]))

    def _vertex(self, vertex_id: Any) -> Any:
        """The host graph's vertex a span names (a vertex of this run's own graph)."""
        if not isinstance(vertex_id, str):
            raise ValueError("a span without a vertex")
        if self.graph is None:
            nodes = (self.spec.get("graph") or {}).get("nodes") or []
            if not any(isinstance(n, Mapping) and str(n.get("id")) == vertex_id for n in nodes):
                raise ValueError(f"no vertex {vertex_id!r} in this run's flow")
            return _Vertex(vertex_id)
        vertex = None
        with contextlib.suppress(Exception):  # lfx raises for an unknown id
            vertex = self.graph.get_vertex(vertex_id)
        if vertex is None:
            raise ValueError(f"no vertex {vertex_id!r} in this run's graph")
        return vertex

    def _service(self) -> Any:
        from lfx.services.deps import get_tracing_service

        return get_tracing_service()

    def _identity(self) -> dict[str, Any]:
        graph = self.graph
        return {
            "flow_id": getattr(graph, "flow_id", None) or self.spec.get("flow_id"),
            "flow_name": getattr(graph, "flow_name", None) or self.spec.get("flow_name"),
        }

    def _start_args(self, guest_run_id: Any) -> dict[str, Any]:
        """start_tracers' arguments as lfx's Graph.initialize_run passes them, from this host's
        graph (the guest's run id only where the host graph has none, and only a UUID)."""
        graph = self.graph
        run_id = self.spec.get("run_id") or str(uuid.UUID(str(guest_run_id)))
        identity = self._identity()
        tracing_user_id = getattr(graph, "tracing_user_id", None)
        end_user = getattr(graph, "end_user_id", None)
        if end_user and not tracing_user_id and _serving_trace_end_user_enabled():
            tracing_user_id = end_user
        return {
            "run_id": uuid.UUID(str(run_id)),
            "run_name": f"{identity['flow_name']} - {identity['flow_id']}",
            "user_id": getattr(graph, "user_id", None) if graph is not None else self.spec.get("user_id"),
            "session_id": self.spec.get("session_id") or getattr(graph, "session_id", None),
            "flow_id": identity["flow_id"],
            "tracing_user_id": tracing_user_id,
        }

    async def close(self, error: BaseException | None) -> None:
        """The run is over: end every trace the guest left open (a run that failed before its
        trace ended: the tracers get the run's error), and wait a little for the tracers."""
        for trace in self.traces.values():
            failure = error if error is not None else GuestError("the run ended before its trace did")
            trace.end(self._identity(), failure)
        tasks = [t.task for t in self.traces.values() if not t.task.done()]
        if tasks:
            await asyncio.wait(tasks, timeout=CLOSE_WAIT_SECONDS)


def _mapping(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


def _serving_trace_end_user_enabled() -> bool:
    try:
        from lfx.graph.graph.base import _serving_trace_end_user_enabled as enabled

        return bool(enabled())
    except Exception:  # an lfx without the serving plane's setting: off, as in-process
        return False
