"""The program that runs one whole flow inside a CreateOS guest.

It is not imported on the host: the executor sends its source, the run spec and a
per-run secret on the exec's stdin, and a one-line bootstrap (`python3 -c ...`)
compiles it and calls `main`. Nothing is written to the guest's disk.

Framing. Before any flow code runs, the real stdout (fd 1) is duplicated onto a
private, non-inheritable descriptor reserved for frames, and fd 1 (plus
`sys.stdout`) is pointed at stderr. So `print()`, logging and child processes of the
flow all land on the exec's stderr stream. Each frame is one line

    LFXF2 <seq> <mac> <type> <json>

where `mac` is HMAC-SHA256 over "<seq> <type> <json>" keyed with the per-run secret that
arrived on stdin (never in argv or the environment), and `seq` counts up from 0.
The host accepts a line only if the sequence number is the next one and the MAC
matches; anything else is plain output. The type stands before the JSON so the host can
hold each type to its own size limit before it decodes anything. See docs/executor.md for the threat model.

Only the standard library is used until lfx has been found (or installed).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import pickle
import sys
import threading
import time
import traceback
from typing import Any

MAGIC = "LFXF2"
TIMEOUT_EXIT = 124
EXIT_NO_LFX = 3
EXIT_INSTALL_FAILED = 4
EXIT_FAILED = 1
VERTEX_FRAME_MAX = 512 * 1024  # a bigger vertex event is sent without its results
TEXT_MAX = 4000
INSTALL_TARGET = "/workspace/.createos-lfx"
REPLY_WAIT_SECONDS = 60.0  # for the host's answer to a stored message
REPLY_POLL_SECONDS = 0.002


class Frames:
    """Writes authenticated frames to the private descriptor."""

    def __init__(self, fd: int, key: bytes) -> None:
        self._fd = fd
        self._key = key
        self._seq = 0
        self._lock = threading.Lock()

    def emit(self, kind: str, **fields: Any) -> int:
        fields["t"] = kind
        body = json.dumps(fields, ensure_ascii=True, separators=(",", ":"), default=_json_default)
        locked = self._lock.acquire(timeout=2.0)  # the watchdog must not wait forever
        try:
            seq = self._seq
            self._seq += 1
            mac = hmac.new(self._key, f"{seq} {kind} {body}".encode(), hashlib.sha256).hexdigest()[:32]
            # The leading newline ends any partial line flow code may have written to this
            # descriptor, so it cannot glue itself onto (and spoil) a real frame.
            data = f"\n{MAGIC} {seq} {mac} {kind} {body}\n".encode()
            view = memoryview(data)
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
            return len(data)
        finally:
            if locked:
                self._lock.release()


def _json_default(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        try:
            return dump(mode="json")
        except Exception:  # fall through to str
            pass
    return str(value)


def _tail(text: str, limit: int = TEXT_MAX) -> str:
    return text if len(text) <= limit else "..." + text[-limit:]


def _isolate_stdout() -> int:
    """Reserve the real stdout for frames; send everything else the flow writes to stderr."""
    sys.stdout.flush()
    frame_fd = os.dup(1)  # non-inheritable (PEP 446): child processes never get it
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # the spec has been read; the flow gets an empty stdin
    os.close(devnull)
    return frame_fd


def _start_watchdog(frames: Frames, seconds: float) -> None:
    def fire() -> None:
        try:
            frames.emit("timeout", seconds=seconds)
        finally:
            os._exit(TIMEOUT_EXIT)

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()


def _missing_module(exc: BaseException) -> str | None:
    """The module a ModuleNotFoundError anywhere in the exception chain names."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [exc]
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, ModuleNotFoundError) and current.name:
            return current.name
        stack += [current.__cause__, current.__context__]
    text = str(exc)
    marker = "No module named "
    at = text.find(marker)
    if at >= 0:
        rest = text[at + len(marker) :].strip()
        quote = rest[:1]
        if quote in ("'", '"') and quote in rest[1:]:
            return rest[1 : rest.index(quote, 1)]
    return None


def _lfx_version() -> str | None:
    """lfx's version from the dist-info beside the package (one directory listing), not
    importlib.metadata, which scans every distribution on sys.path (~0.1 s per run)."""
    import importlib.util

    spec = importlib.util.find_spec("lfx")
    origin = getattr(spec, "origin", None)
    if origin:
        site = os.path.dirname(os.path.dirname(origin))
        try:
            names = os.listdir(site)
        except OSError:
            names = []
        for name in names:
            if name.startswith("lfx-") and name.endswith(".dist-info"):
                try:
                    with open(os.path.join(site, name, "METADATA"), encoding="utf-8") as handle:
                        for line in handle:
                            if line.startswith("Version:"):
                                return line.split(":", 1)[1].strip()
                            if not line.strip():
                                break
                except OSError:
                    break
    try:
        from importlib.metadata import version

        return version("lfx")
    except Exception:
        return None


