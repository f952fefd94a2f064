"""S8: one Langflow server (make run's script), its flows, and starting several side by side."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from s8_bed import Bed
from s8_common import (
    CHAT_SURFACES,
    GAVE_UP_LINE,
    IDLE_RATE_SECONDS,
    LAGMON,
    REUSE_IDLE_SECONDS,
    ROOT,
    RUN_LINE,
    SERVER_CPU,
    log,
    percentile,
    tests_importable,
    venv_langflow,
)
from s8_flows import prepare_flow, recipe, with_burn
from s8_proc import cpu_seconds, descendants, pin_tree, status_kib, tree_cpu_seconds

# --- the Langflow server ----------------------------------------------------------------------


def free_port() -> int:
    tests_importable()
    from e2e.conftest import free_port as free

    return free()


class Server:
    """One Langflow server: tests/e2e/conftest.py's LangflowServer (scripts/run-langflow.sh, auth
    on, a superuser), pointed at the confined createos-local, with the lag monitor injected."""

    def __init__(
        self, name: str, bed: Bed, scratch: Path, extra_env: dict[str, str], workers: int = 1, tag: str = ""
    ) -> None:
        tests_importable()
        from e2e.conftest import LangflowServer

        self.name = name
        self.bed = bed
        self.workers = workers
        run_dir = scratch / f"langflow-{tag}{'-' if tag else ''}{name}"
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
        if workers > 1:
            # `langflow run` reads LANGFLOW_WORKERS (run-langflow.sh passes no --workers), and
            # refuses more than one worker with its in-memory job queue unless told that the
            # server is driven through the API only (no canvas builds, no MCP over SSE): S8's case
            env["LANGFLOW_WORKERS"] = str(workers)
            env["LANGFLOW_DANGEROUSLY_ALLOW_MULTI_WORKER_WITHOUT_SHARED_QUEUE"] = "true"
        self.lf = LangflowServer(run_dir=run_dir, port=free_port(), extra_env=env)
        self.lf.reuse_idle_seconds = REUSE_IDLE_SECONDS
        self.worker_pids: list[int] = []
        self.langflow_pid: int | None = None
        self.api_key = ""
        self.flows: dict[str, str] = {}
        self.affinity: dict[str, Any] = {}
        self.idle_rate = (0.0, 0.0)  # CPU seconds per second when idle: worker, tree

    def start(self) -> None:
        if self.workers > 1:
            # Each gunicorn worker runs Langflow's database migrations as it starts; two on a
            # fresh SQLite database race, and one fails ("Online migration expected to match one
            # row"), which stops the server. So the database is made by one worker first.
            self.lf.extra_env["LANGFLOW_WORKERS"] = "1"
            self.lf.start()
            rc = self.lf.stop()
            if rc != 0:
                raise RuntimeError(f"the {self.name} server's one-worker start to make its database: rc {rc}")
            self.lf.extra_env["LANGFLOW_WORKERS"] = str(self.workers)
            self.lf.port = free_port()  # the first one's connections may hold its port a while
            self.lag_file.unlink(missing_ok=True)
        self.lf.start()
        self.langflow_pid = int((self.lf.run_dir / "langflow.pid").read_text())
        deadline = time.monotonic() + 30
        while len(self.worker_pids) < self.workers:  # each worker's lag monitor names it
            pids: set[int] = set()
            with contextlib.suppress(OSError):
                for line in self.lag_file.read_text().splitlines():
                    with contextlib.suppress(ValueError, KeyError):
                        pids.add(int(json.loads(line)["pid"]))
            self.worker_pids = sorted(pids)
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"lag samples from {len(pids)} of the {self.name} server's {self.workers} worker(s): "
                    "is the monitor installed?"
                )
            time.sleep(0.2)
        tree = descendants(self.langflow_pid)
        assert all(pid in tree for pid in self.worker_pids), (self.worker_pids, self.langflow_pid)
        log(f"{self.name} server up in {self.lf.start_seconds:.0f} s (worker pids {self.worker_pids})")

    def pin(self) -> None:
        assert self.lf.process is not None
        self.affinity = pin_tree(self.lf.process.pid, {SERVER_CPU})

    def prepare(self, surfaces: Sequence[str], flow: str = "chat", model_url: str = "") -> None:
        """An API key, and the flow of each surface built from this server's own catalog."""
        from langflow_sandbox_createos.starter import build_flow

        client = self.lf.client()
        self.api_key = client.create_api_key(f"s8-{self.name}")
        catalog = client.catalog()
        if flow == "work" and set(surfaces) & set(CHAT_SURFACES):
            catalog = with_burn(client, catalog)
        for surface in surfaces:
            built = prepare_flow(build_flow(catalog, recipe(surface, flow, model_url)), surface, flow)
            self.flows[surface] = client.create_flow(built)["id"]

    def cpu(self) -> tuple[float, float]:
        """CPU seconds so far: the workers' (summed), Langflow's whole process tree's."""
        assert self.worker_pids and self.langflow_pid
        return sum(cpu_seconds(pid) for pid in self.worker_pids), tree_cpu_seconds(self.langflow_pid)

    def rss_mib(self) -> float:
        """The workers' VmRSS, summed."""
        return sum((status_kib(pid, "VmRSS") or 0) for pid in self.worker_pids) / 1024

    def lag_samples(self, since: float, until: float) -> list[float]:
        out: list[float] = []
        with contextlib.suppress(OSError):
            for line in self.lag_file.read_text().splitlines():
                with contextlib.suppress(ValueError):
                    row = json.loads(line)
                    # a line holds the second before its time stamp
                    if since <= row["t"] - 0.5 <= until and row["pid"] in self.worker_pids:
                        out.extend(row["lag_ms"])
        return out

    def executor_runs(self, since: float, until: float) -> dict[str, Any]:
        """The executor's own line per run in langflow.log ("CreateOS executor: flow ... ran on
        guest ... in X s: ok"), for runs that ended between `since` and `until` (time.time()):
        how many, how they ended, how long each took inside the server (its wait in line
        included), which guests they ran on, and how many runs were told to wait in line."""
        ended: list[tuple[str, float]] = []
        guests: list[str] = []
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
                        ended.append((m["status"], float(m["took"])))
                        guests.append(m["guest"])
                    elif "waits in line" in row["event"]:
                        waited += 1
                    elif GAVE_UP_LINE.search(row["event"]):
                        gave_up += 1
        return summarize_runs(ended, guests, waited, gave_up)

    def log_tail(self, pattern: str, limit: int = 5) -> list[str]:
        text = (self.lf.run_dir / "langflow.log").read_text(errors="replace")
        return [line[:300] for line in text.splitlines() if re.search(pattern, line)][-limit:]

    def stop(self) -> int | None:
        rc = self.lf.stop()
        with contextlib.suppress(OSError):
            (self.lf.run_dir / "make-run-output.txt").write_text("".join(self.lf.output))
        return rc


