"""S8: a Langflow server under concurrent runs, each surface in turn, against createos-local.

    python benchmarks/server_bench.py [--quick] [--seconds N] [--concurrency 16,64]
                                      [--surfaces inprocess,executor,backend,component,component-reuse]

A real Langflow 1.13 server (``scripts/run-langflow.sh``, what ``make run`` starts, from
.venv-langflow) is driven over HTTP (``POST /api/v1/run``) by C concurrent callers that each
send the next run as soon as the last one answered, for N seconds per cell, with a 120 s
client timeout. Surfaces, each with its own flow:

  inprocess        Chat Input -> Chat Output, Langflow's own in-process executor (the reference)
  executor         the same flow, LANGFLOW_EXECUTOR_KIND=createos with a warm pool (own server)
  backend          Python Interpreter (print(6 * 7)) -> Chat Output, the sandbox backend
  component        CreateOS Sandbox (print(6 * 7)), Guest Reuse off -> Chat Output
  component-reuse  the same with Guest Reuse = flow

Per cell: throughput, latency p50/p95/p99, errors, the server process's CPU per run
(/proc utime+stime of the gunicorn worker, and of Langflow's whole process tree), its RSS
before and after (once idle), the event-loop lag inside the server (benchmarks/s8_lagmon/
sitecustomize.py on the server's PYTHONPATH: a 10 ms sleep on the server's loop, how late it
wakes), and the guests left on createos-local.

Confinement: createos-local (and so every guest, which inherits its affinity) runs on CPU 1,
Langflow on CPU 0 (started on both, then every thread of its process tree re-pinned and
checked); the load generator is a separate process under ``nice -n 5`` on either CPU. The
bed's own capacity, cold executor runs booted and run to their first vertex per second, is
measured in the same run with the same confinement.

Results: benchmarks/results/s8.json, s8.md, s8.png (and the S8 section of latest.md); raw
per-request records under benchmarks/results/raw/ (gitignored). Targets are reported, never
asserted. docs/performance.md ("S8") says what is measured and how.
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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from run import stop_on_sigterm
from s8_bed import Bed, by_prefix, capacity_worker, measure_capacity
from s8_cell import cell
from s8_common import (
    BED_CPU,
    CLIENT_TIMEOUT,
    EXECUTOR_MAX_GUESTS,
    EXECUTOR_POOL,
    RESULTS,
    SERVER_CPU,
    SURFACES,
    log,
    venv_langflow,
)
from s8_load import load_worker, warm_up
from s8_report import latest_section, verdicts, write_results  # noqa: F401  (report.py imports latest_section from here)
from s8_server import servers

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
    p.add_argument("--surfaces", default=",".join(SURFACES))
    p.add_argument("--capacity-runs", type=int, default=None, help="cold executor runs for the bed capacity")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--keep", action="store_true", help="keep the scratch directory (logs, databases)")
    p.add_argument(
        "--render", metavar="RAW_JSON", help="only write s8.md/s8.png/latest.md again from a raw result"
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
        write_results(doc, Path(args.out), plot=not args.no_plot)
        return 0

    surfaces = [s.strip() for s in args.surfaces.split(",") if s.strip()]
    unknown = set(surfaces) - set(SURFACES)
    if unknown:
        p.error(f"unknown surfaces: {sorted(unknown)}")
    levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
    seconds = args.seconds if args.seconds is not None else (5.0 if args.quick else 10.0)
    capacity_runs = args.capacity_runs if args.capacity_runs is not None else (3 if args.quick else 6)
    idle_timeout = 45.0 if seconds <= 15 else 300.0
    if os.cpu_count() is None or os.cpu_count() < 2:  # type: ignore[operator]
        p.error("S8 needs two CPUs (the server on one, the guests on the other)")
    if not (venv_langflow() / "bin" / "langflow").exists():
        p.error(f"{venv_langflow()} has no langflow: run `make langflow`")
    out = Path(args.out)
    started = time.monotonic()
    meta = machine() | versions()
    meta |= {
        "seconds": seconds,
        "quick": args.quick,
        "concurrency": levels,
        "client_timeout_s": CLIENT_TIMEOUT,
        "executor_max_guests": EXECUTOR_MAX_GUESTS,
        "confinement": (
            f"createos-local and its guests on CPU {BED_CPU} (sched_setaffinity before exec; guests inherit it), "
            f"the Langflow process tree on CPU {SERVER_CPU} (every thread re-pinned after start-up, checked), "
            "the load generator unpinned under nice -n 5"
        ),
    }
    scratch = Path(tempfile.mkdtemp(prefix="s8-"))
    log(f"S8: surfaces {surfaces} x in flight {levels}, {seconds:.0f} s per cell; scratch {scratch}")
    doc: dict[str, Any] = {"meta": meta, "cells": [], "notes": []}
    bed = Bed(scratch)
    bed.start()
    wanted: dict[str, dict[str, str]] = {}
    plain = [s for s in surfaces if s != "executor"]
    if plain:
        wanted["plain"] = {}
    if "executor" in surfaces:
        wanted["executor"] = {
            "EXECUTOR": "createos",
            "CREATEOS_EXECUTOR_WARM_POOL": str(EXECUTOR_POOL),
            "CREATEOS_EXECUTOR_MAX_GUESTS": str(EXECUTOR_MAX_GUESTS),
        }
    try:
        with servers(bed, scratch, wanted) as made:
            doc["meta"]["affinity"] = {name: s.affinity for name, s in made.items()}
            doc["meta"]["idle_cpu_per_s"] = {name: s.idle_rate for name, s in made.items()}
            for name, s in made.items():
                s.prepare(plain if name == "plain" else ["executor"])
            if "executor" in surfaces:
                doc["capacity"] = measure_capacity(bed, capacity_runs, 4, scratch)
                for sb in bed.live():
                    bed.delete(sb["id"])
            order = [
                s
                for s in ("inprocess", "backend", "component", "component-reuse", "executor")
                if s in surfaces
            ]
            for surface in order:
                server = made["executor" if surface == "executor" else "plain"]
                others = [o for o in made.values() if o is not server]
                log(f"{surface}: warm-up")
                warm = warm_up(server, surface, scratch)
                bad = [r for r in warm if "error" in r]
                if bad:
                    doc["notes"].append(
                        f"{surface}: warm-up run failed: {bad[0].get('error')}: {bad[0].get('detail')}"
                    )
                for conc in levels:
                    idle_cpu = [o.cpu()[1] for o in others]
                    t0 = time.monotonic()
                    c = cell(server, surface, conc, seconds, scratch, idle_timeout)
                    c["other_servers_cpu_s"] = round(
                        sum(o.cpu()[1] - cpu for o, cpu in zip(others, idle_cpu, strict=True)), 2
                    )
                    c["cell_wall_s"] = round(time.monotonic() - t0, 1)
                    doc["cells"].append(c)
                    if c["error_samples"]:
                        waits = server.log_tail(r"waits in line|timed out|Traceback|ERROR", 3)
                        if waits:
                            c["server_log"] = waits
            doc["rss_server_mib"] = {name: round(s.rss_mib(), 1) for name, s in made.items()}
        # the servers are stopped: what is left on the bed? A reused guest (lf-c-) stays by
        # design (make run's Ctrl-C reaps it); anything else was left behind.
        time.sleep(5)
        left = bed.live()
        doc["left_after_stop"] = by_prefix(left)
        unexpected = {p: n for p, n in by_prefix(left).items() if p != "lf-c-"}
        if unexpected:
            doc["notes"].append(
                f"guests still live 5 s after the servers stopped: {unexpected} (deleted by the harness)"
            )
        for sb in left:
            bed.delete(sb["id"])
    finally:
        bed.stop()
    doc["verdicts"] = verdicts(doc)
    meta["duration_s"] = round(time.monotonic() - started, 1)
    meta["loadavg_end"] = os.getloadavg()

    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (raw / f"s8-{stamp}.json").write_text(json.dumps(doc, indent=1))
    write_results(doc, out, plot=not args.no_plot)
    met = sum(1 for v in doc["verdicts"] if v["met"])
    log(f"done in {meta['duration_s']:.0f} s: {met}/{len(doc['verdicts'])} targets met; {out / 's8.md'}")
    if args.keep:
        log(f"scratch kept: {scratch}")
    else:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