def _install(frames: Frames, request: dict[str, Any], deadline: float) -> None:
    """Per-run install fallback: pip's own exit status decides, its output tail is reported."""
    import subprocess

    packages = [str(p) for p in request.get("packages", [])]
    cmd = [
        sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
        "--target", INSTALL_TARGET, *packages,
    ]  # fmt: skip
    frames.emit("installing", packages=packages)
    started = time.monotonic()
    try:
        done = subprocess.run(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=max(1.0, deadline - time.monotonic()),
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        output = exc.output.decode("utf-8", "replace") if isinstance(exc.output, bytes) else ""
        frames.emit("install_failed", status=None, timed_out=True, tail=_tail(output))
        sys.exit(EXIT_INSTALL_FAILED)
    output = done.stdout.decode("utf-8", "replace")
    if done.returncode != 0:
        frames.emit("install_failed", status=done.returncode, timed_out=False, tail=_tail(output))
        sys.exit(EXIT_INSTALL_FAILED)
    sys.path.insert(0, INSTALL_TARGET)
    import importlib

    importlib.invalidate_caches()
    frames.emit("installed", seconds=round(time.monotonic() - started, 3), tail=_tail(output, 1000))


# --- running the flow ------------------------------------------------------------------------


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
        "params": _tail(str(getattr(build, "params", "") or ""), 2000),
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


def _jsonable(data: Any) -> Any:
    """What lfx's EventManager.send_event would put on the wire for `data`."""
    try:
        from fastapi.encoders import jsonable_encoder

        return json.loads(json.dumps(jsonable_encoder(data)))
    except Exception:
        from lfx.serialization.serialization import serialize

        return json.loads(json.dumps(serialize(data, to_str=True), default=_json_default))


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


class _Memory:
    """Chat memory inside the guest. Each store/update/delete is sent to the host as a frame,
    and the host performs it on its own memory (Langflow's database); a history read asks the
    host (with a reply directory), so the guest sees exactly what the host holds, and nothing
    of it until a component reads it. Without a reply directory (an older host), reads answer
    from what this run stored."""

    def __init__(
        self, frames: Frames, seed: list[Any], stamp_run_id: bool = False, reply_dir: str | None = None
    ) -> None:
        from lfx.memory import stubs

        self.frames = frames
        self.stubs = stubs
        self.messages: list[Any] = list(seed)
        self.stamp_run_id = stamp_run_id
        self.reply_dir = reply_dir
        self.asked = 0

    async def _host_id(self, number: int) -> Any:
        """The id the host's memory gave stored message `number` (uploaded by the host)."""
        answer = await self._answer(f"reply-{number}")
        return answer.get("id") if isinstance(answer, dict) else None

    async def _answer(self, name: str) -> Any:
        """The host's answer `name` in the reply directory, once it is there (read once)."""
        import asyncio

        path = f"{self.reply_dir}/{name}"
        deadline = time.monotonic() + REPLY_WAIT_SECONDS
        while time.monotonic() < deadline:
            try:
                with open(path, "rb") as handle:
                    answer = json.loads(handle.read())
            except (FileNotFoundError, ValueError):  # not there yet, or still being written
                await asyncio.sleep(REPLY_POLL_SECONDS)
                continue
            os.unlink(path)
            return answer
        raise RuntimeError(f"the host did not answer {name} within {REPLY_WAIT_SECONDS} s")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stubs, name)

    async def astore_message(
        self, message: Any, flow_id: Any = None, run_id: Any = None, user_id: Any = None
    ):
        if self.stamp_run_id and run_id:  # what the host's tracing service makes a component add
            metadata = dict(message.session_metadata or {})
            metadata.setdefault("graph_run_id", str(run_id))
            message.session_metadata = metadata
        stored = await self.stubs.astore_message(message, flow_id=flow_id, run_id=run_id, user_id=user_id)
        from lfx.memory.flow_context import should_persist_messages

        if should_persist_messages():
            for item in stored:
                self.asked += 1
                number = self.asked if self.reply_dir else None
                self.frames.emit("store", message=_jsonable(item.model_dump()), reply=number)
                if number is not None:  # as in-process, the flow goes on with the stored id
                    host_id = await self._host_id(number)
                    if host_id:
                        item.id = host_id
                self.messages.append(item)
        return stored

    async def aupdate_messages(self, messages: Any) -> list[Any]:
        items = messages if isinstance(messages, list) else [messages]
        for item in items:
            for index, known in enumerate(self.messages):
                if str(known.id) == str(item.id):
                    self.messages[index] = item
            self.frames.emit("update", message=_jsonable(item.model_dump()))
        return items

    async def delete_message(self, id_: str) -> None:
        self.messages = [m for m in self.messages if str(m.id) != str(id_)]
        self.frames.emit("delete", id=str(id_))

    async def aget_messages(
        self,
        sender: Any = None,
        sender_name: Any = None,
        session_id: Any = None,
        context_id: Any = None,
        order_by: Any = "timestamp",
        order: Any = "DESC",
        flow_id: Any = None,
        limit: Any = None,
        user_id: Any = None,  # the host reads the run's owner's messages, whatever is asked
    ) -> list[Any]:
        if self.reply_dir:
            return await self._host_history(
                sender=sender,
                sender_name=sender_name,
                session_id=session_id,
                context_id=context_id,
                order_by=order_by,
                order=order,
                flow_id=flow_id,
                limit=limit,
            )

        def keep(m: Any) -> bool:
            return (
                (sender is None or m.sender == sender)
                and (sender_name is None or m.sender_name == sender_name)
                and (session_id is None or str(m.session_id) == str(session_id))
                and (context_id is None or str(getattr(m, "context_id", None)) == str(context_id))
                and (flow_id is None or str(m.flow_id) == str(flow_id))
            )

        found = [m for m in self.messages if keep(m)]
        found.sort(key=lambda m: str(getattr(m, order_by or "timestamp", "") or ""), reverse=order == "DESC")
        if limit:
            found = found[: int(limit)]
        return found

    async def _host_history(self, **filters: Any) -> list[Any]:
        from lfx.schema.message import Message

        self.asked += 1
        number = self.asked
        sent = {k: str(v) for k, v in filters.items() if v is not None and k != "limit"}
        limit = filters.get("limit")
        self.frames.emit("history", reply=number, limit=int(limit) if limit else None, **sent)
        answer = await self._answer(f"history-{number}")
        return [Message.model_validate(m) for m in (answer or {}).get("messages") or []]


