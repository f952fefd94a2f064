"""Where one cold executor run's time goes, measured against createos-local.

    .venv/bin/python benchmarks/executor_breakdown.py [--rounds 5] [--rootfs langflow-lfx]

Per round, ChatInput -> ChatOutput through the executor's own run machinery, the host notes
when each of the guest runner's frames arrives, counted from the start of the exec:
  create     POST /v1/sandboxes (before the exec; not part of the exec clock)
  hello      interpreter started, runner compiled, stdout isolated
  ready      lfx found (and its version read)
  graph      lfx's graph machinery imported, memory installed, the flow rebuilt
  vertex1    the first vertex built and its event written
  outputs    the run's outputs harvested
  exit       the exec's end (interpreter shut down)
Plus, on one guest: `python3 -c pass` and `python3 -c "import lfx.graph"` as plain execs, the
floor the runner cannot go under. Medians over the rounds; the machine's load is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from langflow_sandbox_createos.core import connection, guest_spec, settings
from langflow_sandbox_createos.executor.run import _Run
from langflow_sandbox_createos.executor.spec import build_spec
from langflow_sandbox_createos.local.images import TEMPLATE_NAME
from langflow_sandbox_createos.local.testing import LocalControlPlane

PHASES = ("hello", "ready", "graph", "vertex1", "outputs", "exit")


def chat_unit_graph() -> Any:
    from lfx.components.input_output import ChatInput, ChatOutput
    from lfx.graph import Graph

    chat_in = ChatInput(_id="chat-in")
    chat_out = ChatOutput(_id="chat-out")
    chat_out.set(input_value=chat_in.message_response)
    return Graph(chat_in, chat_out)


async def one_run() -> dict[str, float]:
    from lfx.schema.schema import InputValueRequest

    cfg = settings.executor_settings()
    spec, _ = build_spec(chat_unit_graph(), [], {"initial_inputs": InputValueRequest(input_value="hi")})
    spec["timeout"] = cfg.timeout_seconds
    run = _Run(connection.endpoints.get(), cfg, spec)
    marks: dict[str, float] = {}
    started = time.monotonic()
    try:
        await run.create()
        marks["create"] = time.monotonic() - started
        stdin = await run.stage()
        t0 = time.monotonic()
        run.start_exec(stdin)
        while True:
            kind, item = await run.queue.get()
            now = time.monotonic() - t0
            if kind == "error":
                raise item
            if kind == "end":
                marks["exit"] = now
                break
            name = item.get("t")
            if name == "vertex":
                marks.setdefault("vertex1", now)
            elif name in PHASES:
                marks.setdefault(name, now)
    finally:
        await run.close()
    return marks


def plain_exec(client: Any, sandbox_id: str, code: str) -> float:
    t0 = time.monotonic()
    result = client.exec(sandbox_id, "python3", ["-c", code], timeout=300.0)
    assert result.exit_code == 0, result.stderr
    return time.monotonic() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rootfs", default=TEMPLATE_NAME, help="a rootfs with lfx (devbox:1 has none)")
    args = parser.parse_args()
    with LocalControlPlane() as cp:
        os.environ.update(
            CREATEOS_SANDBOX_API_KEY=cp.api_key,
            CREATEOS_SANDBOX_BASE_URL=cp.url,
            CREATEOS_EXECUTOR_ROOTFS=args.rootfs,
        )
        client = connection.endpoints.get().client
        sandbox_id = client.create(
            {
                "name": guest_spec.random_name("lf-x-"),
                "rootfs": args.rootfs,
                "shape": settings.DEFAULT_EXECUTOR_SHAPE,
            }
        )["id"]
        try:
            floors: dict[str, list[float]] = {"python3 -c pass": [], "import lfx.graph": []}
            for _ in range(args.rounds):
                floors["python3 -c pass"].append(plain_exec(client, sandbox_id, "pass"))
                floors["import lfx.graph"].append(plain_exec(client, sandbox_id, "import lfx.graph"))
        finally:
            client.delete(sandbox_id)
        rounds = [asyncio.run(one_run()) for _ in range(args.rounds)]
    print(f"load average: {os.getloadavg()[0]:.1f} (2 cores)")
    for name, values in floors.items():
        print(f"{name:>18}: {statistics.median(values):6.2f} s (plain exec, median of {len(values)})")
    print("cold run, seconds from exec start (median; create is before the exec):")
    for phase in ("create", *PHASES):
        values = [r[phase] for r in rounds if phase in r]
        if values:
            print(f"{phase:>18}: {statistics.median(values):6.2f} s")


if __name__ == "__main__":
    main()
