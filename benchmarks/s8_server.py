"""S8: one Langflow server (make run's script), its flows, and starting several side by side."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from s8_bed import Bed
from s8_common import (
    CODE,
    GAVE_UP_LINE,
    IDLE_RATE_SECONDS,
    LAGMON,
    REUSE_IDLE_SECONDS,
    ROOT,
    RUN_LINE,
    SERVER_CPU,
    log,
    percentile,
    venv_langflow,
)
from s8_proc import cpu_seconds, descendants, pin_tree, status_kib, tree_cpu_seconds

# --- the Langflow server ----------------------------------------------------------------------


def recipe(surface: str) -> dict[str, Any]:
    """A flow recipe for langflow_sandbox_createos.starter.build_flow (built from the server's
    own catalog, as make run builds the starter flow)."""
    out = {"id": "ChatOutput-s8o01", "component": "ChatOutput", "values": {}}
    if surface in ("inprocess", "executor"):
        nodes = [{"id": "ChatInput-s8i01", "component": "ChatInput", "values": {}}, out]
        edges = [
            {"source": "ChatInput-s8i01", "output": "message", "target": out["id"], "field": "input_value"}
        ]
    elif surface == "backend":
        node = {
            "id": "PythonREPLComponent-s8b01",
            "component": "PythonREPLComponent",
            "values": {"global_imports": "math", "python_code": CODE},
        }
        nodes = [node, out]
        edges = [{"source": node["id"], "output": "results", "target": out["id"], "field": "input_value"}]
    else:
        node = {
            "id": "CreateOSSandbox-s8c01",
            "component": "CreateOSSandboxComponent",
            "values": {
                "python_code": CODE,
                "session_mode": "flow" if surface == "component-reuse" else "off",
            },
        }
        nodes = [node, out]
        edges = [{"source": node["id"], "output": "results", "target": out["id"], "field": "input_value"}]
    return {"name": f"s8 {surface}", "description": "S8 benchmark flow", "nodes": nodes, "edges": edges}


class Server:
    """One Langflow server: tests/e2e/conftest.py's LangflowServer (scripts/run-langflow.sh, auth
    on, a superuser), pointed at the confined createos-local, with the lag monitor injected."""

    def __init__(self, name: str, bed: Bed, scratch: Path, extra_env: dict[str, str]) -> None:
        for path in (str(ROOT / "tests"), str(ROOT)):  # this checkout's package first
            if path not in sys.path:
                sys.path.insert(0, path)
        from e2e.conftest import LangflowServer, free_port

        self.name = name
        self.bed = bed
        run_dir = scratch / f"langflow-{name}"
        run_dir.mkdir(parents=True)
        self.lag_file = run_dir / "lag.jsonl"
        env = {
            "CREATEOS_SANDBOX_BASE_URL": bed.url,
            "CREATEOS_SANDBOX_API_KEY": bed.api_key,
            "CREATEOS_SANDBOX_ACCEPT_LOCAL_ISOLATION": "true",
            "LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS": "true",
            "CREATEOS_EXECUTOR_ROOTFS": "langflow-lfx",
            "PYTHONPATH": str(LAGMON),
            "S8_LAG_FILE": str(self.lag_file),
            # run-langflow.sh takes it relative to the checkout
            "VENV_LANGFLOW": os.path.relpath(venv_langflow(), ROOT),
            **extra_env,
        }
        self.lf = LangflowServer(run_dir=run_dir, port=free_port(), extra_env=env)
        self.lf.reuse_idle_seconds = REUSE_IDLE_SECONDS
        self.worker_pid: int | None = None
        self.langflow_pid: int | None = None
        self.api_key = ""
        self.flows: dict[str, str] = {}
        self.affinity: dict[str, Any] = {}
        self.idle_rate = (0.0, 0.0)  # CPU seconds per second when idle: worker, tree

    def start(self) -> None:
        self.lf.start()
        self.langflow_pid = int((self.lf.run_dir / "langflow.pid").read_text())
        deadline = time.monotonic() + 30
        while self.worker_pid is None:
            with contextlib.suppress(OSError, ValueError, IndexError):
                self.worker_pid = json.loads(self.lag_file.read_text().splitlines()[0])["pid"]
            if time.monotonic() > deadline:
                raise RuntimeError(f"no lag samples from the {self.name} server: is the monitor installed?")
            time.sleep(0.2)
        assert self.worker_pid in descendants(self.langflow_pid), (self.worker_pid, self.langflow_pid)
        log(f"{self.name} server up in {self.lf.start_seconds:.0f} s (worker pid {self.worker_pid})")

    def pin(self) -> None:
        assert self.lf.process is not None
        self.affinity = pin_tree(self.lf.process.pid, {SERVER_CPU})

    def prepare(self, surfaces: Sequence[str]) -> None:
        from langflow_sandbox_createos.starter import build_flow

        client = self.lf.client()
        self.api_key = client.create_api_key(f"s8-{self.name}")
        catalog = client.catalog()
        for surface in surfaces:
            self.flows[surface] = client.create_flow(build_flow(catalog, recipe(surface)))["id"]

    def cpu(self) -> tuple[float, float]:
        assert self.worker_pid and self.langflow_pid
        return cpu_seconds(self.worker_pid), tree_cpu_seconds(self.langflow_pid)

    def rss_mib(self) -> float:
        assert self.worker_pid
        return (status_kib(self.worker_pid, "VmRSS") or 0) / 1024

    def lag_samples(self, since: float, until: float) -> list[float]:
        out: list[float] = []
        with contextlib.suppress(OSError):
            for line in self.lag_file.read_text().splitlines():
                with contextlib.suppress(ValueError):
                    row = json.loads(line)
                    # a line holds the second before its time stamp
                    if since <= row["t"] - 0.5 <= until and row["pid"] == self.worker_pid:
                        out.extend(row["lag_ms"])
        return out

    def executor_runs(self, since: float, until: float) -> dict[str, Any]:
        """The executor's own line per run in langflow.log ("CreateOS executor: flow ... ran on
        guest ... in X s: ok"), for runs that ended between `since` and `until` (time.time()):
        how many, how they ended, how long each took inside the server (its wait in line
        included), and how many runs were told to wait in line."""
        ended: list[tuple[str, float]] = []
        waited = gave_up = 0
        with contextlib.suppress(OSError):
            for line in (self.lf.run_dir / "langflow.log").read_text(errors="replace").splitlines():
                if "CreateOS executor: " not in line or not line.startswith("{"):
                    continue
                with contextlib.suppress(ValueError, KeyError):
                    row = json.loads(line)
                    stamp = dt.datetime.fromisoformat(row["timestamp"].replace("Z", "+00:00")).timestamp()
                    if not since <= stamp <= until:
                        continue
                    if m := RUN_LINE.search(row["event"]):
                        ended.append((m.group(2), float(m.group(1))))
                    elif "waits in line" in row["event"]:
                        waited += 1
                    elif GAVE_UP_LINE.search(row["event"]):
                        gave_up += 1
        took = [t for _, t in ended]
        return {
            "ended": len(ended),
            "ok": sum(1 for status, _ in ended if status == "ok"),
            "waited_in_line": waited,
            "gave_up_in_line": gave_up,
            "took_s": {"p50": percentile(took, 0.5), "max": max(took, default=float("nan"))},
        }

    def log_tail(self, pattern: str, limit: int = 5) -> list[str]:
        text = (self.lf.run_dir / "langflow.log").read_text(errors="replace")
        return [line[:300] for line in text.splitlines() if re.search(pattern, line)][-limit:]

    def stop(self) -> int | None:
        rc = self.lf.stop()
        with contextlib.suppress(OSError):
            (self.lf.run_dir / "make-run-output.txt").write_text("".join(self.lf.output))
        return rc


@contextlib.contextmanager
def servers(bed: Bed, scratch: Path, wanted: dict[str, dict[str, str]]) -> Iterator[dict[str, Server]]:
    """Start the servers side by side (on both CPUs: start-up is not measured), then pin each
    whole process tree to SERVER_CPU; stop them all at the end."""
    made = {name: Server(name, bed, scratch, env) for name, env in wanted.items()}
    errors: list[BaseException] = []

    def start(s: Server) -> None:
        try:
            s.start()
        except BaseException as exc:
            errors.append(exc)

    try:
        log(f"starting Langflow ({', '.join(made)}) from {venv_langflow()}")
        ts = [threading.Thread(target=start, args=(s,)) for s in made.values()]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        if errors:
            raise errors[0]
        for s in made.values():
            s.pin()
            log(f"  {s.name}: pinned to CPU {SERVER_CPU}: {s.affinity}")
        # each server's CPU when nothing runs (the lag monitor's 100 wake-ups a second included)
        before = {name: (s.cpu(), time.monotonic()) for name, s in made.items()}
        time.sleep(IDLE_RATE_SECONDS)
        for name, s in made.items():
            (w0, t0), began = before[name]
            w1, t1 = s.cpu()
            span = time.monotonic() - began
            s.idle_rate = ((w1 - w0) / span, (t1 - t0) / span)
            log(
                f"  {name}: idle CPU {s.idle_rate[0] * 100:.1f} % (worker), {s.idle_rate[1] * 100:.1f} % (tree)"
            )
        yield made
    finally:
        for s in made.values():
            rc = s.stop()
            log(f"{s.name} server stopped (rc {rc})")
