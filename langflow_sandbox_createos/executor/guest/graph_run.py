"""The run itself: the flow rebuilt from its JSON with the host graph's runtime state, run the
way the in-process executor runs it (`Graph.arun`'s legacy path, or `async_start` step by
step), each vertex's event and the run's outputs sent as frames.
"""

from __future__ import annotations

import asyncio
import base64
import json
import pickle
from typing import Any

from langflow_sandbox_createos.executor.framing import tail
from langflow_sandbox_createos.executor.guest.flow_api import _install_flows
from langflow_sandbox_createos.executor.guest.frames import Frames, _json_default, _jsonable, _phase
from langflow_sandbox_createos.executor.guest.memory import _install_memory
from langflow_sandbox_createos.executor.guest.sandbox_bridge import _SANDBOX_SEAMS
from langflow_sandbox_createos.executor.guest.tracing import _install_tracing
from langflow_sandbox_createos.executor.guest.variables import _install_environ, _install_variables

VERTEX_FRAME_MAX = 512 * 1024  # a bigger vertex event is sent without its results


def _encode_result(result: Any) -> dict[str, Any] | None:
    """A ResultData as JSON plus the class of each Message/Data value, so the host can
    rebuild the same objects the in-process executor would hand out."""
    if result is None:
        return None
    from lfx.schema.data import Data
    from lfx.schema.message import Message

    try:
        model = result.model_dump(mode="json")
    except Exception:
        from lfx.serialization.serialization import serialize

        model = json.loads(json.dumps(serialize(result), default=_json_default))
    typed: dict[str, dict[str, Any]] = {}
    results = getattr(result, "results", None)
    if isinstance(results, dict):
        for key, value in results.items():
            kind = "Message" if isinstance(value, Message) else "Data" if isinstance(value, Data) else None
            if kind is None:
                continue
            try:
                typed[str(key)] = {"type": kind, "value": value.model_dump(mode="json")}
            except Exception:  # the plain JSON in `model` still carries it
                continue
    return {"model": model, "typed": typed}


def _vertex_event(build: Any) -> dict[str, Any]:
    vertex = build.vertex
    component = getattr(vertex, "custom_component", None)
    event: dict[str, Any] = {
        "id": vertex.id,
        "display_name": getattr(vertex, "display_name", None),
        "base_name": getattr(vertex, "base_name", None),
        "component": getattr(component, "display_name", None) if component is not None else None,
        "is_output": bool(getattr(vertex, "is_output", False)),
        "valid": bool(getattr(build, "valid", True)),
        "params": tail(str(getattr(build, "params", "") or ""), 2000),
        "result": _encode_result(getattr(build, "result_dict", None)),
    }
    artifacts = getattr(build, "artifacts", None)
    try:
        event["artifacts"] = json.loads(json.dumps(artifacts, default=_json_default))
    except Exception:
        event["artifacts"] = None
    if len(json.dumps(event, default=_json_default)) > VERTEX_FRAME_MAX:
        event["result"] = None
        event["artifacts"] = None
        event["omitted"] = "results too large for a live event; they are in the final outputs"
    return event


def _relay_event_manager(frames: Frames, names: list[str]) -> Any:
    """An lfx EventManager whose every registered callback becomes an `event` frame, so the
    host replays it into the caller's own event manager in the order the flow emitted it."""
    from lfx.events.event_manager import EventManager

    class Relay(EventManager):
        def send_event(self, *, event_type: str, data: Any) -> None:
            frames.emit("event", name=event_type, data=_jsonable(data))

    relay = Relay(None)
    for name in names:
        relay.register_event(name, name)  # the event type carries the callback's name back
    return relay


def _apply_state(graph: Any, vertices: dict[str, dict[str, Any]]) -> None:
    """Give each rebuilt vertex the runtime values the host's vertex holds, where the flow
    JSON did not already give it the same value (handle fields, live-component values,
    values injected with update_raw_params such as a Loop's item)."""
    missing = object()
    for vertex in graph.vertices:
        values = vertices.get(vertex.id)
        if not values:
            continue
        changed = {}
        for name, value in values.items():
            current = vertex.raw_params.get(name, missing)
            if _is_edge(current):
                continue
            try:
                same = type(current) is type(value) and bool(current == value)
            except Exception:  # e.g. a DataFrame compares element-wise
                same = False
            if not same:
                changed[name] = value
        if changed:
            vertex.update_raw_params(changed, overwrite=True)


def _is_edge(value: Any) -> bool:
    """A raw param that holds vertices: an edge the guest wired itself."""
    from lfx.graph.vertex.base import Vertex

    if isinstance(value, Vertex):
        return True
    if isinstance(value, list | tuple):
        return any(isinstance(item, Vertex) for item in value)
    if isinstance(value, dict):
        return any(isinstance(item, Vertex) for item in value.values())
    return False


class _Start:
    """Stands in for the start component a Graph(start, end) was built with: lfx reads only
    its id (where the run begins, and the entry point of cycle detection)."""

    def __init__(self, vertex_id: str) -> None:
        self._id = vertex_id

    def get_id(self) -> str:
        return self._id


def _set_start(graph: Any, start_id: Any) -> None:
    if not isinstance(start_id, str) or graph.get_vertex(start_id) is None:
        return
    graph._start = _Start(start_id)
    graph._cycles = None  # computed from the start vertex
    graph._cycle_vertices = None


