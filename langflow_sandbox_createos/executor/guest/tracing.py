"""Tracing in the guest: lfx's tracing service, relayed to the host's (`executor/tracing.py`).

In-process, the graph opens a trace when its run starts (`start_tracers`), each component
build is a span (`trace_component`, with the inputs and metadata lfx records, its logs and
outputs), and the trace ends with the run's outputs or its error (`end_tracers`); Langflow's
tracing service hands each call to the tracers the operator configured (its own trace view,
LangSmith, Langfuse, ...). Here a relay takes lfx's place in the guest's service manager
(only when the host has an active tracing service) and turns each call into a `trace` frame,
live; the host replays them into its own service in the same order.

Only the run's own trace crosses: a Run Flow target that opens a trace of its own in-process
is traced there, not here (its components' spans are not relayed). As in Langflow's service,
the open trace belongs to the caller's context: a loop iteration's subgraph that starts a trace
for the run's id from inside a component's build gets, in-process, a trace of its own that is
never ended or flushed; here it opens nothing on the host, and the run's own trace goes on.
LangChain callbacks (a tracer's per-LLM-call child spans) stay empty in the guest.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import json
from typing import Any

from langflow_sandbox_createos.executor.guest.frames import Frames, _json_default

TRACE_FRAME_MAX = 2 * 1024 * 1024  # a bigger span payload is sent without its values
# The relayed span the current task is in, with its trace ((0, 0): none, or not relayed).
_SPAN: contextvars.ContextVar[tuple[int, int]] = contextvars.ContextVar("createos_trace_span", default=(0, 0))
# The trace the current context is in, as Langflow's `trace_context_var` (0: none; NESTED: a
# subgraph's own trace, which in-process is never ended, so nothing of it is relayed).
_TRACE: contextvars.ContextVar[int] = contextvars.ContextVar("createos_trace", default=0)
NESTED = -1


def _traceable(value: Any) -> Any:
    """What a tracer would serialize of `value` (lfx's serializer), as JSON."""
    try:
        from lfx.serialization.serialization import serialize

        return json.loads(json.dumps(serialize(value), default=_json_default))
    except Exception:
        return json.loads(json.dumps(value, default=_json_default))


def _error(exc: BaseException | None) -> dict[str, str] | None:
    return None if exc is None else {"type": type(exc).__name__, "message": str(exc)}


class _TraceRelay:
    """lfx's tracing service API, each call of the run's own graph a `trace` frame for the host.

    A trace is the run graph's when lfx opens it for that graph's run id (each pass of a run
    with several inputs opens one, as in-process); a span is when its component belongs to that
    graph. Anything else (a Run Flow target's own trace and spans) is not relayed."""

    name = "tracing_service"

    def __init__(self, frames: Frames, project_name: Any) -> None:
        self.frames = frames
        self.graph: Any = None  # the run's graph, once it is built
        self.deactivated = False
        self.ready = True
        self._project_name = project_name if isinstance(project_name, str) else None
        self._traces = itertools.count(1)
        self._spans = itertools.count(1)

    def set_ready(self) -> None:
        self.ready = True

    def _emit(self, op: str, trace: int, **fields: Any) -> None:
        body = dict(fields)
        if len(json.dumps(body, default=_json_default)) > TRACE_FRAME_MAX:
            for key in ("inputs", "metadata", "outputs", "output_metadata", "log"):
                if key in body:
                    body[key] = {"omitted": "too large to relay to the host's tracers"}
        self.frames.emit("trace", op=op, trace=trace, **body)

    def _runs_graph(self, run_id: Any = None, flow_id: Any = None) -> bool:
        graph = self.graph
        if graph is None:
            return False
        if run_id is not None:
            return str(run_id) == str(getattr(graph, "_run_id", None))
        return str(flow_id) == str(getattr(graph, "flow_id", None))

    async def start_tracers(
        self,
        run_id: Any = None,
        run_name: Any = None,
        user_id: Any = None,
        session_id: Any = None,
        project_name: Any = None,
        flow_id: Any = None,
        tracing_user_id: Any = None,
    ) -> None:
        if not self._runs_graph(run_id=run_id):
            return
        if _SPAN.get()[1] or _TRACE.get() == NESTED:  # from inside a component's build: a subgraph's
            _TRACE.set(NESTED)
            return
        trace = next(self._traces)
        _TRACE.set(trace)
        self._emit("start", trace, run_id=str(run_id))

    async def end_tracers(self, outputs: Any, error: BaseException | None = None) -> None:
        outputs = outputs if isinstance(outputs, dict) else {}
        trace = _TRACE.get()
        if trace > 0 and self._runs_graph(flow_id=outputs.get("flow_id")):
            self._emit("end", trace, outputs=_traceable(outputs), error=_error(error))

    @contextlib.asynccontextmanager
    async def trace_component(
        self, component: Any, trace_name: str, inputs: Any, metadata: Any = None
    ) -> Any:
        graph = getattr(component, "graph", None)
        trace = _TRACE.get()
        if trace <= 0 or graph is None or graph is not self.graph:
            token = _SPAN.set((0, 0))  # its logs and outputs belong to no relayed span
            try:
                yield self
            finally:
                _SPAN.reset(token)
            return
        span = next(self._spans)
        token = _SPAN.set((trace, span))
        vertex = component.get_vertex() if callable(getattr(component, "get_vertex", None)) else None
        self._emit(
            "span",
            trace,
            span=span,
            vertex=str(vertex.id) if vertex is not None else None,
            trace_name=str(trace_name),
            trace_type=str(getattr(component, "trace_type", "chain")),
            inputs=_traceable(inputs or {}),
            metadata=_traceable(metadata or {}),
        )
        try:
            yield self
        except BaseException as exc:
            self._emit("span_end", trace, span=span, error=_error(exc))
            raise
        else:
            self._emit("span_end", trace, span=span, error=None)
        finally:
            _SPAN.reset(token)

    def add_log(self, trace_name: str, log: Any) -> None:
        trace, span = _SPAN.get()
        if span:
            self._emit("log", trace, span=span, trace_name=str(trace_name), log=_traceable(log))

    def set_outputs(self, trace_name: str, outputs: Any, output_metadata: Any = None) -> None:
        trace, span = _SPAN.get()
        if span:
            self._emit(
                "outputs",
                trace,
                span=span,
                trace_name=str(trace_name),
                outputs=_traceable(outputs or {}),
                output_metadata=_traceable(output_metadata or {}),
            )

    def get_langchain_callbacks(self) -> list[Any]:
        return []

    def get_tracer(self, tracer_name: str) -> Any:
        return None

    @property
    def project_name(self) -> Any:
        return self._project_name

    async def teardown(self) -> None:
        return None


def _install_tracing(frames: Frames, view: Any) -> _TraceRelay | None:
    """The relay in lfx's service manager, where the host traces this run (`view` from the spec)."""
    if not isinstance(view, dict):
        return None
    from lfx.services.manager import get_service_manager
    from lfx.services.schema import ServiceType

    relay = _TraceRelay(frames, view.get("project_name"))
    services: dict[Any, Any] = get_service_manager().services
    services[ServiceType.TRACING_SERVICE] = relay
    return relay
