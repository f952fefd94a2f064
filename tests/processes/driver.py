"""A process of its own that drives the plugin's surfaces on the test's word: what one Langflow
worker (or one Langflow server) is to the plugin, without Langflow's server around it.

Started by ``Driver`` (conftest.py) with the test's environment (pointed at the test's
createos-local). It reads one JSON command a line on stdin and answers one JSON line on stdout:

  {"op": "component", "tag", "code", "mode", "flow_id", "component_id", "user_id"}
      start a run of the CreateOS Sandbox node (the class as lfx's extension loader loads it)
      in a fresh lfx Graph, as Langflow runs a flow, on a thread of its own; answers at once
  {"op": "backend", "tag", "code"}   start a run of the sandbox backend, on a thread
  {"op": "result", "tag"}            wait for that run and answer its outcome
  {"op": "ready"}                    import what a node run needs (lfx, the component class)
  {"op": "pool", "timeout"}          the first time, one backend run to start the warm pool
                                     (CREATEOS_SANDBOX_WARM_POOL); then wait until it is full;
                                     answers "state"
  {"op": "state"}                    pid, keeper pid, guests held, the pool's ready guests
  {"op": "exit"}                     answer, then end normally (atexit runs)

Every answer is {"ok": true, ...} or {"ok": false, "error": ...}.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

_lock = threading.Lock()
_runs: dict[str, tuple[threading.Thread, dict[str, Any]]] = {}
_made: dict[str, Any] = {}


def backend() -> Any:
    with _lock:
        if "backend" not in _made:
            from langflow_sandbox_createos.backend.engine import create_backend

            _made["backend"] = create_backend()
        return _made["backend"]


def component_class() -> type:
    with _lock:
        if "component" not in _made:
            from lfx.extension.loader import load_extension

            import langflow_sandbox_createos

            loaded = load_extension(Path(langflow_sandbox_createos.__file__).resolve().parent)
            [found] = [c.klass for c in loaded.components if c.klass.display_name == "CreateOS Sandbox"]
            _made["component"] = found
        return _made["component"]


def run_component(cmd: dict[str, Any]) -> dict[str, Any]:
    from lfx.graph.graph.base import Graph

    node = cmd["component_id"]
    component = component_class()(
        _id=node, python_code=cmd["code"], session_mode=cmd["mode"], timeout_seconds=240
    )
    graph = Graph(component, component, flow_id=cmd["flow_id"], user_id=cmd["user_id"])

    async def go() -> None:
        async for _ in graph.async_start():
            pass

    asyncio.run(go())
    data = dict(graph.get_vertex(node).results["results"].data)
    return {k: data.get(k) for k in ("result", "stderr", "exit_code", "sandbox_id", "reused_guest", "error")}


def run_backend(cmd: dict[str, Any]) -> dict[str, Any]:
    result = backend().run(cmd["code"])
    return {"result": result.stdout.strip(), "stderr": result.stderr, "exit_code": result.exit_code}


def start(cmd: dict[str, Any], work: Any) -> dict[str, Any]:
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome.update(work(cmd))
        except BaseException as exc:  # the test reads it
            outcome["raised"] = f"{type(exc).__name__}: {exc}"
            outcome["traceback"] = traceback.format_exc()[-3000:]

    thread = threading.Thread(target=target, name=f"run-{cmd['tag']}", daemon=True)
    _runs[cmd["tag"]] = (thread, outcome)
    thread.start()
    return {}


def state() -> dict[str, Any]:
    from langflow_sandbox_createos.core import connection, pool_keeper

    keeper = pool_keeper.keepers.for_endpoint(connection.endpoints.get())
    pool = _made["backend"]._pool.ready_ids() if "backend" in _made else []
    return {
        "pid": os.getpid(),
        "keeper": keeper.pid,
        "held": sorted(pool_keeper.keepers.held_ids()),
        "pool": pool,
    }


def handle(cmd: dict[str, Any]) -> dict[str, Any]:
    op = cmd["op"]
    if op == "component":
        return start(cmd, run_component)
    if op == "backend":
        return start(cmd, run_backend)
    if op == "result":
        thread, outcome = _runs[cmd["tag"]]
        thread.join()
        return {"outcome": outcome}
    if op == "ready":
        component_class()
        return {}
    if op == "pool":
        if not _made.get("pool started"):
            warm = backend().run("print('warm-up')")  # the first run goes cold and starts the pool
            assert warm.stdout.strip() == "warm-up", warm
            _made["pool started"] = True
        if not backend()._pool.wait_full(cmd.get("timeout", 120)):
            raise RuntimeError(f"the warm pool did not fill: {backend()._pool.stats()}")
        return state()
    if op == "state":
        return state()
    raise ValueError(f"unknown op {op!r}")


def main() -> None:
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "exit":
            print(json.dumps({"ok": True}), flush=True)
            return  # a normal end: atexit runs (the pool deletes its guests, the keeper is told)
        try:
            answer = {"ok": True, **handle(cmd)}
        except Exception as exc:
            answer = {
                "ok": False,
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(),
            }
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
