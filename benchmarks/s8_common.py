"""S8's shared constants and small helpers (benchmarks/server_bench.py and its s8_* modules)."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
LAGMON = HERE / "s8_lagmon"
SERVER_CPU = 0
BED_CPU = 1
CLIENT_TIMEOUT = 120.0
SURFACES = ("inprocess", "executor", "backend", "component", "component-reuse")
EXECUTOR_POOL = 4
# CREATEOS_EXECUTOR_MAX_GUESTS for the executor's server: the bed's parallelism (its guests share
# one CPU: one guest boots while another finishes), as docs/executor.md tells operators to set it.
EXECUTOR_MAX_GUESTS = 2
IDLE_RATE_SECONDS = 10.0
REUSE_IDLE_SECONDS = 5  # the server's CREATEOS_SANDBOX_REUSE_IDLE_SECONDS: the reused guest goes after a cell
CODE = "print(6 * 7)"
LATEST_BEGIN, LATEST_END = "<!-- S8 begin (benchmarks/server_bench.py) -->", "<!-- S8 end -->"
CLK_TCK = os.sysconf("SC_CLK_TCK")
RUN_LINE = re.compile(r"CreateOS executor: flow \S+ ran on guest .* in ([0-9.]+) s: (\w+)")
# the executor's own WARNING for a run that left the line at its deadline (Langflow's error log
# repeats the exception's text, without the flow)
GAVE_UP_LINE = re.compile(r"gave up at CREATEOS_EXECUTOR_MAX_WAIT_SECONDS\..*\(flow [^)]*\)\s*$")


def log(msg: str) -> None:
    print(f"[s8 {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def venv_langflow() -> Path:
    return (ROOT / os.environ.get("VENV_LANGFLOW", ".venv-langflow")).absolute()


from run import percentile  # noqa: E402,F401  (benchmarks/run.py, S1-S7's own)
