"""Sandboxed nodes in an executor run: the host runs them (`executor/bridge.py` on the host).

Before the graph is built, lfx's sandbox seams in the guest are pointed at the host: the
dispatcher reports the host's backend and sends each call to the host, the code-execution
gate gives the host's verdict, and the CreateOS Sandbox component's engine runs on the host.
Each call is a `sandbox` frame; the answer comes back as a reply file.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from langflow_sandbox_createos.executor.guest.frames import REPLY_POLL_SECONDS, Frames, _take_reply

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
        found, answer = _take_reply(path)
        while not found:  # the run's watchdog bounds the wait
            time.sleep(pause)
            pause = min(pause * 2, SANDBOX_POLL_MAX)
            found, answer = _take_reply(path)
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
