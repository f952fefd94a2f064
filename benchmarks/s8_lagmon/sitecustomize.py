"""S8's event-loop lag monitor, injected into a Langflow server by benchmarks/server_bench.py.

This directory goes on the server's PYTHONPATH (and nowhere else), so Python imports this
module at start-up; Langflow and the plugin are not changed. When ``S8_LAG_FILE`` is set it
wraps ``uvicorn.server.Server.serve``, which every uvicorn worker of ``langflow run`` awaits
(gunicorn's ``UvicornWorker._serve``), to start one task on the server's own event loop: it
sleeps 10 ms, again and again, and records how late each wake-up was (measured on the loop's
clock, minus the 10 ms asked for). Once a second it appends one JSON line to the file:
``{"pid": ..., "t": <time.time()>, "lag_ms": [...]}``. The bench reads the lines of a cell's
time window. The task costs the loop about 100 wake-ups a second (well under 1 % of a core).

Any other ``sitecustomize`` later on ``sys.path`` still runs (this one chains to it).
"""

from __future__ import annotations

import os
import sys

PERIOD = 0.010
FLUSH_EVERY = 1.0


def _install(path: str) -> None:
    import asyncio
    import functools
    import json
    import time

    try:
        from uvicorn.server import Server
    except Exception:  # not a uvicorn process: nothing to watch
        return

    async def monitor() -> None:
        loop = asyncio.get_running_loop()
        lags: list[float] = []
        last_flush = loop.time()
        pid = os.getpid()
        while True:
            before = loop.time()
            await asyncio.sleep(PERIOD)
            now = loop.time()
            lags.append(round((now - before - PERIOD) * 1000.0, 3))
            if now - last_flush >= FLUSH_EVERY:
                line = json.dumps({"pid": pid, "t": time.time(), "lag_ms": lags}, separators=(",", ":"))
                with open(path, "a", encoding="utf-8") as out:
                    out.write(line + "\n")
                lags = []
                last_flush = now

    original = Server.serve

    @functools.wraps(original)
    async def serve(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        task = asyncio.get_running_loop().create_task(monitor(), name="s8-lag-monitor")
        try:
            return await original(self, *args, **kwargs)
        finally:
            task.cancel()

    Server.serve = serve  # type: ignore[method-assign]


def _chain() -> None:
    """Run the next ``sitecustomize`` on sys.path, as if this one were not there."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


if os.environ.get("S8_LAG_FILE"):
    try:
        _install(os.environ["S8_LAG_FILE"])
    except Exception as exc:  # never stop the server for the benchmark's sake
        print(f"s8 lag monitor not installed: {exc!r}", file=sys.stderr)
_chain()