def _install_memory(frames: Frames, seed: list[Any], stamp_run_id: bool, reply_dir: str | None) -> None:
    import lfx.memory

    memory = _Memory(frames, seed, stamp_run_id, reply_dir)
    lfx.memory._impl = lambda: memory  # every lfx.memory function dispatches through _impl()


# --- sandboxed nodes: the host runs them (executor_sandbox.py on the host) ----------------
SANDBOX_POLL_MAX = 0.02  # seconds between looks for the host's answer, once it is slow


def _calling_node() -> tuple[str | None, str | None]:
    """(flow id, node id) of the component whose code is calling: the nearest frame whose
    ``self`` is an lfx Component (a tool closure holds its component as ``self`` too)."""
    from lfx.custom.custom_component.component import Component

    frame: Any = sys._getframe(2)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, Component) and getattr(candidate, "_id", None):
            graph = getattr(getattr(candidate, "_vertex", None), "graph", None)
            flow_id = getattr(graph, "flow_id", None)
            return (str(flow_id) if flow_id else None), str(candidate._id)
        frame = frame.f_back
    return None, None


_ERROR_CLASSES = {
    "SandboxExecutionError": ("lfx.utils.sandbox.base", "SandboxExecutionError"),
    "SandboxUnavailableError": ("lfx.utils.sandbox.base", "SandboxUnavailableError"),
    "CodeExecutionDisabledError": ("lfx.utils.python_repl_security", "CodeExecutionDisabledError"),
    "PublicFlowValidationError": ("lfx.utils.flow_validation", "PublicFlowValidationError"),
    "CodeExecutionRefused": ("langflow_sandbox_createos.component.policy", "CodeExecutionRefused"),
}
_PLAIN_ERRORS = {"ValueError": ValueError, "TypeError": TypeError, "ImportError": ImportError}


def _host_error(error: Any) -> BaseException:
    """The error the host's call raised, as the same class here (lfx's, or a builtin)."""
    import importlib

    name = error.get("type") if isinstance(error, dict) else None
    message = str(error.get("message")) if isinstance(error, dict) else str(error)
    if name in _PLAIN_ERRORS:
        return _PLAIN_ERRORS[name](message)
    module, attr = _ERROR_CLASSES.get(str(name), _ERROR_CLASSES["SandboxExecutionError"])
    try:
        return getattr(importlib.import_module(module), attr)(message)
    except Exception:  # the class is not here (our package absent): lfx's own error
        from lfx.utils.sandbox.base import SandboxExecutionError

        return SandboxExecutionError(f"{name}: {message}")


