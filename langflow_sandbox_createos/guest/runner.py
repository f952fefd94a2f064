"""The program that runs one whole flow inside a CreateOS guest.

It is not imported on the host: the executor sends its source, the run spec and a
per-run secret on the exec's stdin, and a one-line bootstrap (`python3 -c ...`)
compiles it and calls `main`. Nothing is written to the guest's disk.

Framing. Before any flow code runs, the real stdout (fd 1) is duplicated onto a
private, non-inheritable descriptor reserved for frames, and fd 1 (plus
`sys.stdout`) is pointed at stderr. So `print()`, logging and child processes of the
flow all land on the exec's stderr stream. Each frame is one line

    LFXF1 <seq> <mac> <json>

where `mac` is HMAC-SHA256 over "<seq> <json>" keyed with the per-run secret that
arrived on stdin (never in argv or the environment), and `seq` counts up from 0.
The host accepts a line only if the sequence number is the next one and the MAC
matches; anything else is plain output. See docs/executor.md for the threat model.

Only the standard library is used until lfx has been found (or installed).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import sys
import threading
import time
import traceback
from typing import Any

MAGIC = "LFXF1"
TIMEOUT_EXIT = 124
EXIT_NO_LFX = 3
EXIT_INSTALL_FAILED = 4
EXIT_FAILED = 1
VERTEX_FRAME_MAX = 512 * 1024  # a bigger vertex event is sent without its results
TEXT_MAX = 4000
INSTALL_TARGET = "/workspace/.createos-lfx"


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
            mac = hmac.new(self._key, f"{seq} {body}".encode(), hashlib.sha256).hexdigest()[:32]
            # The leading newline ends any partial line flow code may have written to this
            # descriptor, so it cannot glue itself onto (and spoil) a real frame.
            data = f"\n{MAGIC} {seq} {mac} {body}\n".encode()
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


async def _drive(graph: Any, frames: Frames, inputs: Any, opts: dict[str, Any]) -> None:
    """Run the graph step by step like the in-process streaming path, one frame per vertex."""
    from lfx.graph.graph.constants import Finish

    run = graph.async_start(
        inputs=inputs,
        max_iterations=opts.get("max_iterations"),
        config=opts.get("config"),
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
    graph = Graph.from_payload(spec["graph"], flow_id=spec.get("flow_id"), flow_name=spec.get("flow_name"))
    frames.emit("graph", vertices=len(graph.vertices))
    outputs = [str(o) for o in (opts.get("outputs") or [])]
    runs: list[dict[str, Any]] = []

    if spec.get("mode") == "runs":  # Graph.arun / _arun_legacy semantics: one pass per input dict
        inputs = spec.get("inputs") or [{}]
        components = list(opts.get("inputs_components") or [])
        components += [[] for _ in range(len(inputs) - len(components))]
        types = list(opts.get("types") or [])
        types += ["chat" for _ in range(len(inputs) - len(types))]
        for run_inputs, run_components, input_type in zip(inputs, components, types, strict=False):
            if not isinstance(run_inputs.get("input_value", ""), str):
                raise TypeError(f"Invalid input value: {run_inputs.get('input_value')}. Expected string")
            if run_inputs:
                graph._set_inputs(run_components or [], run_inputs, input_type)
            await _drive(graph, frames, None, opts)
            results = await _harvest(graph, outputs)
            runs.append({"inputs": run_inputs, "outputs": [_encode_result(r) for r in results]})
    else:  # the streaming path: async_start(initial_inputs)
        initial = (spec.get("inputs") or [None])[0]
        request = None
        if isinstance(initial, dict):
            from lfx.schema.schema import InputValueRequest

            try:
                request = InputValueRequest.model_validate(initial)
            except Exception:  # the in-process path ignores inputs it cannot read, so do we
                request = None
        await _drive(graph, frames, request, opts)
        results = await _harvest(graph, outputs)
        runs.append({"inputs": initial or {}, "outputs": [_encode_result(r) for r in results]})

    frames.emit("outputs", runs=runs)


def main(boot: dict[str, Any]) -> None:
    key = bytes.fromhex(boot.pop("token"))
    spec = boot.pop("spec", None)
    if spec is None:  # a large spec was uploaded; read it and leave nothing on disk
        path = boot.pop("spec_path")
        with open(path, encoding="utf-8") as handle:
            spec = json.load(handle)
        os.unlink(path)
    frames = Frames(_isolate_stdout(), key)
    del key
    deadline = time.monotonic() + float(spec.get("timeout", 600))
    _start_watchdog(frames, float(spec.get("timeout", 600)))
    # The guest runs the flow itself; it must never hand the graph to another executor.
    os.environ["LANGFLOW_EXECUTOR_KIND"] = "in-process"
    frames.emit("hello", python=sys.version.split()[0], pid=os.getpid())

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
    try:
        from importlib.metadata import version

        lfx_version = version("lfx")
    except Exception:
        lfx_version = None
    frames.emit("ready", lfx=lfx_version, installed=installed)

    import asyncio

    try:
        asyncio.run(_run_flow(frames, spec))
    except BaseException as exc:  # report every failure, including SystemExit from a component
        if isinstance(exc, KeyboardInterrupt):
            raise
        frames.emit(
            "fatal",
            error=f"{type(exc).__name__}: {exc}",
            missing_module=_missing_module(exc),
            traceback=_tail("".join(traceback.format_exception(exc)), TEXT_MAX),
        )
        sys.stderr.flush()
        os._exit(EXIT_FAILED)
    frames.emit("done")
    sys.stderr.flush()
    os._exit(0)  # do not wait for threads a component left running
