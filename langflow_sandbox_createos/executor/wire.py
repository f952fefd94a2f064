"""Host side of the executor's guest protocol: the run spec, frame authentication and the
objects the frames become.

The guest half is `guest/runner.py` (stdlib only, shipped as source). The frame format
must match `runner.Frames.emit`: `LFXF2 <seq> <mac> <type> <json>` with
mac = HMAC-SHA256(secret, "<seq> <type> <json>")[:32 hex].
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import pickle
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

from langflow_sandbox_createos.executor import flows as executor_flows

logger = logging.getLogger("langflow_sandbox_createos.executor")

MAGIC = "LFXF2"
MAC_HEX = 32
KIB, MIB = 1024, 1024 * 1024
# Every frame type the runner writes, with the most bytes of JSON one may hold. Flow code can
# learn the frame secret (it shares the runner's memory), so these bound what a hostile run
# can make the host decode: an authentic frame of another type, or over its limit, fails the
# run (it is never kept). Control frames are small; vertex events are capped at 512 KiB by
# the runner; the rest carry messages, code and the run's results.
FRAME_LIMITS: dict[str, int] = {
    **dict.fromkeys(
        (
            "hello",
            "ready",
            "graph",
            "accepted",
            "waiting",
            "done",
            "timeout",
            "missing_lfx",
            "idle_expired",
            "installing",
            "installed",
            "install_failed",
            "fatal",
            "delete",
        ),
        64 * KIB,
    ),
    "vertex": 1 * MIB,
    "event": 4 * MIB,
    "store": 4 * MIB,
    "update": 4 * MIB,
    "sandbox": 4 * MIB,
    "history": 64 * KIB,
    "outputs": 8 * MIB,
}
MAX_FRAME_LINE = max(FRAME_LIMITS.values()) + 256  # the header before the JSON
# What decoding one frame may cost on top of its text: Python's objects for JSON made mostly
# of structure take ~30 times the text ("[{},{},...]": 16 MiB decoded to 354 MiB), so the
# cost is estimated from above first and a frame over the budget is refused undecoded.
DECODE_FACTOR = 8
DECODE_FLOOR = 2 * MIB


def decode_cost(body: str) -> int:
    """An upper bound of the memory json.loads takes for `body` (its text included): a dict
    per brace, a list per bracket, an object per comma or colon (the counts include those in
    strings, which only raises the bound)."""
    return (
        len(body)
        + 232 * body.count("{")
        + 64 * body.count("[")
        + 72 * (body.count(",") + body.count(":") + 1)
    )


def decode_budget(body: str) -> int:
    return DECODE_FACTOR * len(body) + DECODE_FLOOR


class FrameRefused(ValueError):
    """An authentic frame the host refuses to decode (unknown type, too large, too dense)."""


TAIL_CHARS = 4000

# Runtime options the guest understands, and the ones that cannot leave this process.
# `session_id` crosses too, but as a top-level spec field; `event_manager` crosses as the
# names of its registered events (the guest relays each event back, see RELAYED_FRAMES).
FORWARDED_OPTIONS = (
    "max_iterations",
    "config",
    "reset_output_values",
    "fallback_to_env_vars",
    "outputs",
    "inputs_components",
    "types",
    "stream",
)
HOST_ONLY_OPTIONS = frozenset({"open_flow_span"})
# Fields of a vertex that never need to cross: the guest already has them from the flow JSON.
STATE_SKIPPED_FIELDS = frozenset({"code", "_type"})
# Values of these kinds stand for edges or live objects of the host's graph; the guest has its own.
_GRAPH_CLASS_NAMES = frozenset({"Vertex", "Component", "CustomComponent", "BaseComponent", "Graph"})

# The bootstrap reads one JSON document from stdin: {"runner": source, "token": hex, "spec": {...}}.
BOOTSTRAP = (
    "import json,sys;b=json.loads(sys.stdin.buffer.read());g={'__name__':'__createos_runner__'};"
    "exec(compile(b.pop('runner'),'createos-runner.py','exec'),g);g['main'](b)"
)


@lru_cache(maxsize=1)
def runner_source() -> str:
    return (
        resources.files("langflow_sandbox_createos.executor.guest").joinpath("runner.py").read_text("utf-8")
    )


def spec_mac(key: bytes, body: bytes) -> str:
    """Authenticates a pooled runner's uploaded spec (must match `runner.spec_mac`)."""
    return hmac.new(key, b"spec " + body, hashlib.sha256).hexdigest()