class _SandboxBridge:
    """Sends a sandbox request to the host and waits for its answer (a reply file)."""

    def __init__(self, frames: Frames, reply_dir: str) -> None:
        self.frames = frames
        self.reply_dir = reply_dir
        self._lock = threading.Lock()
        self.asked = 0

    def call(self, request: str, **fields: Any) -> dict[str, Any]:
        with self._lock:
            self.asked += 1
            number = self.asked
        self.frames.emit("sandbox", request=request, reply=number, **fields)
        path = f"{self.reply_dir}/sandbox-{number}"
        pause = REPLY_POLL_SECONDS
        while True:  # the run's watchdog bounds the wait
            try:
                with open(path, "rb") as handle:
                    answer = json.loads(handle.read())
            except (FileNotFoundError, ValueError):  # not there yet, or still being written
                time.sleep(pause)
                pause = min(pause * 2, SANDBOX_POLL_MAX)
                continue
            os.unlink(path)
            if not isinstance(answer, dict) or "error" in answer:
                raise _host_error(answer.get("error") if isinstance(answer, dict) else answer)
            return answer


def _replace_everywhere(module_name: str, attr: str, replacement: Any) -> None:
    """Point ``module.attr`` and every loaded module's binding of the same object at
    ``replacement`` (components bind lfx's functions with ``from ... import``)."""
    import importlib

    module = importlib.import_module(module_name)
    original = getattr(module, attr)
    for loaded in list(sys.modules.values()):
        # the module's own names only: a module-level __getattr__ (langchain's) must not run
        names = getattr(loaded, "__dict__", None)
        if isinstance(names, dict) and names.get(attr) is original:
            names[attr] = replacement


def _install_sandbox_bridge(frames: Frames, view: dict[str, Any], reply_dir: str | None) -> None:
    """Make the guest's sandbox seams answer as the host's would: lfx's dispatcher reports the
    host's backend and sends each call to the host, lfx's code-execution gate gives the host's
    verdict, and the CreateOS Sandbox component's engine runs on the host."""
    backend = str(view.get("backend") or "none")
    verdict = view.get("policy")
    bridge = _SandboxBridge(frames, reply_dir or "/tmp/.createos-run")

    def get_sandbox_backend() -> str:
        return backend

    def is_sandbox_enabled() -> bool:
        return backend != "none"

    def ensure_code_execution_enabled() -> None:
        if verdict:
            raise _host_error(verdict)

    def run_code_in_sandbox(code: str, *, global_imports: Any = "", env: Any = None, **_: Any) -> Any:
        from lfx.utils.sandbox.base import SandboxResult

        flow_id, vertex = _calling_node()
        answer = bridge.call(
            "backend", flow_id=flow_id, vertex=vertex, code=code, global_imports=global_imports, env=env
        )
        result = answer.get("result") or {}
        return SandboxResult(
            stdout=str(result.get("stdout", "")),
            stderr=str(result.get("stderr", "")),
            exit_code=int(result.get("exit_code", -1)),
            execution_time_ms=result.get("execution_time_ms"),
        )

    _replace_everywhere("lfx.utils.sandbox.registry", "get_sandbox_backend", get_sandbox_backend)
    _replace_everywhere("lfx.utils.sandbox", "is_sandbox_enabled", is_sandbox_enabled)
    _replace_everywhere("lfx.utils.sandbox", "run_code_in_sandbox", run_code_in_sandbox)
    _replace_everywhere(
        "lfx.utils.python_repl_security", "ensure_code_execution_enabled", ensure_code_execution_enabled
    )
    if view.get("component"):
        _bridge_component(bridge)


def _bridge_component(bridge: _SandboxBridge) -> None:
    """The CreateOS Sandbox component's engine, answered by the host's: the component in the
    guest still validates its fields and renders the outcome, as in-process."""
    import base64 as b64

    from langflow_sandbox_createos.component import artifacts
    from langflow_sandbox_createos.component import engine as sandbox_run

    def run(req: Any, *, on_output: Any = None, note: Any = None) -> Any:
        flow_id = None if req.flow_id == "noflow" else req.flow_id
        fields = {"python_code": req.program} if req.mode == "python" else {"command": req.program}
        answer = bridge.call("component", flow_id=flow_id, vertex=req.component_id, **fields)
        shown = answer.get("progress") or {}
        progress = getattr(on_output, "__self__", None)  # the component's own progress display
        if isinstance(progress, sandbox_run.Progress):
            progress.replay(list(shown.get("logs") or []), str(shown.get("tail") or ""))
        data = dict(answer.get("outcome") or {})
        files = [
            artifacts.ArtifactFile(
                path=str(f["path"]), data=b64.b64decode(f["data"]), path_escaped=bool(f.get("path_escaped"))
            )
            for f in data.pop("files", [])
        ]
        return sandbox_run.RunOutcome(**data, files=files)

    sandbox_run.run = run


