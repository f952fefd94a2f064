"""One benchmark worker process: drives whichever `langflow_sandbox_createos` is importable.

The same file runs under both virtual environments (ours: .venv; the peer plugin 0.2.0:
benchmarks/.peer-venv). Both distributions use the import name `langflow_sandbox_createos`;
ours is recognised by its `backend` module. The driver (benchmarks/run.py) sends one JSON
command per line on stdin and reads one JSON answer per line from the protocol pipe (the
original stdout); anything the plugins or lfx print goes to stderr.

Standard library only, besides the plugin and lfx, so it runs unchanged in the peer's venv.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import resource
import sys
import threading
import time
import traceback
from typing import Any

# The protocol keeps the real stdout; fd 1 becomes stderr so stray prints cannot corrupt it.
_PROTO = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
sys.stdout = sys.stderr

OURS = importlib.util.find_spec("langflow_sandbox_createos.backend") is not None
PLUGIN = "ours" if OURS else "peer"

_backend: Any = None


def backend() -> Any:
    global _backend
    if _backend is None:
        if OURS:
            from langflow_sandbox_createos.backend import create_backend
        else:
            from langflow_sandbox_createos import create_backend
        _backend = create_backend()
    return _backend


def cpu_seconds() -> float:
    """User + system CPU of this whole process: every thread, our native I/O thread included."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def reset_peak_rss() -> bool:
    """Linux >= 4.0: writing 5 to clear_refs resets VmHWM (the peak RSS) to the current RSS."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


# --- commands ------------------------------------------------------------------------------


def op_info(_: dict[str, Any]) -> dict[str, Any]:
    from importlib.metadata import version

    info: dict[str, Any] = {
        "plugin": PLUGIN,
        "plugin_version": version("langflow-sandbox-createos"),
        "lfx": version("lfx"),
        "python": sys.version.split()[0],
        "pid": os.getpid(),
    }
    import langflow_sandbox_createos

    info["package"] = os.path.dirname(langflow_sandbox_createos.__file__)  # which copy runs
    if OURS:
        from langflow_sandbox_createos import _createos

        info["libcurl"] = _createos.curl_version
        info["native"] = _createos.__file__  # which build (benchmarks/abi3_s2.py)
    else:
        info["httpx"] = version("httpx")
    return info


def op_set_env(cmd: dict[str, Any]) -> dict[str, Any]:
    for key, value in cmd["vars"].items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = str(value)
    return {}


def op_run(cmd: dict[str, Any]) -> dict[str, Any]:
    """One backend run, timed. With `pool_ready`, wait for our warm pool to be full first
    (outside the timing): the pool's promise is guests created ahead of need."""
    b = backend()
    if cmd.get("pool_ready") and OURS:
        b._pool.wait_full(30.0)
    started = time.perf_counter()
    result = b.run(cmd.get("code", "print(1)"), env=cmd.get("env"))
    wall = time.perf_counter() - started
    return {
        "wall": wall,
        "exit_code": result.exit_code,
        "stdout": result.stdout[:200],
        "stderr": result.stderr[-300:],
    }


def op_cpu(cmd: dict[str, Any]) -> dict[str, Any]:
    """`n` sequential backend runs; client CPU (this process, all threads) per run."""
    b = backend()
    code = cmd.get("code", "print(1)")
    cpu0, wall0 = cpu_seconds(), time.perf_counter()
    failures = 0
    for _ in range(cmd["n"]):
        if b.run(code).exit_code != 0:
            failures += 1
    cpu, wall = cpu_seconds() - cpu0, time.perf_counter() - wall0
    return {"cpu_per_run": cpu / cmd["n"], "wall_per_run": wall / cmd["n"], "failures": failures}


def op_wire(cmd: dict[str, Any]) -> dict[str, Any]:
    """Ours only: the create and exec request bodies our backend sends for `code` (S2's floor
    replays them from C). Built by the backend's own code, as `run` builds them."""
    from langflow_sandbox_createos.backend import engine
    from langflow_sandbox_createos.core import connection

    config = engine._read_settings()
    plan = backend()._plan_for(connection.endpoints.get(), config, {})
    program = engine._Program.build(cmd.get("code", "print(1)"), config.timeout_seconds)
    assert program.stdin is not None and not program.files, "S2's program travels on stdin"
    # the fields in the order ops.c writes them (stdin last: exec_request splices it in)
    body = {"cmd": "/bin/sh", "args": ["-c", program.script], "stream": True, "stdin": program.stdin}
    return {"create": plan.guest.create_request(), "exec": body}