def new_token() -> str:
    return secrets.token_hex(32)


def frame_mac(key: bytes, seq: int, kind: str, body: str) -> str:
    return hmac.new(key, f"{seq} {kind} {body}".encode(), hashlib.sha256).hexdigest()[:MAC_HEX]


def encode_frame(key: bytes, seq: int, kind: str, **fields: Any) -> str:
    """What the guest writes (used by tests to check both halves agree)."""
    body = json.dumps({**fields, "t": kind}, ensure_ascii=True, separators=(",", ":"))
    return f"{MAGIC} {seq} {frame_mac(key, seq, kind, body)} {kind} {body}\n"


# --- the run spec --------------------------------------------------------------------------


class SpecError(ValueError):
    """The unit cannot be sent to a guest."""


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _input_dict(value: Any) -> dict[str, Any] | None:
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        value = dump(mode="json")
    return value if isinstance(value, dict) else None


def serialize_graph(graph: Any) -> tuple[dict[str, Any], str | None, str | None]:
    """(payload with nodes and edges, flow_id, flow_name) for a Graph or a flow dict/JSON."""
    flow_id = flow_name = None
    if isinstance(graph, (str, bytes)):
        try:
            graph = json.loads(graph)
        except ValueError as exc:
            raise SpecError(f"the unit's graph is a string but not flow JSON: {exc}") from None
    if isinstance(graph, Mapping):
        payload = dict(graph)
    elif callable(getattr(graph, "dump", None)):
        payload = dict(graph.dump())
        flow_id = getattr(graph, "flow_id", None)
        flow_name = getattr(graph, "flow_name", None)
    else:
        raise SpecError(
            f"the unit's graph is a {type(graph).__name__}; the CreateOS executor needs an lfx Graph "
            "or a flow dict with nodes and edges"
        )
    data = payload.get("data", payload)
    if not isinstance(data, Mapping) or not isinstance(data.get("nodes"), list):
        raise SpecError("the flow has no 'nodes' list (expected {'data': {'nodes': [...], 'edges': [...]}})")
    return (
        {"nodes": data["nodes"], "edges": data.get("edges") or []},
        (str(flow_id) if flow_id else None),
        (str(flow_name) if flow_name else None),
    )


def inline_secrets(payload: Mapping[str, Any]) -> list[str]:
    """`vertex.field` names of password fields holding an inline value (never the values)."""
    found = []
    for node in payload.get("nodes", []):
        try:
            template = node["data"]["node"]["template"]
        except (KeyError, TypeError):
            continue
        if not isinstance(template, Mapping):
            continue
        for name, fld in template.items():
            if (
                isinstance(fld, Mapping)
                and fld.get("password")
                and not fld.get("load_from_db")
                and isinstance(fld.get("value"), str)
                and fld["value"].strip()
            ):
                found.append(f"{node.get('id')}.{name}")
    return found


def _refers_to_graph(value: Any) -> bool:
    """A vertex, a component or a bound output method: an edge the guest rebuilds itself."""
    if isinstance(value, (list, tuple, set)):
        return any(_refers_to_graph(item) for item in value)
    if isinstance(value, dict):
        return any(_refers_to_graph(item) for item in value.values())
    if callable(value) and not isinstance(value, type):
        return True
    return any(cls.__name__ in _GRAPH_CLASS_NAMES for cls in type(value).__mro__)


def _picklable(value: Any) -> bool:
    try:
        pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # anything a value's __reduce__ may raise
        return False
    return True


