"""Sandboxed nodes inside an executor run: the guest asks, the host runs.

A flow run by the executor may hold nodes that themselves run code in a sandbox: the Python
Interpreter (and the Python REPL tool, and custom components) through lfx's sandbox dispatch,
and the CreateOS Sandbox component through its engine. In-process they use the host's
settings, policies and CreateOS key. The guest has none of those, by design (the key never
enters a guest). So the guest runner points those seams at the host (`guest/sandbox_bridge.py`,
`_SandboxSeams`): each call becomes an authenticated `sandbox` frame, and this
module answers it the way the host would have run the node itself:

* **What a guest may ask** (docs/executor.md, "Sandboxed nodes in an executor run"):
  - the request names a node of this run's flow, or of a flow the host shipped for its Run
    Flow / Sub Flow / Flow as Tool nodes (by flow id and node id);
  - a `backend` request (the dispatcher) comes from a code-execution node (lfx's own list:
    Python Interpreter, Python REPL, ...) or a custom component; a `component` request from a
    CreateOS Sandbox node;
  - at most `MAX_REQUESTS_PER_RUN` requests per run, counted as they arrive (the first ones
    are served, each one past the cap is refused), `MAX_IN_FLIGHT` at once (the rest wait);
  - the guest chooses only what is dynamic in-process: the code a node received through an
    edge (or from an agent's tool call) and, for a custom component, its imports and the
    environment it passes. Everything else comes from the host: the node's own fields as the
    host's flow holds them (network, reuse, shape, timeout, return files, imports, command),
    the host's settings (image, egress exceptions, output caps, timeouts), its policies
    (code execution, public flows, protected tweak fields) and its identity (flow, user,
    session: so Guest Reuse keys are exactly the in-process ones).
* **How it runs**: with the host's own `lfx.utils.sandbox.run_code_in_sandbox` (whatever
  backend the host has, with its own refusals) and the component's own engine
  (`component.engine`), on the bridge's own threads (`BRIDGE_THREADS` for the whole process,
  never the event loop's default pool, which hostile runs holding sandbox calls could fill
  for everything else the process does), under the run's context.
* **The answer** is the result, or the error the host call raised (its class name and message),
  which the guest raises again with the same class; it is uploaded as a reply file, like a
  stored message's id. A refused request is answered with `SandboxExecutionError` and logged.
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import logging
import threading
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from langflow_sandbox_createos.core import hooks

logger = logging.getLogger("langflow_sandbox_createos.executor")

MAX_REQUESTS_PER_RUN = 256
MAX_IN_FLIGHT = 4
MAX_ENV_ENTRIES = 64
# Threads that run the host's side of bridge requests, for the whole process (MAX_IN_FLIGHT
# for each of four runs at once); requests beyond them wait their turn.
BRIDGE_THREADS = 16
# How long closing a run waits for requests still running on the host before leaving them
# to finish in their threads (each deletes the guests it made, as in-process).
CLOSE_WAIT_SECONDS = 5.0

# The CreateOS Sandbox component's fields that the host reads from its own flow, never from
# the guest (python_code is taken from the guest only when an edge feeds it).
COMPONENT_FIELDS = (
    "python_code",
    "command",
    "session_mode",
    "collect_artifacts",
    "allow_network",
    "timeout_seconds",
    "shape",
)
_CUSTOM_TYPES = frozenset({"CustomComponent"})
# A code-execution node's field that holds the code it hands the dispatcher, when nothing
# feeds it (the Python Interpreter; the Python REPL tool's own run): the host runs that value.
CODE_FIELD = "python_code"
# Stands in the set of a node's fed fields for "an agent's tool call chooses its arguments".
TOOL_FED = "<tool call>"


class BridgeRefusal(Exception):
    """A request the run's own nodes would not make in-process."""