def op_threads(cmd: dict[str, Any]) -> dict[str, Any]:
    """`threads` threads x `runs` backend runs each, sharing one backend: runs per second."""
    b = backend()
    threads, runs = cmd["threads"], cmd["runs"]
    barrier = threading.Barrier(threads + 1)
    errors: list[str] = []
    latencies: list[float] = []
    lock = threading.Lock()

    def work() -> None:
        barrier.wait()
        for _ in range(runs):
            try:
                started = time.perf_counter()
                result = b.run("print(1)")
                with lock:
                    latencies.append(time.perf_counter() - started)
                if result.exit_code != 0 or result.stdout != "1\n":
                    raise RuntimeError(f"exit {result.exit_code}: {result.stderr[-200:]}")
            except Exception as exc:
                with lock:
                    errors.append(f"{type(exc).__name__}: {exc}"[:300])

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    cpu0 = cpu_seconds()
    barrier.wait()
    started = time.perf_counter()
    for t in pool:
        t.join()
    wall = time.perf_counter() - started
    done = threads * runs - len(errors)
    return {
        "runs_per_s": done / wall,
        "wall": wall,
        "done": done,
        "errors": len(errors),
        "error_samples": errors[:3],
        "cpu_per_run": (cpu_seconds() - cpu0) / max(1, threads * runs),
        "latency": _quantiles(latencies),
    }


def _quantiles(values: list[float]) -> dict[str, float]:
    data = sorted(values) or [float("nan")]

    def at(q: float) -> float:
        pos = (len(data) - 1) * q
        lo, hi = int(pos), min(int(pos) + 1, len(data) - 1)
        return data[lo] + (data[hi] - data[lo]) * (pos - lo)

    return {"p10": at(0.1), "median": at(0.5), "p90": at(0.9)}