def vertex_state(graph: Any) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The runtime state of every vertex of a live Graph that the flow JSON does not carry:
    values set on live components (handle fields included) and the vertex's raw params,
    among them values injected with `update_raw_params` (Loop items, chat inputs).

    Returns ({vertex_id: {field: value}}, ["vertex.field" that could not be encoded]).
    The guest applies only the fields whose value differs from what it rebuilt itself."""
    state: dict[str, dict[str, Any]] = {}
    skipped: list[str] = []
    for vertex in getattr(graph, "vertices", None) or []:
        component = getattr(vertex, "custom_component", None)
        live = getattr(component, "_parameters", None)
        candidates: dict[str, Any] = dict(live) if isinstance(live, Mapping) else {}
        raw = getattr(vertex, "raw_params", None)
        if isinstance(raw, Mapping):
            candidates.update(raw)  # the vertex's params win, as they do when it builds
        values: dict[str, Any] = {}
        for name, value in candidates.items():
            if not isinstance(name, str) or name in STATE_SKIPPED_FIELDS or _refers_to_graph(value):
                continue
            if _picklable(value):
                values[name] = value
            else:
                skipped.append(f"{vertex.id}.{name}")
        if values:
            state[str(vertex.id)] = values
    return state, skipped


def graph_context(graph: Any) -> tuple[dict[str, Any], list[str]]:
    """`graph.context` (request variables among it), minus entries that cannot be encoded."""
    context = getattr(graph, "_context", None)
    if not isinstance(context, Mapping):
        return {}, []
    kept: dict[str, Any] = {}
    skipped: list[str] = []
    for key, value in context.items():
        if _picklable(value):
            kept[str(key)] = value
        else:
            skipped.append(str(key))
    return kept, skipped


def encode_runtime(runtime: Mapping[str, Any]) -> str:
    """Host to guest only: the host trusts itself, so rich values travel pickled. Nothing
    the guest sends is ever unpickled (see FrameReader and the decoders below)."""
    return base64.b64encode(pickle.dumps(dict(runtime), protocol=pickle.HIGHEST_PROTOCOL)).decode("ascii")


def event_names(event_manager: Any) -> list[str]:
    """The `on_*` callbacks the caller's event manager registered, which the guest relays."""
    events = getattr(event_manager, "events", None)
    if not isinstance(events, Mapping):
        return []
    return sorted(name for name in events if isinstance(name, str) and name.startswith("on_"))


def _identity(graph: Any, runtime_options: Mapping[str, Any], flow_id: Any, flow_name: Any) -> dict[str, Any]:
    session_id = runtime_options.get("session_id") or getattr(graph, "session_id", None) or None
    user_id = getattr(graph, "user_id", None)
    run_id = getattr(graph, "_run_id", None)  # the `run_id` property raises while it is unset
    return {
        "session_id": str(session_id) if session_id else None,
        "user_id": str(user_id) if user_id else None,
        "flow_id": flow_id,
        "flow_name": flow_name,
        "run_id": str(run_id) if run_id else None,
        # in-process, a component stamps `session_metadata.graph_run_id` on the messages it
        # stores when the process has a tracing service (Langflow's server has one)
        "stamp_graph_run_id": _has_tracing(),
    }


def _has_tracing() -> bool:
    try:
        from lfx.services.deps import get_tracing_service

        return get_tracing_service() is not None
    except Exception:  # an lfx without services: no stamp, as in-process
        return False


def _start_id(graph: Any) -> str | None:
    """The component a Graph(start, end) begins with (flow JSON does not record it)."""
    start = getattr(graph, "_start", None)
    get_id = getattr(start, "get_id", None)
    return str(get_id()) if callable(get_id) else None