_T = TypeVar("_T")
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def bridge_pool() -> ThreadPoolExecutor:
    """The bridge's threads (made on first use): what they run never takes the event loop's
    default pool, which the process's other work (uploads, the native client's calls) needs."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=BRIDGE_THREADS, thread_name_prefix="createos-bridge")
        return _pool


def _forget_pool_in_child() -> None:
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()  # the parent's threads are not the child's


hooks.after_fork("bridge threads", _forget_pool_in_child)


async def _on_bridge_threads(work: Callable[[], _T]) -> _T:
    """work() on the bridge's threads, in a copy of this context (the caller's principal), as
    asyncio.to_thread would run it on the default pool."""
    context = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(bridge_pool(), context.run, work)


def guest_view() -> dict[str, Any]:
    """What the guest must know to dispatch as the host does: the host's sandbox backend
    (``none`` keeps the Python Interpreter in its restricted in-process mode, in the guest, as
    it would be on the host), the host's code-execution verdict for this run, and whether the
    flow holds a CreateOS Sandbox node."""
    from lfx.utils.sandbox.registry import get_sandbox_backend

    return {"backend": get_sandbox_backend(), "policy": _policy_verdict()}


def _policy_verdict() -> dict[str, str] | None:
    """lfx's code-execution gate, run on the host under the caller's context: None when code
    may run, else the error it raised (the guest raises the same from its gate)."""
    from lfx.utils.python_repl_security import ensure_code_execution_enabled

    try:
        ensure_code_execution_enabled()
    except Exception as exc:
        return {"type": type(exc).__name__, "message": str(exc)}
    return None


def holds_component(payload: Mapping[str, Any], flows: Mapping[str, Any] | None) -> bool:
    from langflow_sandbox_createos.component import policy

    return any(_node_type(node) in policy.COMPONENT_TYPES for _, node, _ in _nodes(payload, flows))


def _node_type(node: Mapping[str, Any]) -> str:
    data = node.get("data") if isinstance(node, Mapping) else None
    return str(data.get("type")) if isinstance(data, Mapping) else ""


def _nodes(payload: Mapping[str, Any], flows: Mapping[str, Any] | None) -> list[tuple[str, Any, set[str]]]:
    """(flow id, node, its edge-fed fields) for the run's flow and every shipped flow. A node
    used as a tool (tool mode, or an output of type Tool feeding another node) counts its
    code as fed (TOOL_FED): an agent's tool call chooses it."""
    from langflow_sandbox_createos.executor.flows import connected_fields

    found = []
    payloads: list[tuple[str, Mapping[str, Any]]] = [("", payload)]
    for entry in (flows or {}).get("lookups", {}).values():
        if isinstance(entry, Mapping) and isinstance(entry.get("payload"), Mapping):
            payloads.append((str(entry.get("id") or ""), entry["payload"]))
    for flow_id, flow in payloads:
        fed = connected_fields(flow)
        tools = _tool_nodes(flow)
        for node in flow.get("nodes") or []:
            if isinstance(node, Mapping):
                node_id = str(node.get("id"))
                fields = {name for target, name in fed if target == node_id}
                if node_id in tools:
                    fields.add(TOOL_FED)
                found.append((flow_id, node, fields))
    return found


def _tool_nodes(flow: Mapping[str, Any]) -> set[str]:
    """Ids of the nodes a flow uses as tools: in tool mode, or with an output of type Tool that
    an edge takes to another node (a tool component's tool, a component as tool)."""
    tools = set()
    for node in flow.get("nodes") or []:
        inner = node.get("data", {}).get("node") if isinstance(node, Mapping) else None
        if isinstance(inner, Mapping) and inner.get("tool_mode"):
            tools.add(str(node.get("id")))
    for edge in flow.get("edges") or []:
        try:
            handle = edge["data"]["sourceHandle"]
            types = handle.get("output_types") or []
        except (KeyError, TypeError, AttributeError):
            continue
        if "Tool" in types or handle.get("name") == "component_as_tool":
            tools.add(str(edge.get("source")))
    return tools