async def _drive(graph: Any, frames: Frames, inputs: Any, opts: dict[str, Any], events: Any) -> None:
    """Run the graph step by step like the in-process streaming path, one frame per vertex."""
    from lfx.graph.graph.constants import Finish

    run = graph.async_start(
        inputs=inputs,
        max_iterations=opts.get("max_iterations"),
        config=opts.get("config"),
        event_manager=events,
        reset_output_values=opts.get("reset_output_values", True),
        fallback_to_env_vars=bool(opts.get("fallback_to_env_vars", False)),
    )
    try:
        async for step in run:
            if isinstance(step, Finish):
                break
            if hasattr(step, "vertex"):
                frames.emit("vertex", **_vertex_event(step))
    finally:
        await run.aclose()


async def _harvest(graph: Any, outputs: list[str]) -> list[Any]:
    """The vertex results Graph._run returns: the ones asked for by id or display name,
    else every output vertex. Generators are drained (they cannot cross to the host)."""
    restored = getattr(graph, "checkpoint_restored_built_ids", ()) or ()
    results = []
    for vertex in graph.vertices:
        if not vertex.built:
            continue
        if not vertex.result and vertex.id not in restored and hasattr(vertex, "consume_async_generator"):
            await vertex.consume_async_generator()
        if (not outputs and vertex.is_output) or (vertex.display_name in outputs or vertex.id in outputs):
            results.append(vertex.result)
    return results


async def _run_flow(frames: Frames, spec: dict[str, Any]) -> None:
    from lfx.graph import Graph  # lfx's graph machinery loads before the seams are installed

    opts = spec.get("options") or {}
    runtime = pickle.loads(base64.b64decode(spec["runtime"])) if spec.get("runtime") else {}
    _phase("runtime")
    _install_seams(frames, spec, runtime)
    relay = _install_tracing(frames, spec.get("tracing"))
    _phase("seams")
    graph = Graph.from_payload(
        spec["graph"],
        flow_id=spec.get("flow_id"),
        flow_name=spec.get("flow_name"),
        user_id=spec.get("user_id"),
    )
    if relay is not None:  # the trace and spans of this graph's run go to the host's tracers
        relay.graph = graph
    if runtime.get("context"):
        graph.context = dict(runtime["context"])
    session_id = spec.get("session_id")
    if session_id:
        graph.session_id = session_id
    graph.persist_messages = spec.get("persist_messages", True) is not False  # as the host's graph
    if spec.get("run_id"):  # the host's run id: its messages and their graph_run_id carry it
        graph.set_run_id(str(spec["run_id"]))
    _apply_state(graph, runtime.get("vertices") or {})
    _set_start(graph, spec.get("start_component_id"))
    events = _relay_event_manager(frames, spec["events"]) if spec.get("events") is not None else None
    frames.emit("graph", vertices=len(graph.vertices))
    _phase("build")
    outputs = [str(o) for o in (opts.get("outputs") or [])]
    try:
        if spec.get("mode") == "runs":  # Graph.arun: exactly what the in-process legacy path calls
            runs = await _run_legacy(graph, spec, opts, outputs, events)
        else:  # the streaming path: async_start(initial_inputs)
            runs = await _run_streaming(graph, frames, spec, opts, outputs, events)
    finally:
        if relay is not None:  # lfx ends its trace in a task of its own: let it run first
            for _ in range(3):
                await asyncio.sleep(0)
    _phase("run")
    frames.emit("outputs", runs=runs)
    _phase("outputs")


def _install_seams(frames: Frames, spec: dict[str, Any], runtime: dict[str, Any]) -> None:
    """Point lfx's memory, flow lookups, sandbox dispatch and global variables at the host,
    before the graph is built."""
    _install_environ(spec.pop("environ", None))
    _install_variables(spec.pop("variables", None))  # kept by its seams only, nowhere else
    reply_dir = spec.get("reply_dir") if isinstance(spec.get("reply_dir"), str) else None
    _install_memory(frames, runtime.get("memory") or [], bool(spec.get("stamp_graph_run_id")), reply_dir)
    if runtime.get("flows") is not None:  # the flows its Run Flow / Sub Flow nodes load
        _install_flows(runtime["flows"])
    if isinstance(spec.get("sandbox"), dict):  # its sandboxed nodes run on the host
        _SANDBOX_SEAMS.answer_as_host(frames, spec["sandbox"], reply_dir)


async def _run_legacy(
    graph: Any, spec: dict[str, Any], opts: dict[str, Any], outputs: list[str], events: Any
) -> list[dict[str, Any]]:
    done = await graph._arun_legacy(
        inputs=spec.get("inputs") or [],
        inputs_components=opts.get("inputs_components"),
        types=opts.get("types"),
        outputs=outputs,
        session_id=spec.get("session_id"),
        stream=False,  # a live generator cannot cross to the host: results are drained here
        fallback_to_env_vars=bool(opts.get("fallback_to_env_vars", False)),
        event_manager=events,
    )
    return [{"inputs": run.inputs, "outputs": [_encode_result(r) for r in run.outputs]} for run in done]


async def _run_streaming(
    graph: Any, frames: Frames, spec: dict[str, Any], opts: dict[str, Any], outputs: list[str], events: Any
) -> list[dict[str, Any]]:
    initial = (spec.get("inputs") or [None])[0]
    request = None
    if isinstance(initial, dict):
        from lfx.schema.schema import InputValueRequest

        try:
            request = InputValueRequest.model_validate(initial)
        except Exception:  # the in-process path ignores inputs it cannot read, so do we
            request = None
    await _drive(graph, frames, request, opts, events)
    results = await _harvest(graph, outputs)
    return [{"inputs": initial or {}, "outputs": [_encode_result(r) for r in results]}]