def build_spec(
    graph: Any, inputs: list[Any], runtime_options: Mapping[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """The run spec and the names of what stayed on the host (options, unencodable fields)."""
    payload, flow_id, flow_name = serialize_graph(graph)
    try:
        executor_flows.references(payload)  # a loader whose target only the run decides: refused now
    except executor_flows.FlowReferenceError as exc:
        raise SpecError(str(exc)) from None
    dropped: list[str] = []
    mode = "runs"
    raw_inputs: list[Any] = list(inputs or [])
    if not raw_inputs:
        mode = "start"
        initial = runtime_options.get("initial_inputs")
        if initial is None:
            raw_inputs = []
        elif isinstance(initial, (list, tuple)):
            raw_inputs = list(initial)
        else:
            raw_inputs = [initial]
    spec_inputs = []
    for item in raw_inputs:
        converted = _input_dict(item)
        if converted is None or not _jsonable(converted):
            raise SpecError(f"an input of type {type(item).__name__} cannot be sent to the guest as JSON")
        spec_inputs.append(converted)

    options: dict[str, Any] = {}
    for key, value in runtime_options.items():
        if key in ("initial_inputs", "session_id", "event_manager"):
            continue
        if key.startswith("_") or key in HOST_ONLY_OPTIONS:
            dropped.append(key)
            continue
        if key not in FORWARDED_OPTIONS:
            continue  # unknown keys are ignored, as the seam requires
        if not _jsonable(value):
            dropped.append(key)
            continue
        options[key] = value
    state, skipped_fields = vertex_state(graph)
    context, skipped_context = graph_context(graph)
    dropped += [f"field {name}" for name in skipped_fields]
    dropped += [f"context {name}" for name in skipped_context]
    event_manager = runtime_options.get("event_manager")
    spec = {
        "graph": payload,
        **_identity(graph, runtime_options, flow_id, flow_name),
        "mode": mode,
        "inputs": spec_inputs,
        "options": options,
        "events": event_names(event_manager) if event_manager is not None else None,
        "start_component_id": _start_id(graph),
        # rich values: encoded with encode_runtime when the spec is staged
        "runtime": {"vertices": state, "context": context},
    }
    return spec, dropped


# --- frames ---------------------------------------------------------------------------------


_JOIN_EVERY = 256


@dataclass
class FrameReader:
    """Splits one output stream into lines and sorts them into authenticated frames and
    plain output. Never raises on what the guest prints."""

    key: bytes
    on_frame: Callable[[dict[str, Any]], None]
    on_plain: Callable[[str], None]
    max_line: int = MAX_FRAME_LINE
    # an authentic frame refused undecoded (see FRAME_LIMITS): the run must fail
    on_refused: Callable[[FrameRefused], None] | None = None
    next_seq: int = 0
    rejected: int = 0
    # a line still waiting for its newline. A guest can send it in millions of tiny pieces,
    # and a str object costs ~50 bytes on top of its text: the newest pieces are joined
    # into one chunk every _JOIN_EVERY, so the memory is about the text itself
    _pieces: list[str] = field(default_factory=list)
    _chunks: list[str] = field(default_factory=list)
    _buffered: int = 0

    def feed(self, text: str) -> None:
        while text:
            newline = text.find("\n")
            if newline < 0:
                self._pieces.append(text)
                self._buffered += len(text)
                if len(self._pieces) >= _JOIN_EVERY:
                    self._chunks.append("".join(self._pieces))
                    self._pieces.clear()
                if self._buffered > self.max_line:  # not a frame we could accept anyway
                    self.rejected += 1
                    line = self._take()
                    if line.startswith(MAGIC + " ") and self.on_refused is not None:
                        # only flow code writes such a line on the frame channel
                        self.on_refused(FrameRefused(f"a frame line over the {self.max_line}-byte limit"))
                    else:
                        self.on_plain(line)
                return
            if self._buffered:
                self._pieces.append(text[:newline])
                line = self._take()
            else:
                line = text[:newline]
            text = text[newline + 1 :]
            self._line(line)

    def close(self) -> None:
        if self._buffered:
            self._line(self._take())

    def _take(self) -> str:
        line = "".join(self._chunks) + "".join(self._pieces)
        self._chunks.clear()
        self._pieces.clear()
        self._buffered = 0
        return line

    def _line(self, line: str) -> None:
        try:
            frame = self._authenticate(line.rstrip("\r"))
        except FrameRefused as refused:
            self.rejected += 1
            if self.on_refused is not None:
                self.on_refused(refused)
            return
        if frame is None:
            if line.strip():
                self.on_plain(line)
            return
        self.on_frame(frame)

    def _authenticate(self, line: str) -> dict[str, Any] | None:
        if not line.startswith(MAGIC + " "):
            return None
        parts = line.split(" ", 4)
        if len(parts) != 5:
            self.rejected += 1
            return None
        _, seq_text, mac, kind, body = parts
        if seq_text != str(self.next_seq) or len(mac) != MAC_HEX:
            self.rejected += 1
            return None
        if not hmac.compare_digest(mac, frame_mac(self.key, self.next_seq, kind, body)):
            self.rejected += 1
            return None
        self.next_seq += 1  # authentic: from here on, a bad frame fails the run
        shown = repr(kind[:40])
        limit = FRAME_LIMITS.get(kind)
        if limit is None:
            raise FrameRefused(f"a frame of unknown type {shown}")
        if len(body) > limit:
            raise FrameRefused(f"a {shown} frame of {len(body)} bytes, over its {limit}-byte limit")
        if decode_cost(body) > decode_budget(body):
            raise FrameRefused(
                f"a {shown} frame of {len(body)} bytes that would take more than "
                f"{decode_budget(body)} bytes to decode (mostly structure)"
            )
        try:
            frame = json.loads(body)
        except ValueError:
            raise FrameRefused(f"a {shown} frame that is not JSON") from None
        if not isinstance(frame, dict) or frame.get("t") != kind:
            raise FrameRefused(f"a {shown} frame whose body names another type")
        return frame


# --- what the frames become ---------------------------------------------------------------


@dataclass(frozen=True)
class GuestStatus:
    """A progress event that is not a vertex: the guest is up and has lfx (`status="ready"`).
    Consumers that look for `.vertex` (lfx run, Loop) skip it, as they skip `Finish`."""

    status: str
    sandbox_id: str | None
    rootfs: str
    lfx_version: str | None
    installed: bool
    pooled: bool = False  # the guest came from CREATEOS_EXECUTOR_WARM_POOL


@dataclass(frozen=True)
class RemoteComponent:
    """Stands in for `vertex.custom_component`: consumers read its display name."""

    display_name: str | None


@dataclass(frozen=True)
class RemoteVertex:
    """The parts of an lfx Vertex that survive the trip out of the guest."""

    id: str
    display_name: str | None
    base_name: str | None
    is_output: bool
    custom_component: RemoteComponent | None


@dataclass(frozen=True)
class RemoteVertexResult:
    """A vertex built in the guest, shaped like lfx's VertexBuildResult (result_dict,
    params, valid, artifacts, vertex), so `lfx run`, Loop and other consumers that read
    those attributes work unchanged."""

    vertex: RemoteVertex
    result_dict: Any
    params: str
    valid: bool
    artifacts: Any
    omitted: str | None = None

    def to_dict(self) -> dict[str, Any]:
        result = self.result_dict
        dump = getattr(result, "model_dump", None)
        return {
            "id": self.vertex.id,
            "display_name": self.vertex.display_name,
            "component": self.vertex.custom_component.display_name if self.vertex.custom_component else None,
            "valid": self.valid,
            "params": self.params,
            "result": dump(mode="json") if callable(dump) else result,
            "artifacts": self.artifacts,
        }


def decode_result(encoded: Any) -> Any:
    """A ResultData rebuilt from the guest's encoding, with Message/Data values restored."""
    if encoded is None:
        return None
    if not isinstance(encoded, Mapping) or not isinstance(encoded.get("model"), Mapping):
        raise ValueError("a result is not {'model': {...}, 'typed': {...}}")
    from lfx.graph.schema import ResultData

    result = ResultData.model_validate(dict(encoded["model"]))
    typed = encoded.get("typed") or {}
    if isinstance(result.results, dict) and isinstance(typed, Mapping):
        for key, item in typed.items():
            if not isinstance(item, Mapping) or key not in result.results:
                continue
            try:
                if item.get("type") == "Message":
                    from lfx.schema.message import Message

                    result.results[key] = Message.model_validate(item.get("value"))
                elif item.get("type") == "Data":
                    from lfx.schema.data import Data

                    result.results[key] = Data.model_validate(item.get("value"))
            except Exception:  # keep the plain JSON form
                logger.debug("could not rebuild %s result %r", item.get("type"), key, exc_info=True)
    return result


def decode_vertex(frame: Mapping[str, Any]) -> RemoteVertexResult:
    vertex_id = frame.get("id")
    if not isinstance(vertex_id, str):
        raise ValueError("a vertex frame has no id")
    component = frame.get("component")
    vertex = RemoteVertex(
        id=vertex_id,
        display_name=frame.get("display_name") if isinstance(frame.get("display_name"), str) else None,
        base_name=frame.get("base_name") if isinstance(frame.get("base_name"), str) else None,
        is_output=bool(frame.get("is_output")),
        custom_component=RemoteComponent(component) if isinstance(component, str) else None,
    )
    return RemoteVertexResult(
        vertex=vertex,
        result_dict=decode_result(frame.get("result")),
        params=str(frame.get("params") or ""),
        valid=bool(frame.get("valid", True)),
        artifacts=frame.get("artifacts"),
        omitted=frame.get("omitted") if isinstance(frame.get("omitted"), str) else None,
    )


def decode_outputs(frame: Mapping[str, Any]) -> list[Any]:
    """list[RunOutputs] from the final outputs frame."""
    from lfx.graph.schema import RunOutputs

    runs = frame.get("runs")
    if not isinstance(runs, list):
        raise ValueError("the outputs frame has no 'runs' list")
    decoded = []
    for run in runs:
        if not isinstance(run, Mapping):
            raise ValueError("an outputs entry is not an object")
        inputs = run.get("inputs")
        outputs = [decode_result(item) for item in run.get("outputs") or []]
        decoded.append(
            RunOutputs(inputs=dict(inputs) if isinstance(inputs, Mapping) else {}, outputs=outputs)
        )
    return decoded


def tail(text: str, limit: int = TAIL_CHARS) -> str:
    return text if len(text) <= limit else "..." + text[-limit:]