_FLOW_MODULES = (
    "lfx.helpers",
    "lfx.helpers.flow",
    "lfx.custom.custom_component.custom_component",
    "langflow.helpers.flow",
    "langflow.helpers",
    "lfx.base.tools.run_flow",
)
_REFUSED = "createos_refused"  # marks the stand-in payload of a flow the policy refused


def _recorded_error(error: dict[str, Any]) -> BaseException:
    """The exception the host's lookup raised, raised again here with its message."""
    from lfx.utils.flow_validation import CustomComponentValidationError

    kinds: dict[str, type[BaseException]] = {
        "ValueError": ValueError,
        "CustomComponentValidationError": CustomComponentValidationError,
    }
    kind = kinds.get(str(error.get("type")))
    message = str(error.get("message"))
    return kind(message) if kind else RuntimeError(f"{error.get('type')}: {message}")


def _flow_api(catalogue: dict[str, Any]) -> dict[str, Any]:
    """Langflow's flow lookups, answered from the flows the host resolved for this run
    (executor_flows.resolve), with the validation and errors of `langflow.helpers.flow`."""
    import copy
    from contextlib import asynccontextmanager
    from types import SimpleNamespace
    from uuid import UUID

    from lfx.schema.data import Data
    from lfx.schema.schema import INPUT_FIELD_NAME

    lookups: dict[str, Any] = catalogue.get("lookups") or {}
    owner = catalogue.get("user_id")
    superuser = bool(catalogue.get("superuser"))

    def shipped(user_id: Any, flow_id: Any, flow_name: Any) -> dict[str, Any]:
        """The host's answer for this lookup, after Langflow's own checks of its arguments."""
        if not user_id:
            raise ValueError("Session is invalid")
        if not (flow_id or flow_name):
            raise ValueError("Flow ID or Flow Name is required")
        key = f"id:{flow_id}" if flow_id else f"name:{flow_name}"
        if str(user_id) != str(owner) or key not in lookups:
            raise RuntimeError(
                f"flow {flow_id or flow_name!r} was not resolved on the server before this run: the "
                "CreateOS executor gives a guest only the flows its Run Flow, Sub Flow and Flow as "
                "Tool nodes name, for the user running it"
            )
        return lookups[key]

    def entry_for(user_id: Any, flow_id: Any, flow_name: Any) -> dict[str, Any]:
        """The shipped flow, or the error its lookup raised on the host, raised again."""
        entry = shipped(user_id, flow_id, flow_name)
        if "error" in entry:
            raise _recorded_error(entry["error"])
        if entry.get("missing"):
            raise ValueError(f"Flow {flow_id or flow_name} not found")
        return entry

    def as_data(entry: dict[str, Any]) -> Any:
        payload = entry.get("payload")
        if payload is None:  # refused by the policy: get_graph's policy check raises its error
            payload = {"nodes": [], "edges": [], _REFUSED: f"id:{entry['id']}"}
        return Data(data={**entry.get("meta", {}), "id": entry["id"], "name": entry["name"], "data": payload})

    def build(entry: dict[str, Any], user_id: Any, tweaks: Any) -> Any:
        from lfx.graph import Graph

        if "policy_error" in entry:
            raise _recorded_error(entry["policy_error"])
        payload = copy.deepcopy(entry["payload"])
        if tweaks:
            from lfx.processing.process import process_tweaks

            payload = process_tweaks(graph_data=payload, tweaks=tweaks, caller_supplied=False)
        return Graph.from_payload(payload, flow_id=entry["id"], user_id=str(user_id))

    @asynccontextmanager
    async def scoped_model_provider_policy_for_target_flow(
        *, user_id: Any, flow_id: Any = None, flow_name: Any = None
    ):
        entry = entry_for(user_id, flow_id, flow_name)
        yield SimpleNamespace(
            id=UUID(entry["id"]), name=entry["name"], user_id=owner, data=entry.get("payload")
        )

    async def get_flow_by_id_or_name(
        *, user_id: Any = None, flow_id: Any = None, flow_name: Any = None
    ) -> Any:
        entry = shipped(user_id, flow_id, flow_name)
        if "error" in entry:  # a lookup that found nothing; anything else is raised again
            error = _recorded_error(entry["error"])
            if not isinstance(error, ValueError):
                raise error
            return None
        return None if entry.get("missing") else as_data(entry)

    async def get_user_is_superuser(user_id: Any) -> bool:
        return superuser and bool(user_id) and str(user_id) == str(owner)

    async def list_flows(*, user_id: Any = None) -> list[Any]:
        if not user_id:
            raise ValueError("Session is invalid")
        if str(user_id) != str(owner):
            return []
        unique = {entry["id"]: entry for entry in lookups.values() if entry.get("id")}
        return [as_data(entry) for entry in unique.values()]

    async def find_flow(flow_name: str, user_id: str) -> Any:
        entry = lookups.get(f"name:{flow_name}") if str(user_id) == str(owner) else None
        return UUID(entry["id"]) if entry and entry.get("id") else None

    async def load_flow(user_id: Any, flow_id: Any = None, flow_name: Any = None, tweaks: Any = None) -> Any:
        return build(entry_for(user_id, flow_id, flow_name), user_id, tweaks)

    async def by_folder(**_: Any) -> list[Any]:
        raise RuntimeError(
            "listing the flows of a folder needs Langflow's database, which a CreateOS executor guest "
            "does not have; run this flow in-process (unset LANGFLOW_EXECUTOR_KIND)"
        )

    async def run_flow(
        inputs: Any = None,
        tweaks: Any = None,
        flow_id: Any = None,
        flow_name: Any = None,
        output_type: Any = "chat",
        user_id: Any = None,
        run_id: Any = None,
        session_id: Any = None,
        graph: Any = None,
        execution_principal: Any = None,
    ) -> Any:
        """langflow.helpers.flow.run_flow, with the target from the shipped flows."""
        if user_id is None:
            raise ValueError("Session is invalid")
        graph_flow_id = getattr(graph, "flow_id", None) if graph is not None else None
        if flow_id is not None and graph_flow_id is not None and str(flow_id) != str(graph_flow_id):
            raise ValueError("Provided flow ID does not match the graph's target flow")
        target_id = flow_id or graph_flow_id
        target_name = flow_name or (getattr(graph, "flow_name", None) if graph is not None else None)
        entry = entry_for(user_id, target_id, target_name)
        if graph is None:
            graph = build(entry, user_id, tweaks)
        if run_id:
            graph.set_run_id(UUID(str(run_id)))
        if session_id:
            graph.session_id = session_id
        graph.user_id = str(user_id)
        if execution_principal is not None:
            graph.execution_principal = execution_principal
        items = [] if inputs is None else [inputs] if isinstance(inputs, dict) else list(inputs)
        outputs = [
            vertex.id
            for vertex in graph.vertices
            if output_type == "debug"
            or (vertex.is_output and (output_type == "any" or str(output_type) in vertex.id.lower()))
        ]
        try:
            from lfx.run.hitl import raise_if_nested_hitl_unsupported
        except ImportError:  # an lfx without human-in-the-loop
            pass
        else:
            raise_if_nested_hitl_unsupported(graph)
        return await graph.arun(
            [{INPUT_FIELD_NAME: item.get("input_value")} for item in items],
            outputs=outputs,
            inputs_components=[item.get("components", []) for item in items],
            types=[item.get("type", "chat") for item in items],
            fallback_to_env_vars=bool(catalogue.get("fallback_to_env_var")),
        )

    async def prepare_flow_build_for_user(target: Any, *, is_superuser: bool) -> Any:
        """The host already applied the policy to every shipped flow: a refused one raises
        the host's refusal here, where in-process it would have raised."""
        key = target.get(_REFUSED) if isinstance(target, dict) else None
        if key:
            raise _recorded_error(lookups[key]["policy_error"])
        return None

    return {
        "scoped_model_provider_policy_for_target_flow": scoped_model_provider_policy_for_target_flow,
        "get_flow_by_id_or_name": get_flow_by_id_or_name,
        "get_user_is_superuser": get_user_is_superuser,
        "list_flows": list_flows,
        "find_flow": find_flow,
        "load_flow": load_flow,
        "run_flow": run_flow,
        "list_flows_by_flow_folder": by_folder,
        "list_flows_by_folder_id": by_folder,
        "list_a2a_agents_by_flow_folder": by_folder,
        "prepare_flow_build_for_user": prepare_flow_build_for_user,
        "custom_component_admin_only_enabled": lambda: catalogue.get("admin_only_enabled"),
        "admin_only_build_required": lambda *, is_superuser: (
            bool(catalogue.get("admin_only")) if bool(is_superuser) == superuser else True
        ),
    }