def op_big_output(cmd: dict[str, Any]) -> dict[str, Any]:
    """A guest that prints `mib` MiB: peak RSS growth of this process and the outcome."""
    b = backend()
    b.run("print(1)")  # warm: connections, catalogs, imports
    mib = cmd["mib"]
    code = (
        "import sys\n"
        "chunk = 'x' * 1023 + '\\n'\n"
        f"for _ in range({mib} * 1024):\n"
        "    sys.stdout.write(chunk)\n"
    )
    import gc

    gc.collect()
    exact = reset_peak_rss()
    base_rss = _status_kib("VmRSS")
    base_peak = _status_kib("VmHWM")
    started = time.perf_counter()
    outcome: dict[str, Any] = {}
    try:
        result = b.run(code)
        outcome = {
            "completed": True,
            "exit_code": result.exit_code,
            "stdout_mib": len(result.stdout) / (1 << 20),
            "truncation_note": "truncated" in (result.stderr or ""),
            "stderr_tail": (result.stderr or "")[-300:],
        }
        del result
    except BaseException as exc:
        outcome = {"completed": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    wall = time.perf_counter() - started
    peak = _status_kib("VmHWM")
    growth_kib = peak - (base_rss if exact else base_peak)
    outcome.update({"peak_rss_growth_mib": growth_kib / 1024, "exact_peak_reset": exact, "wall": wall})
    return outcome


# --- the component (S5) and the executor (S6) -----------------------------------------------


def op_component(cmd: dict[str, Any]) -> dict[str, Any]:
    """One flow run of the CreateOS Sandbox component in a fresh lfx Graph (as Langflow
    builds them), Guest Reuse on: latency of the whole run."""
    from lfx.graph.graph.base import Graph

    from langflow_sandbox_createos.components.createos.createos_sandbox import CreateOSSandboxComponent

    component_id = "CreateOSSandbox-bench1"
    component = CreateOSSandboxComponent(
        _id=component_id,
        python_code=cmd.get("code", "print(1)"),
        session_mode=cmd.get("session_mode", "flow"),
    )
    # Guest Reuse is per Langflow user: a run without one gets a fresh guest
    graph = Graph(component, component, flow_id=cmd["flow_id"], user_id="bench-user")

    async def go() -> None:
        async for _ in graph.async_start():
            pass

    started = time.perf_counter()
    asyncio.run(go())
    wall = time.perf_counter() - started
    data = graph.get_vertex(component_id).results["results"].data
    return {
        "wall": wall,
        "result": str(data.get("result"))[:100],
        "sandbox_id": data.get("sandbox_id"),
        "reused": data.get("reused_guest"),
        "exit_code": data.get("exit_code"),
    }


def _executor_graph(sleep_seconds: float) -> Any:
    from lfx.components.input_output import ChatInput, ChatOutput
    from lfx.graph import Graph

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from flow_components.sleepy import Sleepy

    chat_in = ChatInput(_id="chat-in")
    middle = Sleepy(_id="sleepy")
    middle.set(input_value=chat_in.message_response)
    chat_out = ChatOutput(_id="chat-out")
    chat_out.set(input_value=middle.echo)
    return Graph(chat_in, chat_out)


def op_executor(cmd: dict[str, Any]) -> dict[str, Any]:
    """The executor on ChatInput -> Sleepy(3 s) -> ChatOutput: time to the first event the
    executor yields, and to RunComplete."""
    from lfx.execution.types import RunComplete, Unit

    from langflow_sandbox_createos.executor import CreateOSExecutor

    # A plain dict: the peer's executor cannot serialize lfx's InputValueRequest (what the
    # lfx CLI passes); both accept the dict form.
    unit = Unit(
        graph=_executor_graph(cmd.get("sleep", 3.0)),
        runtime_options={"initial_inputs": {"input_value": "hi"}},
    )
    arrivals: list[tuple[float, str]] = []
    outcome: dict[str, Any] = {}

    async def go() -> None:
        executor = CreateOSExecutor()
        started = time.perf_counter()
        async for item in executor.execute(unit):
            payload = getattr(item, "payload", None)
            kind = (
                type(item).__name__ if payload is None else f"{type(item).__name__}:{type(payload).__name__}"
            )
            arrivals.append((time.perf_counter() - started, kind))
            if isinstance(item, RunComplete):
                outcome["complete"] = arrivals[-1][0]
                try:
                    outcome["text"] = item.outputs[0].outputs[0].results["message"].text
                except Exception:
                    outcome["text"] = repr(item.outputs)[:200]

    asyncio.run(go())
    outcome["first_event"] = arrivals[0][0] if arrivals else None
    # the first vertex's own result (ours yields a GuestStatus before it; the peer has none)
    outcome["first_vertex"] = next(
        (t for t, kind in arrivals if kind.endswith(("RemoteVertexResult", "VertexBuildResult"))), None
    )
    outcome["events"] = len(arrivals)
    outcome["timeline"] = [[round(t, 3), kind] for t, kind in arrivals[:12]]
    return outcome


def op_arun(cmd: dict[str, Any]) -> dict[str, Any]:
    """S7: ChatInput -> ChatOutput through Graph.arun, with the executor kind `kind` chosen the
    way Langflow chooses it (LANGFLOW_EXECUTOR_KIND, read when lfx's coordinator is built).
    With `pool_ready`, our executor's warm pool is filled first, outside the timing. `cpu` is
    this process's CPU for the run (all threads), with `pool_ready` until the pool is full
    again."""
    from lfx.components.input_output import ChatInput, ChatOutput
    from lfx.execution import get_default_coordinator, reset_default_coordinator
    from lfx.graph import Graph
    from lfx.services.deps import get_settings_service

    os.environ["LANGFLOW_EXECUTOR_KIND"] = cmd["kind"]
    get_settings_service().settings.executor_kind = cmd["kind"]  # read when the coordinator is built
    reset_default_coordinator()
    assert get_default_coordinator()._executor_kind == cmd["kind"]
    chat_in = ChatInput(_id="chat-in")
    chat_out = ChatOutput(_id="chat-out")
    chat_out.set(input_value=chat_in.message_response)
    graph = Graph(chat_in, chat_out)
    if cmd.get("owned"):  # a flow and a user: a trust domain, which CREATEOS_EXECUTOR_REUSE needs
        graph.flow_id, graph.user_id = (
            "00000000-0000-0000-0000-0000000000b7",
            "00000000-0000-0000-0000-0000000000b8",
        )
    pooled = bool(cmd.get("pool_ready") and OURS and cmd["kind"] == "createos")
    if pooled:
        from langflow_sandbox_createos.executor import pool

        pool.pool().wait_full(240.0)
    cpu0 = cpu_seconds()
    started = time.perf_counter()
    runs = asyncio.run(graph.arun([{"input_value": "hi"}]))
    wall = time.perf_counter() - started
    if pooled:
        # the host's CPU for a pooled run includes creating the guest that replaces it
        pool.pool().wait_full(240.0)
    cpu = cpu_seconds() - cpu0
    message = runs[0].outputs[0].results["message"]
    if isinstance(message, dict):  # the peer hands back plain dicts
        text = message.get("text") or (message.get("data") or {}).get("text")
    else:
        text = message.text
    return {"wall": wall, "text": text, "cpu": cpu}


def op_arun_pool_ready(_: dict[str, Any]) -> dict[str, Any]:
    """Wait (untimed) until our executor's warm pool is full; the peer has none."""
    if OURS:
        from langflow_sandbox_createos.executor import pool

        return {"full": pool.pool().wait_full(240.0)}
    return {"full": None}


def op_rss(_: dict[str, Any]) -> dict[str, Any]:
    return {"rss_kib": _status_kib("VmRSS")}


def op_shutdown(_: dict[str, Any]) -> dict[str, Any]:
    if _backend is not None:
        _backend.shutdown()
    if OURS:
        from langflow_sandbox_createos.executor import pool

        pool.shutdown()
        from langflow_sandbox_createos.executor import reuse

        reuse.domains.shutdown()
    return {}


OPS = {
    "info": op_info,
    "set_env": op_set_env,
    "run": op_run,
    "cpu": op_cpu,
    "wire": op_wire,
    "threads": op_threads,
    "big_output": op_big_output,
    "component": op_component,
    "executor": op_executor,
    "arun": op_arun,
    "rss": op_rss,
    "arun_pool_ready": op_arun_pool_ready,
    "shutdown": op_shutdown,
}


def main() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        try:
            answer = {"ok": True, **OPS[cmd["op"]](cmd)}
        except BaseException as exc:
            answer = {
                "ok": False,
                "error": f"{type(exc).__name__}: {exc}"[:2000],
                "trace": traceback.format_exc()[-3000:],
            }
        _PROTO.write(json.dumps(answer) + "\n")
        if cmd["op"] == "exit":
            break


if __name__ == "__main__":
    main()
