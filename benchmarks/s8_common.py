"""S8's shared constants and small helpers (benchmarks/server_bench.py and its s8_* modules)."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
LAGMON = HERE / "s8_lagmon"
SERVER_CPU = 0
BED_CPU = 1
CLIENT_TIMEOUT = 120.0
SURFACES = ("inprocess", "executor", "executor-reuse", "backend", "component", "component-reuse")
# what `--surfaces` runs unless told: executor-reuse only on request until the warm executor
# (CREATEOS_EXECUTOR_REUSE, issue 45) is in the plugin
DEFAULT_SURFACES = ("inprocess", "executor", "backend", "component", "component-reuse")
EXECUTOR_SURFACES = ("executor", "executor-reuse")
# the order the surfaces are measured in
ORDER = ("inprocess", "backend", "component", "component-reuse", "executor", "executor-reuse")
CHAT_SURFACES = ("inprocess", *EXECUTOR_SURFACES)  # the flow is Langflow's own components
# chat: Chat Input -> Chat Output (or a one-line program); work: ~50 ms of CPU and a model call
FLOWS = ("chat", "work")
REUSE_SETTING = "CREATEOS_EXECUTOR_REUSE"
EXECUTOR_POOL = 4
# CREATEOS_EXECUTOR_MAX_GUESTS for the executor's server: the bed's parallelism (its guests share
# one CPU: one guest boots while another finishes), as docs/executor.md tells operators to set it.
EXECUTOR_MAX_GUESTS = 2
IDLE_RATE_SECONDS = 10.0
REUSE_IDLE_SECONDS = 5  # the server's CREATEOS_SANDBOX_REUSE_IDLE_SECONDS: the reused guest goes after a cell
LATEST_BEGIN, LATEST_END = "<!-- S8 begin (benchmarks/server_bench.py) -->", "<!-- S8 end -->"
CLK_TCK = os.sysconf("SC_CLK_TCK")
RUN_LINE = re.compile(
    r"CreateOS executor: flow \S+ ran on guest (?P<guest>\S+).* in (?P<took>[0-9.]+) s: (?P<status>\w+)"
)
# the executor's own WARNING for a run that left the line at its deadline (Langflow's error log
# repeats the exception's text, without the flow)
GAVE_UP_LINE = re.compile(r"gave up at CREATEOS_EXECUTOR_MAX_WAIT_SECONDS\..*\(flow [^)]*\)\s*$")


def log(msg: str) -> None:
    print(f"[s8 {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def venv_langflow() -> Path:
    return (ROOT / os.environ.get("VENV_LANGFLOW", ".venv-langflow")).absolute()


def tests_importable() -> None:
    """tests/ and this checkout first on sys.path: S8 drives Langflow with the e2e suite's own
    LangflowServer (tests/e2e/conftest.py) and calls its model server (tests/e2e/model_server.py)."""
    for path in (str(ROOT / "tests"), str(ROOT)):
        if path not in sys.path:
            sys.path.insert(0, path)


from run import percentile  # noqa: E402,F401  (benchmarks/run.py, S1-S7's own)