def _install_flows(catalogue: dict[str, Any]) -> None:
    """Point every module that bound Langflow's flow lookups at the shipped flows. Only the
    policy hooks of the Run Flow module are replaced: elsewhere they keep lfx's own."""
    import importlib

    api = _flow_api(catalogue)
    policy = (
        "prepare_flow_build_for_user",
        "custom_component_admin_only_enabled",
        "admin_only_build_required",
    )
    for name in _FLOW_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:  # no Langflow in this guest (Run Flow then fails to import, as in-process)
            continue
        for attr, function in api.items():
            if attr in policy and name != "lfx.base.tools.run_flow":
                continue
            if hasattr(module, attr):
                setattr(module, attr, function)


def _apply_state(graph: Any, vertices: dict[str, dict[str, Any]]) -> None:
    """Give each rebuilt vertex the runtime values the host's vertex holds, where the flow
    JSON did not already give it the same value (handle fields, live-component values,
    values injected with update_raw_params such as a Loop's item)."""
    from lfx.graph.vertex.base import Vertex

    def edge(value: Any) -> bool:
        if isinstance(value, Vertex):
            return True
        if isinstance(value, list | tuple):
            return any(isinstance(item, Vertex) for item in value)
        if isinstance(value, dict):
            return any(isinstance(item, Vertex) for item in value.values())
        return False

    missing = object()
    for vertex in graph.vertices:
        values = vertices.get(vertex.id)
        if not values:
            continue
        changed = {}
        for name, value in values.items():
            current = vertex.raw_params.get(name, missing)
            if edge(current):
                continue
            try:
                same = type(current) is type(value) and bool(current == value)
            except Exception:  # e.g. a DataFrame compares element-wise
                same = False
            if not same:
                changed[name] = value
        if changed:
            vertex.update_raw_params(changed, overwrite=True)


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
    from lfx.graph import Graph

    opts = spec.get("options") or {}
    runtime = pickle.loads(base64.b64decode(spec["runtime"])) if spec.get("runtime") else {}
    reply_dir = spec.get("reply_dir") if isinstance(spec.get("reply_dir"), str) else None
    _install_memory(frames, runtime.get("memory") or [], bool(spec.get("stamp_graph_run_id")), reply_dir)
    if runtime.get("flows") is not None:  # the flows its Run Flow / Sub Flow nodes load
        _install_flows(runtime["flows"])
    if isinstance(spec.get("sandbox"), dict):  # its sandboxed nodes run on the host
        _install_sandbox_bridge(frames, spec["sandbox"], reply_dir)
    graph = Graph.from_payload(
        spec["graph"],
        flow_id=spec.get("flow_id"),
        flow_name=spec.get("flow_name"),
        user_id=spec.get("user_id"),
    )
    if runtime.get("context"):
        graph.context = dict(runtime["context"])
    session_id = spec.get("session_id")
    if session_id:
        graph.session_id = session_id
    if spec.get("run_id"):  # the host's run id: its messages and their graph_run_id carry it
        graph.set_run_id(str(spec["run_id"]))
    _apply_state(graph, runtime.get("vertices") or {})
    _set_start(graph, spec.get("start_component_id"))
    events = _relay_event_manager(frames, spec["events"]) if spec.get("events") is not None else None
    frames.emit("graph", vertices=len(graph.vertices))
    outputs = [str(o) for o in (opts.get("outputs") or [])]
    runs: list[dict[str, Any]] = []

    if spec.get("mode") == "runs":  # Graph.arun: exactly what the in-process legacy path calls
        done = await graph._arun_legacy(
            inputs=spec.get("inputs") or [],
            inputs_components=opts.get("inputs_components"),
            types=opts.get("types"),
            outputs=outputs,
            session_id=session_id,
            stream=False,  # a live generator cannot cross to the host: results are drained here
            fallback_to_env_vars=bool(opts.get("fallback_to_env_vars", False)),
            event_manager=events,
        )
        for run in done:
            runs.append({"inputs": run.inputs, "outputs": [_encode_result(r) for r in run.outputs]})
    else:  # the streaming path: async_start(initial_inputs)
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
        runs.append({"inputs": initial or {}, "outputs": [_encode_result(r) for r in results]})

    frames.emit("outputs", runs=runs)


