"""Shared machinery of the reliability suites: lanes (one createos-local each, driven from
one thread each), per-thread settings, a DEBUG log capture across all loggers, and one
driver per surface (backend, component with and without reuse, executor).

Why lanes: the fault API is per control plane and route-wide, so two cases may share a
plane only one after the other. Each lane owns a plane, and every setting the plugin reads
goes through ``settings._env``, which the suites point at the calling lane's own mapping
(a thread-local), so lanes run side by side in one process, on one shared
``connection.endpoints`` (one native client per lane URL, exactly as in production).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import langflow_sandbox_createos
from langflow_sandbox_createos.core import connection, settings
from langflow_sandbox_createos.local.images import TEMPLATE_NAME
from langflow_sandbox_createos.local.testing import LocalControlPlane

# A key long and random enough that any 10-character window of it in a log, message or repr
# is a leak and not a coincidence. Drawn per process, so it is on no disk a guest could read
# (createos-local's devbox:1 guests see the host's / read-only, this repository included).
API_KEY = "sk-cos-reliab-" + secrets.token_hex(20)
KEY_WINDOW = 10

COMPONENT_SHAPE = "s-2vcpu-4gb"
USER_ID = "reliability-user"  # the Langflow user of the component's runs (Guest Reuse is per user)
REUSE_OWNER = (f"user:{USER_ID}",)
PACKAGE_DIR = Path(langflow_sandbox_createos.__file__).resolve().parent

_SETTING_VARS = (
    "CREATEOS_SANDBOX_API_KEY",
    "CREATEOS_API_KEY",
    "CREATEOS_SANDBOX_BASE_URL",
)


def key_windows(key: str = API_KEY, width: int = KEY_WINDOW) -> list[str]:
    return [key[i : i + width] for i in range(len(key) - width + 1)]


_WINDOWS = key_windows()


def leaks_key(text: str) -> bool:
    return any(w in text for w in _WINDOWS)


# --- per-thread settings ---------------------------------------------------------------------


class LaneEnv:
    """Replacement for ``settings._env``: the calling thread's mapping, else os.environ."""

    def __init__(self) -> None:
        self._local = threading.local()

    def __call__(self, environ: Mapping[str, str] | None = None) -> Mapping[str, str]:
        if environ is not None:
            return environ
        current = getattr(self._local, "env", None)
        return os.environ if current is None else current

    @contextlib.contextmanager
    def use(self, env: Mapping[str, str]) -> Iterator[None]:
        previous = getattr(self._local, "env", None)
        self._local.env = dict(env)
        try:
            yield
        finally:
            self._local.env = previous


lane_env = LaneEnv()


@contextlib.contextmanager
def lane_settings_installed() -> Iterator[None]:
    """Route every settings read through ``lane_env``; lfx's settings service never decides."""
    saved_env, saved_lfx = settings._env, settings._lfx_sandbox_settings
    settings._env = lane_env  # type: ignore[assignment]
    settings._lfx_sandbox_settings = lambda: None  # type: ignore[assignment]
    try:
        yield
    finally:
        settings._env = saved_env  # type: ignore[assignment]
        settings._lfx_sandbox_settings = saved_lfx  # type: ignore[assignment]


# --- log capture across all loggers and threads ------------------------------------------------


class LogCapture(logging.Handler):
    """Like pytest's caplog at DEBUG, for every logger and thread; each record is tagged with
    the case its thread was running (helper threads of a run are tagged with None)."""

    def __init__(self, keep_level: int = logging.DEBUG) -> None:
        super().__init__(level=logging.DEBUG)
        self.keep_level = keep_level  # records below it are scanned for the key, not kept
        self.scanned = 0
        self.leaked: list[str] = []
        # (case, level, text): the text only, never the record (whose args and traceback would
        # keep a run's objects alive, growing the heap the soak measures)
        self.records: list[tuple[str | None, int, str]] = []
        self.kept_bytes = 0  # what the kept texts hold (the soak's heap bound discounts it)
        self._tag = threading.local()
        self._lock2 = threading.Lock()
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except Exception:  # a record that cannot format is itself worth seeing
            text = f"<unformattable {record.msg!r}>"
        with self._lock2:
            self.scanned += 1
            if leaks_key(text):
                self.leaked.append(text[:500])
            if record.levelno >= self.keep_level:
                self.records.append((getattr(self._tag, "case", None), record.levelno, text))
                self.kept_bytes += sys.getsizeof(text) + 8

    @contextlib.contextmanager
    def case(self, case_id: str) -> Iterator[None]:
        self._tag.case = case_id
        try:
            yield
        finally:
            self._tag.case = None

    def texts(self, case_id: str | None = ...) -> list[str]:  # type: ignore[assignment]
        with self._lock2:
            if case_id is ...:
                return [t for _, _, t in self.records]
            return [t for c, _, t in self.records if c == case_id]

    def mentioning(self, needle: str, min_level: int = logging.DEBUG) -> list[str]:
        with self._lock2:
            return [t for _, level, t in self.records if needle in t and level >= min_level]

    def key_leaks(self) -> list[tuple[str | None, str]]:
        with self._lock2:
            return [(c, t) for c, _, t in self.records if leaks_key(t)]


