"""Where a pooled executor run's time goes (benchmark row S7), measured against createos-local.

    PYTHONPATH=. .venv/bin/python benchmarks/executor_pool_breakdown.py [--rounds 7] [--latency-ms 25] [--reuse]

S7's own setting: ChatInput -> ChatOutput through ``Graph.arun`` with
``LANGFLOW_EXECUTOR_KIND=createos`` and ``CREATEOS_EXECUTOR_WARM_POOL=1``, the pool refilled
(untimed) before each round, createos-local adding 25 ms to each request and 200 ms to each
boot. Each round also times the same flow in-process (the reference), interleaved. With
``--reuse``, S7's reused row instead: ``CREATEOS_EXECUTOR_REUSE=true``, the flow given a flow id
and a user, each timed run on the domain's warm guest once its standby run waits.

Per round the executor's debug timeline (``executor/timeline.py``) gives when the run passed
each step on the host, counted from ``Graph.arun``'s call, and the guest runner's own
duration of each of its steps (from its `done` frame). Printed: medians over the rounds, the
machine's load average before and after. ``--json FILE`` keeps every round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from langflow_sandbox_createos.local.images import TEMPLATE_NAME
from langflow_sandbox_createos.local.testing import LocalControlPlane

# What each host step means (marks of executor/timeline.py), in the order a run passes them.
HOST_STEPS = {
    "execute": "execute() entered (lfx's coordinator handed the unit over)",
    "spec": "run spec built (flow JSON, runtime state, settings, sandbox view)",
    "line": "admission line entered",
    "take": "a warm guest taken from the pool (no request)",
    "delivered": "spec uploaded (PUT .../files returned)",
    "accepted": "the runner's `accepted` frame read",
    "hello": "early frames replayed (hello, ready, waiting: sent at warm-up)",
    "graph": "`graph` frame: the flow rebuilt in the guest",
    "vertex": "first vertex event",
    "outputs": "`outputs` frame: results harvested",
    "done": "`done` frame: the runner's last",
    "end": "the exec's end read (runner process gone)",
    "complete": "RunComplete yielded",
    "bridge": "sandbox bridge closed",
    "closed": "run closed (guest delete returned, or handed to its thread)",
    "returned": "Graph.arun returned",
    "deleted": "guest delete returned (when done after the run)",
}


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        timeline = getattr(record, "timeline", None)
        if isinstance(timeline, dict):
            self.records.append(timeline)


OWNED = {"flow_id": "00000000-0000-0000-0000-00000000004b", "user_id": "00000000-0000-0000-0000-00000000004c"}


def chat_graph(owned: bool = False) -> Any:
    from lfx.components.input_output import ChatInput, ChatOutput
    from lfx.graph import Graph

    chat_in = ChatInput(_id="chat-in")
    chat_out = ChatOutput(_id="chat-out")
    chat_out.set(input_value=chat_in.message_response)
    graph = Graph(chat_in, chat_out, **(OWNED if owned else {}))
    return graph


def use_executor(kind: str) -> None:
    """Choose the executor the way Langflow does (as benchmarks/worker.py's S7 does)."""
    from lfx.execution import get_default_coordinator, reset_default_coordinator
    from lfx.services.deps import get_settings_service

    os.environ["LANGFLOW_EXECUTOR_KIND"] = kind
    get_settings_service().settings.executor_kind = kind
    reset_default_coordinator()
    assert get_default_coordinator()._executor_kind == kind


def arun(kind: str, owned: bool = False) -> float:
    use_executor(kind)
    graph = chat_graph(owned)
    started = time.perf_counter()
    runs = asyncio.run(graph.arun([{"input_value": "hi"}]))
    wall = time.perf_counter() - started
    assert runs[0].outputs[0].results["message"].text == "hi", runs
    return wall


def ready(reuse: bool) -> None:
    """The pool full, or (``reuse``) the domain's reused guest with a standby run waiting."""
    from langflow_sandbox_createos.executor import pool
    from langflow_sandbox_createos.executor import reuse as reused

    if not reuse:
        assert pool.pool().wait_full(240.0), "the pool did not fill"
        return
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        guests = list(reused.domains.guests())
        if guests and all(g.runs == 0 and g.standby and "waiting" in g.standby.early_kinds() for g in guests):
            return
        time.sleep(0.01)
    raise AssertionError("no standby run waits on the reused guest")


def pooled_round(capture: Capture, reuse: bool = False) -> dict[str, Any]:
    """One timed pooled (or reused) run: host marks (ms since Graph.arun's call) and guest
    steps (ms)."""
    use_executor("createos")
    ready(reuse)
    graph = chat_graph(reuse)
    capture.records.clear()
    started = time.monotonic()
    runs = asyncio.run(graph.arun([{"input_value": "hi"}]))
    returned = time.monotonic() - started
    assert runs[0].outputs[0].results["message"].text == "hi", runs
    deadline = time.monotonic() + 10  # a guest deleted after the run logs a second record
    while time.monotonic() < deadline and not any(
        n == "deleted" for r in capture.records for n, _ in r["marks"]
    ):
        time.sleep(0.005)
    run = next(r for r in capture.records if r["what"] == "ok")
    offset = run["started"] - started
    marks = {"execute": offset, "returned": returned}
    for record in capture.records:
        for name, at in record["marks"]:
            marks.setdefault(name, offset + at)
    return {
        "host_ms": {k: v * 1000 for k, v in marks.items()},
        "guest_ms": {k: v * 1000 for k, v in run["guest"].items()},
    }


def median_table(rounds: list[dict[str, Any]], field: str, order: list[str]) -> list[tuple[str, float, int]]:
    names = [n for n in order if any(n in r[field] for r in rounds)]
    names += [n for n in dict.fromkeys(n for r in rounds for n in r[field]) if n not in names]
    return [
        (
            n,
            statistics.median([r[field][n] for r in rounds if n in r[field]]),
            sum(n in r[field] for r in rounds),
        )
        for n in names
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--latency-ms", type=int, default=25, help="added to each request (S7: 25)")
    parser.add_argument("--boot-delay-ms", type=int, default=200, help="added to each boot (S7: 200)")
    parser.add_argument("--json", type=Path, help="write every round here")
    parser.add_argument("--reuse", action="store_true", help="S7's reused row (CREATEOS_EXECUTOR_REUSE)")
    args = parser.parse_args()

    capture = Capture()
    timeline_logger = logging.getLogger("langflow_sandbox_createos.executor.timeline")
    timeline_logger.setLevel(logging.DEBUG)
    timeline_logger.addHandler(capture)
    load_before = os.getloadavg()
    with LocalControlPlane(boot_delay_ms=0) as cp:
        os.environ.update(
            CREATEOS_SANDBOX_API_KEY=cp.api_key,
            CREATEOS_SANDBOX_BASE_URL=cp.url,
            CREATEOS_EXECUTOR_ROOTFS=TEMPLATE_NAME,
            CREATEOS_SANDBOX_ACCEPT_LOCAL_ISOLATION="true",
            CREATEOS_EXECUTOR_TIMEOUT_SECONDS="120",
            CREATEOS_EXECUTOR_WARM_POOL="0" if args.reuse else "1",
            CREATEOS_EXECUTOR_REUSE="true" if args.reuse else "false",
            LANGFLOW_DO_NOT_TRACK="true",
        )
        cp.set_faults({"latency_ms": args.latency_ms, "boot_delay_ms": args.boot_delay_ms, "rules": []})
        arun("in-process")  # imports
        arun("createos", args.reuse)  # registers the pool or starts the reused guest (cold)
        rounds, in_process = [], []
        for _ in range(args.rounds):
            in_process.append(arun("in-process") * 1000)
            rounds.append(pooled_round(capture, args.reuse))
        from langflow_sandbox_createos.executor import CreateOSExecutor

        CreateOSExecutor.shutdown()
        cp.wait_until_no_live(timeout=30.0)
    load_after = os.getloadavg()

    returned = [r["host_ms"]["returned"] for r in rounds]
    print(f"load average: {load_before[0]:.2f} before, {load_after[0]:.2f} after ({os.cpu_count()} cores)")
    print(
        f"Graph.arun, ms (median of {len(rounds)}): in-process {statistics.median(in_process):.1f}, "
        f"{'reused' if args.reuse else 'pooled'} {statistics.median(returned):.1f} ({min(returned):.1f}-{max(returned):.1f}), "
        f"over in-process {statistics.median(returned) - statistics.median(in_process):.1f}"
    )
    print("\nhost: ms since Graph.arun was called (median)")
    for name, value, count in sorted(
        median_table(rounds, "host_ms", list(HOST_STEPS)), key=lambda row: row[1]
    ):
        note = HOST_STEPS.get(name, "")
        print(f"  {name:>10} {value:8.1f}  {note}{'' if count == len(rounds) else f' ({count} rounds)'}")
    print("\nguest: ms per step, from its spec's arrival (median)")
    for name, value, _ in median_table(rounds, "guest_ms", []):
        print(f"  {name:>10} {value:8.1f}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {"load": [load_before, load_after], "in_process_ms": in_process, "rounds": rounds}, indent=1
            )
        )


if __name__ == "__main__":
    main()