def _preload(warm_flow: Any = None) -> None:
    """What every run imports, loaded while a pooled runner waits for its spec; then a small
    flow from the host (ChatInput -> ChatOutput) is rebuilt and dropped, never run, which
    fills lfx's first-build caches (component code, models): ~0.3 s off the run's own build."""
    import asyncio  # noqa: F401
    import importlib.util

    from lfx.events.event_manager import EventManager  # noqa: F401
    from lfx.graph import Graph
    from lfx.graph.graph.constants import Finish  # noqa: F401
    from lfx.memory import stubs  # noqa: F401
    from lfx.memory.flow_context import should_persist_messages  # noqa: F401
    from lfx.schema.data import Data  # noqa: F401
    from lfx.schema.message import Message  # noqa: F401
    from lfx.schema.schema import InputValueRequest  # noqa: F401

    if importlib.util.find_spec("fastapi") is not None:  # else _jsonable uses lfx's serializer
        from fastapi.encoders import jsonable_encoder  # noqa: F401
    if isinstance(warm_flow, dict):
        try:
            Graph.from_payload(warm_flow)
        except Exception:  # only a warm-up: the run builds its own graph
            traceback.print_exc()


def spec_mac(key: bytes, body: bytes) -> str:
    return hmac.new(key, b"spec " + body, hashlib.sha256).hexdigest()