@contextlib.contextmanager
def capture_all_logs(keep_level: int = logging.DEBUG) -> Iterator[LogCapture]:
    handler = LogCapture(keep_level)
    root = logging.getLogger()
    saved = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    # loggers that set their own level above DEBUG would hide records: lower ours
    ours = [logging.getLogger(n) for n in ("langflow_sandbox_createos",)]
    saved_ours = [lg.level for lg in ours]
    for lg in ours:
        lg.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(saved)
        for lg, lvl in zip(ours, saved_ours, strict=True):
            lg.setLevel(lvl)


# --- lanes ------------------------------------------------------------------------------------

# The executor's guests use createos-local's lfx template (devbox:1 is a plain image).
TEMPLATE_ENV = {"CREATEOS_EXECUTOR_ROOTFS": TEMPLATE_NAME}


@dataclass
class Lane:
    index: int
    plane: LocalControlPlane

    def env(self, **overrides: str) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "CREATEOS_SANDBOX_API_KEY": self.plane.api_key,
            "CREATEOS_SANDBOX_BASE_URL": self.plane.url,
            "LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS": "true",
            "CREATEOS_SANDBOX_ACCEPT_LOCAL_ISOLATION": "true",  # createos-local
            "LANGFLOW_SANDBOX_TIMEOUT_SECONDS": "30",
            "CREATEOS_SANDBOX_CONTROL_TIMEOUT_SECONDS": "15",
            "CREATEOS_EXECUTOR_TIMEOUT_SECONDS": "180",
            **TEMPLATE_ENV,
        }
        env.update(overrides)
        return {k: v for k, v in env.items() if v is not None}

    def endpoint(self) -> connection.Endpoint:
        return connection.endpoints.get()

    def ids(self) -> set[str]:
        return {row["id"] for row in self.plane.sandboxes()}