def summarize_runs(
    ended: list[tuple[str, float]], guests: list[str], waited: int, gave_up: int
) -> dict[str, Any]:
    took = [t for _, t in ended]
    return {
        "ended": len(ended),
        "ok": sum(1 for status, _ in ended if status == "ok"),
        "waited_in_line": waited,
        "gave_up_in_line": gave_up,
        "took_s": {"p50": percentile(took, 0.5), "max": max(took, default=float("nan"))},
        "guests": guests,
        # raw pairs, so a fleet of servers can sum its servers' figures
        "_ended": ended,
    }


def plugin_reads(setting: str) -> bool:
    """Whether the plugin installed in .venv-langflow (what the servers run) names `setting`
    anywhere in its Python sources: a setting it never names, it cannot honour."""
    code = (
        "import pathlib, sys, langflow_sandbox_createos as p; "
        "root = pathlib.Path(p.__file__).parent; "
        "print(any(sys.argv[1] in f.read_text(errors='replace') for f in root.rglob('*.py')))"
    )
    py = str(venv_langflow() / "bin" / "python")
    done = subprocess.run([py, "-c", code, setting], capture_output=True, text=True, cwd="/", timeout=120)
    return done.stdout.strip() == "True"


@dataclass
class Fleet:
    """What one cell drives: one server (of one or more workers), or several servers side by
    side on the one bed, each with the flow's own copy (the load is dealt round them)."""

    topology: str  # "1x1": servers x workers each
    servers: list[Server]
    flow: str = "chat"
    # guest name prefixes that stay between cells by design (pools, reused guests)
    kept: tuple[str, ...] = ("lf-xw-", "lf-c-")

    @property
    def bed(self) -> Bed:
        return self.servers[0].bed

    @property
    def workers(self) -> int:
        return sum(s.workers for s in self.servers)

    @property
    def idle_rate(self) -> tuple[float, float]:
        return sum(s.idle_rate[0] for s in self.servers), sum(s.idle_rate[1] for s in self.servers)

    def cpu(self) -> tuple[float, float]:
        each = [s.cpu() for s in self.servers]
        return sum(w for w, _ in each), sum(t for _, t in each)

    def rss_mib(self) -> float:
        return sum(s.rss_mib() for s in self.servers)

    def lag_samples(self, since: float, until: float) -> list[float]:
        return [lag for s in self.servers for lag in s.lag_samples(since, until)]

    def executor_runs(self, since: float, until: float) -> dict[str, Any]:
        parts = [s.executor_runs(since, until) for s in self.servers]
        return summarize_runs(
            [pair for p in parts for pair in p["_ended"]],
            [g for p in parts for g in p["guests"]],
            sum(p["waited_in_line"] for p in parts),
            sum(p["gave_up_in_line"] for p in parts),
        )

    def log_tail(self, pattern: str, limit: int = 5) -> list[str]:
        return [line for s in self.servers for line in s.log_tail(pattern, limit)][-limit:]


@contextlib.contextmanager
def servers(
    bed: Bed, scratch: Path, wanted: dict[str, tuple[dict[str, str], int]], tag: str = ""
) -> Iterator[dict[str, Server]]:
    """Start the servers (name -> environment, workers) side by side (on both CPUs: start-up is
    not measured), then pin each whole process tree to SERVER_CPU; stop them all at the end.
    `tag` (the topology) keeps each start's run directories apart."""
    made = {name: Server(name, bed, scratch, env, workers, tag) for name, (env, workers) in wanted.items()}
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
                f"  {name}: idle CPU {s.idle_rate[0] * 100:.1f} % (worker{'s' if s.workers > 1 else ''}), "
                f"{s.idle_rate[1] * 100:.1f} % (tree)"
            )
        yield made
    finally:
        for s in made.values():
            rc = s.stop()
            log(f"{s.name} server stopped (rc {rc})")