def _await_spec(frames: Frames, key: bytes, path: str, seconds: float, poll: float) -> dict[str, Any] | None:
    """Wait for the host's upload of this guest's one run spec: `<mac>\n<json>`, accepted only
    whole and authentic (the MAC, keyed with this runner's secret, also proves it complete
    on a control plane whose upload is not atomic). Read once, then removed. None when
    nobody delivered a spec within `seconds` (the host's pool has forgotten this guest)."""
    frames.emit("waiting", path=path)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except FileNotFoundError:
            time.sleep(poll)
            continue
        mac, _, body = data.partition(b"\n")
        if hmac.compare_digest(mac.decode("ascii", "replace"), spec_mac(key, body)):
            os.unlink(path)
            return json.loads(body)
        time.sleep(poll)  # still being written
    return None


def _start(key: bytes) -> Frames:
    frames = Frames(_isolate_stdout(), key)
    # The guest runs the flow itself; it must never hand the graph to another executor.
    os.environ["LANGFLOW_EXECUTOR_KIND"] = "in-process"
    frames.emit("hello", python=sys.version.split()[0], pid=os.getpid())
    return frames


def main(boot: dict[str, Any]) -> None:
    """A cold run (`spec` or `spec_path` in `boot`) or a pooled one (`wait`: lfx is loaded
    first, then the runner waits for its spec file)."""
    key = bytes.fromhex(boot.pop("token"))
    wait = boot.pop("wait", None)
    if wait is not None:
        frames = _start(key)
        import importlib.util

        if importlib.util.find_spec("lfx") is None:
            frames.emit("missing_lfx", python=sys.executable)
            sys.exit(EXIT_NO_LFX)
        _preload(wait.get("warm_flow"))
        frames.emit("ready", lfx=_lfx_version(), installed=False)
        spec = _await_spec(
            frames, key, str(wait["path"]), float(wait["seconds"]), float(wait.get("poll", 0.02))
        )
        del key
        if spec is None:
            frames.emit("idle_expired")
            sys.stderr.flush()
            os._exit(0)
        frames.emit("accepted")  # before anything of the run happens
        _start_watchdog(frames, float(spec.get("timeout", 600)))
        _run(frames, spec)
    spec = boot.pop("spec", None)
    if spec is None:  # a large spec was uploaded; read it and leave nothing on disk
        path = boot.pop("spec_path")
        with open(path, encoding="utf-8") as handle:
            spec = json.load(handle)
        os.unlink(path)
    frames = _start(key)
    del key
    deadline = time.monotonic() + float(spec.get("timeout", 600))
    _start_watchdog(frames, float(spec.get("timeout", 600)))

    import importlib.util

    installed = False
    if importlib.util.find_spec("lfx") is None:
        if not spec.get("install"):
            frames.emit("missing_lfx", python=sys.executable)
            sys.exit(EXIT_NO_LFX)
        _install(frames, spec["install"], deadline)
        installed = True
        if importlib.util.find_spec("lfx") is None:
            frames.emit("missing_lfx", python=sys.executable, after_install=True)
            sys.exit(EXIT_NO_LFX)
    frames.emit("ready", lfx=_lfx_version(), installed=installed)
    _run(frames, spec)


def _run(frames: Frames, spec: dict[str, Any]) -> None:
    import asyncio

    try:
        asyncio.run(_run_flow(frames, spec))
    except BaseException as exc:  # report every failure, including SystemExit from a component
        if isinstance(exc, KeyboardInterrupt):
            raise
        frames.emit(
            "fatal",
            error=_tail(f"{type(exc).__name__}: {exc}", TEXT_MAX),
            missing_module=_missing_module(exc),
            traceback=_tail("".join(traceback.format_exception(exc)), TEXT_MAX),
        )
        sys.stderr.flush()
        os._exit(EXIT_FAILED)
    frames.emit("done")
    sys.stderr.flush()
    os._exit(0)  # do not wait for threads a component left running