def start_planes(count: int, **kwargs: Any) -> list[LocalControlPlane]:
    planes: list[LocalControlPlane] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            plane = LocalControlPlane(api_key=API_KEY, boot_delay_ms=0, **kwargs).start()
        except BaseException as exc:  # pragma: no cover - environment problem
            errors.append(exc)
        else:
            planes.append(plane)

    threads = [threading.Thread(target=one) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        for plane in planes:
            plane.stop()
        raise errors[0]
    return planes


def forget_endpoint(url: str) -> None:
    """Drop every cached client of one lane's URL (whoami latch and catalog with it)."""
    with connection.endpoints._lock:
        doomed = [k for k, e in connection.endpoints._by_key.items() if e.base_url == url]
        endpoints = [connection.endpoints._by_key.pop(k) for k in doomed]
    for endpoint in endpoints:
        with contextlib.suppress(Exception):
            endpoint.client.close()  # type: ignore[attr-defined]


def reset_preflight(url: str) -> None:
    """Make the next run on this lane ask whoami and the shape catalog again."""
    for endpoint in connection.endpoints.all():
        if endpoint.base_url == url:
            endpoint.preflight_ok = False
            endpoint.shapes = None


# --- the surfaces -------------------------------------------------------------------------------


@dataclass
class Outcome:
    surface: str
    elapsed: float
    value: Any = None
    exc: BaseException | None = None
    stdout: str = ""
    exit_code: int | None = None
    timed_out: bool = False
    details: dict[str, Any] = field(default_factory=dict)
    reprs: list[str] = field(default_factory=list)

    @property
    def raised(self) -> bool:
        return self.exc is not None

    def exc_texts(self) -> list[str]:
        """Every rendering of the error a user or a log could see: message, repr, args,
        traceback (chained errors included), attributes."""
        out: list[str] = []
        seen: set[int] = set()
        exc = self.exc
        while exc is not None and id(exc) not in seen:
            seen.add(id(exc))
            out += [str(exc), repr(exc), repr(exc.args), repr(getattr(exc, "__dict__", {}))]
            out.append("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
            exc = exc.__cause__ or exc.__context__
        return out


class SurfaceDriver:
    """Runs one program on one surface in the calling thread (whose lane env is active)."""

    def __init__(self) -> None:
        self._component_cls: type | None = None
        self._backend: Any = None
        self._lock = threading.Lock()

    # -- component class exactly as lfx loads it ----------------------------------------------
    def component_cls(self) -> type:
        with self._lock:
            if self._component_cls is None:
                from lfx.extension.loader import load_extension

                result = load_extension(PACKAGE_DIR)
                assert result.errors == [], result.errors
                (cls,) = [c.klass for c in result.components if c.klass.display_name == "CreateOS Sandbox"]
                self._component_cls = cls
            return self._component_cls

    # -- backend ---------------------------------------------------------------------------------
    def backend(self, code: str, env: Mapping[str, str] | None = None, *, shared: bool = False) -> Outcome:
        """One run; ``shared`` uses one backend instance per process, as lfx does."""
        from langflow_sandbox_createos.backend.engine import create_backend

        with self._lock:
            if shared and self._backend is None:
                self._backend = create_backend()
        backend = self._backend if shared else create_backend()
        started = time.monotonic()
        out = Outcome("backend", 0.0)
        try:
            result = backend.run(code, env=dict(env) if env else None)
        except BaseException as exc:
            out.exc = exc
        else:
            out.value = result
            out.stdout = result.stdout
            out.exit_code = result.exit_code
            out.timed_out = result.exit_code == -1
            out.details["stderr"] = result.stderr
        out.elapsed = time.monotonic() - started
        out.reprs = [repr(backend), repr(out.value), *(repr(e) for e in connection.endpoints.all())]
        return out

    # -- component ---------------------------------------------------------------------------------
    def component(
        self,
        code: str,
        *,
        component_id: str,
        reuse: bool = False,
        collect: bool = False,
        timeout: int = 30,
        command: str = "",
        allow_network: bool = False,
        shape: str = COMPONENT_SHAPE,
    ) -> Outcome:
        cls = self.component_cls()
        component = cls(
            _id=component_id,
            _user_id=USER_ID,
            python_code=code,
            command=command,
            session_mode="flow" if reuse else "off",
            collect_artifacts=collect,
            allow_network=allow_network,
            timeout_seconds=timeout,
            shape=shape,
        )
        surface = "component-reuse" if reuse else ("component-files" if collect else "component")
        out = Outcome(surface, 0.0)
        started = time.monotonic()
        try:
            data = component.run_sandbox()
            files = component.collected_files()
        except BaseException as exc:
            out.exc = exc
        else:
            payload = dict(data.data)
            out.value = payload
            out.stdout = str(payload.get("result", ""))
            out.exit_code = payload.get("exit_code")
            out.timed_out = bool(payload.get("timed_out"))
            out.details = {**payload, "files": files}
        out.elapsed = time.monotonic() - started
        out.reprs = [repr(component), repr(out.value), *(repr(e) for e in connection.endpoints.all())]
        with contextlib.suppress(Exception):
            out.reprs.append(repr(component.status))
        return out

    # -- executor ------------------------------------------------------------------------------------
    def executor(self, text: str, *, graph_factory: Callable[[], Any] | None = None) -> Outcome:
        from lfx.execution.types import RunComplete, Unit
        from lfx.schema.schema import InputValueRequest

        from langflow_sandbox_createos.executor import CreateOSExecutor

        executor = CreateOSExecutor()
        graph = (graph_factory or chat_graph)()
        unit = Unit(graph=graph, runtime_options={"initial_inputs": InputValueRequest(input_value=text)})
        out = Outcome("executor", 0.0)

        async def drain() -> list[Any]:
            return [item async for item in executor.execute(unit)]

        started = time.monotonic()
        try:
            items = asyncio.run(drain())
        except BaseException as exc:
            out.exc = exc
        else:
            out.value = items
            final = items[-1] if items else None
            if isinstance(final, RunComplete):
                with contextlib.suppress(Exception):
                    out.stdout = final.outputs[0].outputs[0].results["message"].text
                out.exit_code = 0
            out.details["items"] = len(items)
        out.elapsed = time.monotonic() - started
        out.reprs = [repr(executor), *(repr(e) for e in connection.endpoints.all())]
        return out


def chat_graph() -> Any:
    """ChatInput -> ChatOutput: the executor's cheapest real flow."""
    from lfx.components.input_output import ChatInput, ChatOutput
    from lfx.graph import Graph

    chat_in = ChatInput(_id="chat-in")
    chat_out = ChatOutput(_id="chat-out")
    chat_out.set(input_value=chat_in.message_response)
    return Graph(chat_in, chat_out)


driver = SurfaceDriver()


def drain_backend_deletes(timeout: float = 10.0) -> None:
    """Let queued background deletes finish (and be logged), as lfx's shutdown does: the
    backend's queue, and the executor's delete threads (a run returns before its delete)."""
    from langflow_sandbox_createos.backend.engine import create_backend
    from langflow_sandbox_createos.core.lease import wait_for_deletes

    create_backend().shutdown()
    wait_for_deletes(timeout)
