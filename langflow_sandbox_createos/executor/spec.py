"""The run spec: everything one executor run sends its guest, assembled in one place.

`run_spec` assembles it whole for `CreateOSExecutor.execute`: the flow and the graph's runtime
state (`build_spec`), the flows its Run Flow / Sub Flow nodes load (`flows.resolve`), the run
user's global variables its fields load (`variables.resolve`; never logged), and
what this process's settings add (the run's timeout, the reply directory, the host's sandbox
seams, a per-run install request). Rich values (`runtime`) travel pickled, host to guest only
(`encode_runtime`, when the spec is staged); nothing the guest sends is ever unpickled.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import pickle
import threading
from collections.abc import Mapping
from typing import Any

from lfx.utils.sandbox.base import SandboxExecutionError

from langflow_sandbox_createos.core import connection, failures, settings
from langflow_sandbox_createos.core.settings import ExecutorSettings
from langflow_sandbox_createos.executor import bridge, flows, tracing, variables

logger = logging.getLogger("langflow_sandbox_createos.executor")

# Where the host answers a stored message with its id in the host's memory (the guest's
# private /tmp; the runner reads each answer once and removes it).
REPLY_DIR = "/tmp/.createos-run"

# Runtime options the guest understands, and the ones that cannot leave this process.
# `session_id` crosses too, but as a top-level spec field; `event_manager` crosses as the
# names of its registered events (the guest relays each event back, see replay.py).
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


# --- the unit: its flow, inputs, options and runtime state ---------------------------------


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
    for node, template in flows.node_templates(payload):
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
        # Langflow's serving plane marks an anonymous run's messages as not to be kept
        "persist_messages": bool(getattr(graph, "persist_messages", True)),
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
    """The run spec of the unit alone and the names of what stayed on the host (options,
    unencodable fields); `run_spec` adds what the run's settings say."""
    payload, flow_id, flow_name = serialize_graph(graph)
    try:
        flows.references(payload)  # a loader whose target only the run decides: refused now
    except flows.FlowReferenceError as exc:
        raise SpecError(str(exc)) from None
    mode, spec_inputs = _spec_inputs(inputs, runtime_options)
    options, dropped = _forwarded_options(runtime_options)
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


def _spec_inputs(inputs: list[Any], runtime_options: Mapping[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """("runs", the unit's inputs) for Graph.arun, else ("start", the initial inputs)."""
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
    return mode, spec_inputs


def _forwarded_options(runtime_options: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(the options the guest understands, the names of those that stay on the host)."""
    options: dict[str, Any] = {}
    dropped: list[str] = []
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
    return options, dropped


# --- the whole run spec ------------------------------------------------------------------


async def run_spec(
    graph: Any, inputs: list[Any], runtime_options: Mapping[str, Any]
) -> tuple[dict[str, Any], ExecutorSettings, connection.Endpoint]:
    """The run spec of one execute() call, whole, with the settings and the endpoint the run
    uses. Raises lfx's errors: SandboxExecutionError for a unit that cannot be sent to a guest
    (or names a flow it may not load), SandboxUnavailableError for invalid settings."""
    try:
        spec, dropped = build_spec(graph, inputs, runtime_options)
    except SpecError as exc:
        raise SandboxExecutionError(f"CreateOS executor: {exc}") from None
    if dropped:
        logger.debug("CreateOS executor: what stays on the host: %s", ", ".join(sorted(dropped)))
    try:
        spec["runtime"]["flows"] = await flows.resolve(spec["graph"], spec.get("user_id"))
    except flows.FlowReferenceError as exc:
        raise SandboxExecutionError(f"CreateOS executor: {exc}") from None
    try:  # the run user's own global variables, as the host's variable service has them
        spec["variables"] = await variables.resolve(
            graph, spec["graph"], spec["runtime"].get("flows"), spec["options"], spec["runtime"]["context"]
        )
    except variables.VariableLimitError as exc:
        raise SandboxExecutionError(f"CreateOS executor: {exc}") from None
    # what the guest's environment must hold for its components to judge endpoints as here
    spec["environ"] = variables.guest_environ(spec["variables"])
    _note_inline_secrets(spec["graph"])
    with failures.refusing_bad_settings():
        cfg = settings.executor_settings()
    endpoint = connection.endpoints.get()
    spec["timeout"] = cfg.timeout_seconds
    spec["reply_dir"] = REPLY_DIR
    spec["tracing"] = tracing.active_view()  # the guest relays its trace where the host traces
    spec["sandbox"] = {
        **bridge.guest_view(),
        "component": bridge.holds_component(spec["graph"], spec["runtime"].get("flows")),
    }
    if cfg.install_lfx and not guest_knowledge.known_good(endpoint.base_url, cfg.rootfs):
        spec["install"] = _install_request(cfg)
    return spec, cfg, endpoint


def _note_inline_secrets(payload: Mapping[str, Any]) -> None:
    secrets_inline = inline_secrets(payload)
    if secrets_inline:
        logger.info(
            "CreateOS executor: %d secret field(s) hold inline values (%s); they reach the guest "
            "inside the run spec (on stdin, or for a pooled guest in a file the runner removes "
            "on reading). Prefer global variables: the host resolves them for the run's user.",
            len(secrets_inline),
            ", ".join(secrets_inline),
        )


# --- whether the guest is asked to install lfx ----------------------------------------


class _GuestKnowledge:
    """The guest's lfx version per (endpoint, rootfs), learnt from a run's `ready` frame.

    The lfx probe is part of the run itself (the runner imports lfx first), so it costs no
    extra round trip. Once a rootfs is known to ship lfx, the install fallback is not even
    offered to it again, and a host/guest version skew is reported once, not per run."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lfx: dict[tuple[str, str], str | None] = {}

    def known_good(self, base_url: str, rootfs: str) -> bool:
        with self._lock:
            return (base_url, rootfs) in self._lfx

    def record(self, base_url: str, rootfs: str, guest_lfx: str | None) -> None:
        with self._lock:
            first = (base_url, rootfs) not in self._lfx
            self._lfx[(base_url, rootfs)] = guest_lfx
        host = _host_lfx_version()
        if first and guest_lfx and host and guest_lfx != host:
            logger.warning(
                "CreateOS executor: rootfs %r has lfx %s while this host runs lfx %s; a flow serialized "
                "by one version may not load in the other. Rebuild the template with lfx==%s.",
                rootfs,
                guest_lfx,
                host,
                host,
            )

    def clear(self) -> None:
        with self._lock:
            self._lfx.clear()


guest_knowledge = _GuestKnowledge()


@functools.lru_cache(maxsize=1)
def _host_lfx_version() -> str | None:
    """This process's lfx version, read once (importlib.metadata scans every distribution on
    sys.path: ~2 ms, and every run's `ready` frame asks)."""
    try:
        from importlib.metadata import version

        return version("lfx")
    except Exception:  # not installed as a distribution (e.g. a source checkout)
        return None


def _install_request(cfg: ExecutorSettings) -> dict[str, Any]:
    pinned = cfg.lfx_version or _host_lfx_version()
    if pinned and not any(ch in pinned for ch in "<>=!~ "):
        lfx = f"lfx=={pinned}"
    else:
        lfx = f"lfx{pinned}" if pinned else "lfx"
    return {"packages": [lfx, *cfg.pip_extra]}
