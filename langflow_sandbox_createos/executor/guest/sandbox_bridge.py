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


# lfx's sandbox seams: (module, name), each replaced in every module that bound it.
_SEAM_NAMES = (
    ("lfx.utils.sandbox.registry", "get_sandbox_backend"),
    ("lfx.utils.sandbox", "is_sandbox_enabled"),
    ("lfx.utils.sandbox", "run_code_in_sandbox"),
    ("lfx.utils.python_repl_security", "ensure_code_execution_enabled"),
)


class _SandboxSeams:
    """lfx's sandbox seams in the guest. `point` puts this runner's functions in their place,
    in every module that bound them (a walk of sys.modules per seam: tens of ms, so a pooled
    runner does it while it waits for its spec); `answer_as_host` then makes them answer as
    the host's would: lfx's dispatcher reports the host's backend and sends each call to the
    host, lfx's code-execution gate gives the host's verdict, and the CreateOS Sandbox
    component's engine runs on the host. Until then they are lfx's own."""

    def __init__(self) -> None:
        self.pointed = False
        self.view: dict[str, Any] | None = None
        self.bridge: _SandboxBridge | None = None

    def point(self) -> None:
        import importlib

        if self.pointed:
            return
        originals = {name: getattr(importlib.import_module(module), name) for module, name in _SEAM_NAMES}

        def get_sandbox_backend(*args: Any, **kwargs: Any) -> str:
            if self.view is None:
                return originals["get_sandbox_backend"](*args, **kwargs)
            return str(self.view.get("backend") or "none")

        def is_sandbox_enabled(*args: Any, **kwargs: Any) -> bool:
            if self.view is None:
                return originals["is_sandbox_enabled"](*args, **kwargs)
            return str(self.view.get("backend") or "none") != "none"

        def ensure_code_execution_enabled(*args: Any, **kwargs: Any) -> None:
            if self.view is None:
                return originals["ensure_code_execution_enabled"](*args, **kwargs)
            if self.view.get("policy"):
                raise _host_error(self.view["policy"])
            return None

        def run_code_in_sandbox(
            code: str, *args: Any, global_imports: Any = "", env: Any = None, **kwargs: Any
        ) -> Any:
            if self.view is None or self.bridge is None:
                return originals["run_code_in_sandbox"](
                    code, *args, global_imports=global_imports, env=env, **kwargs
                )
            from lfx.utils.sandbox.base import SandboxResult

            flow_id, vertex = _calling_node()
            answer = self.bridge.call(
                "backend", flow_id=flow_id, vertex=vertex, code=code, global_imports=global_imports, env=env
            )
            result = answer.get("result") or {}
            return SandboxResult(
                stdout=str(result.get("stdout", "")),
                stderr=str(result.get("stderr", "")),
                exit_code=int(result.get("exit_code", -1)),
                execution_time_ms=result.get("execution_time_ms"),
            )

        replacements = {
            "get_sandbox_backend": get_sandbox_backend,
            "is_sandbox_enabled": is_sandbox_enabled,
            "run_code_in_sandbox": run_code_in_sandbox,
            "ensure_code_execution_enabled": ensure_code_execution_enabled,
        }
        for module, name in _SEAM_NAMES:
            _replace_everywhere(module, name, replacements[name])
        self.pointed = True

    def answer_as_host(self, frames: Frames, view: dict[str, Any], reply_dir: str | None) -> None:
        """This run's view of the host (its backend, its code-execution verdict, whether the
        flow holds a CreateOS Sandbox node); the seams are pointed first if they are not yet."""
        self.point()
        self.bridge = _SandboxBridge(frames, reply_dir or "/tmp/.createos-run")
        self.view = dict(view)
        if view.get("component"):
            _bridge_component(self.bridge)


_SANDBOX_SEAMS = _SandboxSeams()


def _bridge_component(bridge: _SandboxBridge) -> None:
    """The CreateOS Sandbox component's engine, answered by the host's: the component in the
    guest still validates its fields and renders the outcome, as in-process."""
    import base64 as b64

    from langflow_sandbox_createos.component import artifacts, engine

    def run(req: Any, *, on_output: Any = None, note: Any = None) -> Any:
        flow_id = None if req.flow_id == "noflow" else req.flow_id
        fields = {"python_code": req.program} if req.mode == "python" else {"command": req.program}
        answer = bridge.call("component", flow_id=flow_id, vertex=req.component_id, **fields)
        shown = answer.get("progress") or {}
        progress = getattr(on_output, "__self__", None)  # the component's own progress display
        if isinstance(progress, engine.Progress):
            progress.replay(list(shown.get("logs") or []), str(shown.get("tail") or ""))
        data = dict(answer.get("outcome") or {})
        files = [
            artifacts.ArtifactFile(
                path=str(f["path"]), data=b64.b64decode(f["data"]), path_escaped=bool(f.get("path_escaped"))
            )
            for f in data.pop("files", [])
        ]
        return engine.RunOutcome(**data, files=files)

    engine.run = run
