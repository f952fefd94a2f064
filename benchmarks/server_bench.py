"""S8: Langflow servers under concurrent runs, each surface in turn, against createos-local.

    python benchmarks/server_bench.py [--quick] [--seconds N] [--concurrency 16,64]
        [--surfaces inprocess,executor,executor-reuse,backend,component,component-reuse]
        [--flow chat|work] [--workers 2] [--servers 2] [--name NAME]

A real Langflow 1.13 server (``scripts/run-langflow.sh``, what ``make run`` starts, from
.venv-langflow) is driven over HTTP (``POST /api/v1/run``) by C concurrent callers that each
send the next run as soon as the last one answered, for N seconds per cell, with a 120 s
client timeout. Surfaces, each with its own flow (benchmarks/s8_flows.py):

  inprocess        Chat Input -> Chat Output, Langflow's own in-process executor (the reference)
  executor         the same flow, LANGFLOW_EXECUTOR_KIND=createos with a warm pool (own server)
  executor-reuse   the same with CREATEOS_EXECUTOR_REUSE=true (own server; only when asked for,
                   and measured only if the server honours the setting: --measure-ignored)
  backend          Python Interpreter (print(6 * 7)) -> Chat Output, the sandbox backend
  component        CreateOS Sandbox (print(6 * 7)), Guest Reuse off -> Chat Output
  component-reuse  the same with Guest Reuse = flow

``--flow work`` gives every surface a flow that does real work instead: about 50 ms of CPU and a
call to an OpenAI-compatible model server of the bench's own in a network namespace.
``--workers 2`` also measures one server of two gunicorn workers, ``--servers 2`` two servers
side by side on the one createos-local (benchmarks/s8_phase.py), beside the one-worker cells.

Per cell: throughput, latency p50/p95/p99, errors (timeouts apart from answered refusals), the
server's CPU per run (/proc utime+stime of the gunicorn worker(s), and of Langflow's whole
process tree), its RSS before and after (once idle), the event-loop lag inside the server
(benchmarks/s8_lagmon/sitecustomize.py on the server's PYTHONPATH: a 10 ms sleep on the
server's loop, how late it wakes), and the guests left on createos-local.

Confinement: createos-local (and so every guest, which inherits its affinity) runs on CPU 1,
Langflow on CPU 0 (started on both, then every thread of its process tree re-pinned and
checked); the load generator is a separate process under ``nice -n 5`` on either CPU. The
bed's own capacity, cold executor runs booted and run to their first vertex per second, is
measured in the same run with the same confinement.

Results: benchmarks/results/NAME.json, NAME.md, NAME.png (NAME s8 for the chat flow, with the S8
section of latest.md; s8-work for the work flow); raw per-request records under
benchmarks/results/raw/ (gitignored). Targets are reported, never asserted. docs/performance.md
("S8") says what is measured and how.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from run import stop_on_sigterm
from s8_bed import Bed, capacity_worker
from s8_common import (
    BED_CPU,
    CLIENT_TIMEOUT,
    DEFAULT_SURFACES,
    EXECUTOR_MAX_GUESTS,
    FLOWS,
    RESULTS,
    REUSE_SETTING,
    SERVER_CPU,
    SURFACES,
    log,
    tests_importable,
    venv_langflow,
)
from s8_load import load_worker
from s8_phase import Run, phase
from s8_report import latest_section, verdicts, write_results  # noqa: F401  (report.py imports latest_section from here)

# --- main ------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "host": f"{platform.system()} {platform.release()} ({platform.machine()})",
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30), 1),
        "loadavg_start": os.getloadavg(),
    }


def versions() -> dict[str, str]:
    py = str(venv_langflow() / "bin" / "python")
    code = (
        "import importlib.metadata as m, json; "
        "print(json.dumps({n: m.version(n) for n in ('langflow', 'lfx', 'langflow-sandbox-createos')}))"
    )
    with contextlib.suppress(Exception):
        v = json.loads(
            subprocess.run([py, "-c", code], capture_output=True, text=True, check=True, cwd="/").stdout
        )
        return {"langflow": v["langflow"], "lfx": v["lfx"], "plugin": v["langflow-sandbox-createos"]}
    return {}


def main(argv: Sequence[str] | None = None) -> int:
    stop_on_sigterm()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--quick", action="store_true", help="smoke test: 5 s cells, 3 capacity runs (not a result)"
    )
    p.add_argument("--seconds", type=float, default=None, help="seconds per cell (default 10; quick 5)")
    p.add_argument("--concurrency", default="16,64")
    p.add_argument(
        "--surfaces",
        default=",".join(DEFAULT_SURFACES),
        help=f"any of {', '.join(SURFACES)} (default: all but executor-reuse)",
    )
    p.add_argument(
        "--flow",
        choices=FLOWS,
        default="chat",
        help="chat: S8's two-vertex flows; work: ~50 ms of CPU and a model call per run (s8_flows.py)",
    )
    p.add_argument(
        "--workers", type=int, default=1, help="also measure one server of this many gunicorn workers"
    )
    p.add_argument(
        "--servers", type=int, default=1, help="also measure this many servers side by side on the one bed"
    )
    p.add_argument(
        "--measure-ignored",
        action="store_true",
        help=f"measure executor-reuse even when the servers ignore {REUSE_SETTING} (labelled so)",
    )
    p.add_argument("--capacity-runs", type=int, default=None, help="cold executor runs for the bed capacity")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument(
        "--name",
        default=None,
        help="result files NAME.json/.md/.png (default s8 for the chat flow, s8-work for the work flow); "
        "only s8 updates latest.md's S8 block",
    )
    p.add_argument("--keep", action="store_true", help="keep the scratch directory (logs, databases)")
    p.add_argument(
        "--render", metavar="RAW_JSON", help="only write the results again from a raw result (with --name)"
    )
    p.add_argument("--load-worker", help=argparse.SUPPRESS)
    p.add_argument("--capacity-worker", help=argparse.SUPPRESS)
    p.add_argument("--capacity-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.load_worker:
        load_worker(args.load_worker)
        return 0
    if args.capacity_worker:
        runs, conc = (int(x) for x in args.capacity_worker.split(","))
        capacity_worker(runs, conc, args.capacity_out)
        return 0
    if args.render:
        doc = json.loads(Path(args.render).read_text())
        doc["verdicts"] = verdicts(doc)
        name = args.name or result_name(doc["meta"].get("flow", "chat"))
        write_results(doc, Path(args.out), plot=not args.no_plot, name=name)
        return 0

    surfaces = [s.strip() for s in args.surfaces.split(",") if s.strip()]
    unknown = set(surfaces) - set(SURFACES)
    if unknown:
        p.error(f"unknown surfaces: {sorted(unknown)}")
    topologies = ["1x1"]
    if args.workers > 1:
        topologies.append(f"1x{args.workers}")
    if args.servers > 1:
        topologies.append(f"{args.servers}x1")
    levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
    seconds = args.seconds if args.seconds is not None else (5.0 if args.quick else 10.0)
    capacity_runs = args.capacity_runs if args.capacity_runs is not None else (3 if args.quick else 6)
    idle_timeout = 45.0 if seconds <= 15 else 300.0
    if os.cpu_count() is None or os.cpu_count() < 2:  # type: ignore[operator]
        p.error("S8 needs two CPUs (the server on one, the guests on the other)")
    if not (venv_langflow() / "bin" / "langflow").exists():
        p.error(f"{venv_langflow()} has no langflow: run `make langflow`")
    out = Path(args.out)
    name = args.name or result_name(args.flow)
    started = time.monotonic()
    meta = machine() | versions()
    meta |= {
        "seconds": seconds,
        "quick": args.quick,
        "concurrency": levels,
        "flow": args.flow,
        "topologies": topologies,
        "surfaces": surfaces,
        "client_timeout_s": CLIENT_TIMEOUT,
        "executor_max_guests": EXECUTOR_MAX_GUESTS,
        "confinement": (
            f"createos-local and its guests on CPU {BED_CPU} (sched_setaffinity before exec; guests inherit it), "
            f"every Langflow process tree on CPU {SERVER_CPU} (every thread re-pinned after start-up, checked), "
            "the load generator unpinned under nice -n 5"
        ),
    }
    scratch = Path(tempfile.mkdtemp(prefix="s8-"))
    log(
        f"S8: {args.flow} flow, surfaces {surfaces} x in flight {levels} x topologies {topologies}, "
        f"{seconds:.0f} s per cell; scratch {scratch}"
    )
    doc: dict[str, Any] = {"meta": meta, "cells": [], "notes": []}
    bed = Bed(scratch)
    bed.start()
    try:
        with contextlib.ExitStack() as stack:
            model = stack.enter_context(model_server()) if args.flow == "work" else None
            if model is not None:
                meta["model_server"] = model.base_url
            run = Run(
                bed,
                scratch,
                surfaces,
                levels,
                seconds,
                idle_timeout,
                capacity_runs,
                args.flow,
                model,
                args.measure_ignored,
                doc,
            )
            for topology in topologies:
                phase(run, topology)
    finally:
        bed.stop()
    doc["verdicts"] = verdicts(doc)
    meta["duration_s"] = round(time.monotonic() - started, 1)
    meta["loadavg_end"] = os.getloadavg()

    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (raw / f"{name}-{stamp}.json").write_text(json.dumps(doc, indent=1))
    write_results(doc, out, plot=not args.no_plot, name=name)
    met = sum(1 for v in doc["verdicts"] if v["met"])
    log(
        f"done in {meta['duration_s']:.0f} s: {met}/{len(doc['verdicts'])} targets met; {out / (name + '.md')}"
    )
    if args.keep:
        log(f"scratch kept: {scratch}")
    else:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


def result_name(flow: str) -> str:
    return "s8" if flow == "chat" else f"s8-{flow}"


@contextlib.contextmanager
def model_server() -> Iterator[Any]:
    """The work flow's model: tests/e2e/model_server.py's OpenAI-compatible server, on a test host
    in a network namespace of its own (`NamespaceHost`), served from this process."""
    tests_importable()
    from e2e.model_server import ModelServer

    with ModelServer() as model:
        log(f"model server at {model.base_url}")
        yield model


if __name__ == "__main__":
    sys.exit(main())