def _template(node: Mapping[str, Any]) -> Mapping[str, Any]:
    try:
        template = node["data"]["node"]["template"]
    except (KeyError, TypeError):
        return {}
    return template if isinstance(template, Mapping) else {}


def _field(template: Mapping[str, Any], name: str) -> Any:
    fld = template.get(name)
    return fld.get("value") if isinstance(fld, Mapping) else None


def _error(exc: BaseException) -> dict[str, str]:
    return {"type": type(exc).__name__, "message": str(exc)}


class SandboxBridge:
    """Answers one executor run's `sandbox` frames (see the module docstring)."""

    def __init__(
        self,
        graph: Any,
        spec: Mapping[str, Any],
        reply: Callable[[str, Mapping[str, Any]], Awaitable[None]],
    ) -> None:
        runtime = spec.get("runtime")
        flows = runtime.get("flows") if isinstance(runtime, Mapping) else None
        self.run_flow_id = str(spec.get("flow_id") or "")
        self.nodes: dict[tuple[str, str], tuple[Any, set[str]]] = {}
        for flow_id, node, fed in _nodes(spec.get("graph") or {}, flows):
            key = (flow_id or self.run_flow_id, str(node.get("id")))
            self.nodes.setdefault(key, (node, fed))
        self.graph = graph
        self.spec = spec
        self.reply = reply
        self.asked = 0
        self.served = 0
        self.refused = 0
        self.waiting = 0  # requests past their arrival check, waiting for one of MAX_IN_FLIGHT slots
        self._slots = asyncio.Semaphore(MAX_IN_FLIGHT)
        self._tasks: set[asyncio.Task[None]] = set()

    # -- the frame loop ----------------------------------------------------------------
    def handle(self, frame: Mapping[str, Any]) -> None:
        """Start answering one `sandbox` frame; the run's other frames keep flowing meanwhile."""
        number = frame.get("reply")
        if not isinstance(number, int) or isinstance(number, bool) or not 0 < number < 1 << 31:
            self.refused += 1
            logger.warning("CreateOS executor: a guest sent a sandbox request without a reply number")
            return
        self.asked += 1  # its place in arrival order decides whether it is served
        task = asyncio.create_task(self._serve(number, frame, self.asked))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Wait a little for requests still running; they finish on their own otherwise."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=CLOSE_WAIT_SECONDS)

    async def _serve(self, number: int, frame: Mapping[str, Any], arrival: int) -> None:
        try:
            if arrival > MAX_REQUESTS_PER_RUN:  # refused at once, without waiting for a slot
                raise BridgeRefusal(f"more than {MAX_REQUESTS_PER_RUN} sandbox requests in one executor run")
            self.waiting += 1
            try:
                await self._slots.acquire()
            finally:
                self.waiting -= 1
            try:
                request = frame.get("request")
                if request == "backend":
                    work = self._backend_work(frame)
                elif request == "component":
                    work = self._component_work(frame)
                else:
                    raise BridgeRefusal(f"unknown sandbox request {request!r}")
                answer = await _on_bridge_threads(work)
            finally:
                self._slots.release()
            self.served += 1
        except BridgeRefusal as exc:
            self.refused += 1
            logger.warning("CreateOS executor: refused a sandbox request from the guest: %s", exc)
            answer = {
                "error": {
                    "type": "SandboxExecutionError",
                    "message": f"CreateOS executor: sandbox request refused: {exc}",
                }
            }
        except Exception as exc:  # what the host call raised: raised again in the guest
            answer = {"error": _error(exc)}
        try:
            await self.reply(f"sandbox-{number}", answer)
        except Exception as exc:  # the guest is gone (the run ended): nobody waits for it
            logger.debug("CreateOS executor: could not answer sandbox request %d: %s", number, exc)

    # -- checks ------------------------------------------------------------------------
    def _node(self, frame: Mapping[str, Any]) -> tuple[str, Any, set[str]]:
        flow_id = str(frame.get("flow_id") or self.run_flow_id)
        vertex = frame.get("vertex")
        if not isinstance(vertex, str) or (flow_id, vertex) not in self.nodes:
            raise BridgeRefusal(f"no node {vertex!r} in flow {flow_id!r} of this run")
        node, fed = self.nodes[(flow_id, vertex)]
        return flow_id, node, fed

    # -- the dispatcher (Python Interpreter, Python REPL, custom components) --------------
    def _backend_work(self, frame: Mapping[str, Any]) -> Callable[[], dict[str, Any]]:
        from lfx.utils.flow_validation import is_code_execution_component

        _, node, fed = self._node(frame)
        data = node.get("data") or {}
        kind = _node_type(node)
        display = str(
            ((data.get("node") or {}) if isinstance(data, Mapping) else {}).get("display_name") or ""
        )
        edited = bool(((data.get("node") or {}) if isinstance(data, Mapping) else {}).get("edited"))
        custom = edited or kind in _CUSTOM_TYPES
        if not (is_code_execution_component(kind, display) or custom):
            raise BridgeRefusal(f"node {frame.get('vertex')!r} ({kind}) does not run code in a sandbox")
        code = frame.get("code")
        if not isinstance(code, str):
            raise BridgeRefusal("a sandbox request without code")
        template = _template(node)
        fixed = None if custom else self._own_code(frame, node, fed, template)
        imports: Any = frame.get("global_imports", "")
        if "global_imports" in template and "global_imports" not in fed and not custom:
            imports = _field(template, "global_imports") or ""  # the node's own, as in-process
        if not isinstance(imports, (str, list)):
            raise BridgeRefusal("global_imports must be a string or a list")
        env = frame.get("env")
        if env is not None and not (
            isinstance(env, Mapping)
            and len(env) <= MAX_ENV_ENTRIES
            and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
        ):
            raise BridgeRefusal(f"env must map at most {MAX_ENV_ENTRIES} names to strings")
        if fixed is not None:  # in-process the node runs its own code, with no environment of its own
            if code != fixed:
                logger.warning(
                    "CreateOS executor: the guest asked to run other code than node %r holds; the "
                    "node's own code ran (its code is a field of the flow, not an input)",
                    frame.get("vertex"),
                )
            code, env = fixed, None

        def work() -> dict[str, Any]:
            from lfx.utils.python_repl_security import ensure_code_execution_enabled
            from lfx.utils.sandbox import run_code_in_sandbox

            ensure_code_execution_enabled()  # the host's policy, again, for this very call
            result = run_code_in_sandbox(code, global_imports=imports, env=dict(env) if env else None)
            return {
                "result": {
                    "stdout": result.stdout,
                    "stderr": result.stderr,
                    "exit_code": result.exit_code,
                    "execution_time_ms": result.execution_time_ms,
                }
            }

        return work  # run on the bridge's threads in a copy of this context (the caller's principal)

    def _own_code(
        self, frame: Mapping[str, Any], node: Mapping[str, Any], fed: set[str], template: Mapping[str, Any]
    ) -> str | None:
        """The code a node with a fixed code field hands the dispatcher in-process (lfx's
        `sanitize_code` of the field, as the Python Interpreter calls it); None when the code is
        dynamic there too: fed by an edge, chosen by an agent's tool call, or no such field."""
        from lfx.utils.sandbox import sanitize_code

        if CODE_FIELD not in template or CODE_FIELD in fed or TOOL_FED in fed:
            return None
        value = _field(template, CODE_FIELD)
        vertex = self._live_vertex(frame)
        params = getattr(vertex, "raw_params", None)
        if isinstance(params, Mapping) and CODE_FIELD in params:
            value = params[CODE_FIELD]  # the host graph's own (a value set on the live component)
        if not isinstance(value, str):
            raise BridgeRefusal(f"node {frame.get('vertex')!r} holds no code as text")
        return sanitize_code(value)

    def _live_vertex(self, frame: Mapping[str, Any]) -> Any:
        """The host graph's vertex a request names, when it is of the run's own flow."""
        flow_id = str(frame.get("flow_id") or self.run_flow_id)
        live = self.graph is not None and not isinstance(self.graph, (str, bytes, Mapping))
        if not live or flow_id != self.run_flow_id:
            return None
        get_vertex = getattr(self.graph, "get_vertex", None)
        try:
            return get_vertex(str(frame.get("vertex"))) if callable(get_vertex) else None
        except Exception:  # lfx raises for an unknown id
            return None

    # -- the CreateOS Sandbox component ----------------------------------------------------
    def _component_work(self, frame: Mapping[str, Any]) -> Callable[[], dict[str, Any]]:
        from langflow_sandbox_createos.component import engine, policy

        flow_id, node, fed = self._node(frame)
        if _node_type(node) not in policy.COMPONENT_TYPES:
            raise BridgeRefusal(f"node {frame.get('vertex')!r} is not a CreateOS Sandbox node")
        template = _template(node)
        fields = {name: _field(template, name) for name in COMPONENT_FIELDS}
        params = getattr(self._live_vertex(frame), "raw_params", None)
        if isinstance(params, Mapping):  # the host graph's own values win, as they would build
            fields.update(
                {name: params[name] for name in COMPONENT_FIELDS if name in params and name not in fed}
            )
        if fed & set(COMPONENT_FIELDS) - {"python_code"}:  # no such input takes an edge on the canvas
            raise BridgeRefusal(f"node {frame.get('vertex')!r} has settings fed by edges")
        if "python_code" in fed:  # the program came through an edge: the guest's copy is it
            program = frame.get("python_code")
            if isinstance(program, str):
                fields["python_code"] = program
            elif not str(fields.get("command") or "").strip():  # else the node runs its command
                raise BridgeRefusal("the node's Python Code is fed by an edge, but the request has none")
        live = self.graph is not None and not isinstance(self.graph, (str, bytes, Mapping))
        identity = {
            "flow_id": flow_id or None,
            # the end user where Langflow serves the run to one (the host's graph knows it)
            "user_id": engine.run_owner(self.graph if live else None, self.spec.get("user_id")),
            "session_id": self.spec.get("session_id"),
        }
        vertex = str(frame.get("vertex"))
        principal = getattr(self.graph, "execution_principal", None)

        def work() -> dict[str, Any]:
            policy.ensure_code_execution_enabled()
            if getattr(principal, "kind", None) == "anonymous_public":
                raise policy.public_flow_error(f"CreateOS Sandbox ({vertex})")
            policy.require_protected_tweak_fields()
            request = engine.build_request(fields, component_id=vertex, **identity)
            shown = _Shown()
            progress = engine.Progress(shown)
            outcome = engine.run(request, on_output=progress.on_output)
            tail = shown.status if isinstance(shown.status, str) else ""
            return {"outcome": encode_outcome(outcome), "progress": {"logs": shown.logs, "tail": tail}}

        return work


class _Shown:
    """Records what a node's progress display would show in-process, for the guest to replay."""

    def __init__(self) -> None:
        self.status: Any = None
        self.logs: list[str] = []

    def log(self, message: Any, name: str | None = None) -> None:
        self.logs.append(str(message))


def encode_outcome(outcome: Any) -> dict[str, Any]:
    """A component RunOutcome as JSON (file contents base64)."""
    fields = {
        name: getattr(outcome, name)
        for name in (
            "stdout",
            "stderr",
            "exit_code",
            "sandbox_id",
            "reused_guest",
            "timeout",
            "timed_out",
            "start_error",
            "output_truncated",
            "exec_ms",
            "artifacts_truncated",
            "artifacts_message",
            "reuse_notice",
            "network_notice",
        )
    }
    fields["files"] = [
        {"path": f.path, "data": base64.b64encode(f.data).decode("ascii"), "path_escaped": f.path_escaped}
        for f in outcome.files
    ]
    return fields
