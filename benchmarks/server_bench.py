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
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

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


# --- statistics ------------------------------------------------------------------------------


from run import percentile, stop_on_sigterm  # noqa: E402  (benchmarks/run.py, S1-S7's own)

# --- /proc -----------------------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw.rsplit(") ", 1)[1].split()  # fields from 3 (state) on


def cpu_seconds(pid: int, children: bool = True) -> float:
    """utime + stime (+ cutime + cstime: children it has reaped) of one process, in seconds."""
    f = _stat_fields(pid)
    if f is None:
        return 0.0
    ticks = int(f[11]) + int(f[12])  # utime, stime (fields 14, 15)
    if children:
        ticks += int(f[13]) + int(f[14])  # cutime, cstime
    return ticks / CLK_TCK


def children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        f = _stat_fields(int(entry))
        if f is not None:
            kids.setdefault(int(f[1]), []).append(int(entry))
    return kids


def descendants(root: int) -> list[int]:
    kids = children_map()
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, []))
    return out


def tree_cpu_seconds(root: int) -> float:
    """The whole tree's CPU: each live process's own and reaped children's time (a process that
    ended inside the tree moved its time into its parent's cutime when it was reaped)."""
    return sum(cpu_seconds(pid) for pid in descendants(root))


def status_kib(pid: int, field: str) -> int | None:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


def threads(pid: int) -> list[int]:
    with contextlib.suppress(OSError):
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    return []


def on_cpu(cpu: int, argv: list[str]) -> list[str]:
    """`argv` confined to one CPU from its start (taskset execs it: the pid is argv's own)."""
    return ["taskset", "-c", str(cpu), *argv]


def pin_tree(root: int, cpus: set[int]) -> dict[str, Any]:
    """Every thread of every process under `root` onto `cpus` (threads and processes made later
    inherit it from their creator), twice to catch any made during the first pass; then check."""
    for _ in range(2):
        for pid in descendants(root):
            for tid in threads(pid):
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(tid, cpus)
    return check_affinity(root, cpus)


def check_affinity(root: int, cpus: set[int]) -> dict[str, Any]:
    procs, tids, wrong = 0, 0, []
    for pid in descendants(root):
        procs += 1
        for tid in threads(pid):
            tids += 1
            with contextlib.suppress(OSError):
                if os.sched_getaffinity(tid) != cpus:
                    wrong.append(tid)
    return {"cpus": sorted(cpus), "processes": procs, "threads": tids, "not_pinned": len(wrong)}


class CpuBusy:
    """Busy fraction of one CPU between two reads of /proc/stat."""

    def __init__(self, cpu: int) -> None:
        self.cpu = cpu
        self.last = self._read()

    def _read(self) -> tuple[int, int]:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith(f"cpu{self.cpu} "):
                v = [int(x) for x in line.split()[1:]]
                idle = v[3] + v[4]
                return sum(v) - idle, sum(v)
        return 0, 0

    def busy(self) -> float:
        now = self._read()
        d_busy, d_all = now[0] - self.last[0], now[1] - self.last[1]
        self.last = now
        return d_busy / d_all if d_all else 0.0


# --- createos-local, confined ----------------------------------------------------------------


class Bed:
    """createos-local from .venv-langflow (as make run starts it), pinned to BED_CPU with every
    guest it starts (children inherit the affinity; createos-local sets no cpuset)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.api_key = secrets.token_urlsafe(18)
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self) -> None:
        port_file = self.run_dir / "createos-local.port"
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("CREATEOS_", "LANGFLOW_", "PYTHON")) and k != "VIRTUAL_ENV"
        }
        env["CREATEOS_LOCAL_API_KEY"] = self.api_key
        argv = [str(venv_langflow() / "bin" / "createos-local"), "--host", "127.0.0.1", "--port", "0"]
        argv += ["--state-dir", str(self.run_dir / "createos-local"), "--port-file", str(port_file)]
        with open(self.run_dir / "createos-local.log", "wb") as out:
            self.process = subprocess.Popen(
                on_cpu(BED_CPU, argv),
                cwd=self.run_dir,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text().strip():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    "createos-local did not start:\n" + (self.run_dir / "createos-local.log").read_text()
                )
            time.sleep(0.1)
        self.url = f"http://127.0.0.1:{int(port_file.read_text())}"

    def request(self, method: str, path: str, timeout: float = 30.0) -> Any:
        req = urllib.request.Request(f"{self.url}{path}", method=method, headers={"X-Api-Key": self.api_key})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read() or b"null")

    def stats(self) -> dict[str, Any]:
        return self.request("GET", "/_local/stats")

    def live(self) -> list[dict[str, Any]]:
        return [sb for sb in self.stats()["sandboxes"] if sb["status"] not in ("destroyed", "failed")]

    def delete(self, sandbox_id: str) -> None:
        with contextlib.suppress(Exception):
            self.request("DELETE", f"/v1/sandboxes/{sandbox_id}")

    def stop(self) -> None:
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            proc.wait(5)


def by_prefix(sandboxes: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for sb in sandboxes:
        name = sb.get("name") or ""
        key = name.rsplit("-", 1)[0] + "-" if "-" in name else (name or "(unnamed)")
        counts[key] = counts.get(key, 0) + 1
    return counts


# --- the bed's capacity (runs in .venv-langflow's Python) ------------------------------------


def capacity_worker(runs: int, concurrency: int, out: str) -> None:
    """Cold executor runs (no pool) of Chat Input -> Chat Output straight through
    CreateOSExecutor, `concurrency` at a time, after one untimed run: when each reached its
    first vertex result and its RunComplete."""
    import asyncio

    from lfx.components.input_output import ChatInput, ChatOutput
    from lfx.execution.types import RunComplete, Unit
    from lfx.graph import Graph

    from langflow_sandbox_createos.executor import CreateOSExecutor

    def graph() -> Any:
        chat_in = ChatInput(_id="chat-in")
        chat_out = ChatOutput(_id="chat-out")
        chat_out.set(input_value=chat_in.message_response)
        return Graph(chat_in, chat_out)

    async def one(i: int, gate: asyncio.Semaphore, t0: float) -> dict[str, Any]:
        async with gate:
            rec: dict[str, Any] = {"start": time.monotonic() - t0}
            try:
                unit = Unit(graph=graph(), runtime_options={"initial_inputs": {"input_value": f"cap-{i}"}})
                async for item in CreateOSExecutor().execute(unit):
                    kind = type(getattr(item, "payload", None)).__name__
                    if "first_vertex" not in rec and kind in ("RemoteVertexResult", "VertexBuildResult"):
                        rec["first_vertex"] = time.monotonic() - t0
                    if isinstance(item, RunComplete):
                        rec["complete"] = time.monotonic() - t0
            except Exception as exc:
                rec["error"] = f"{type(exc).__name__}: {exc}"[:300]
            rec["end"] = time.monotonic() - t0
            return rec

    async def main() -> dict[str, Any]:
        warm = await one(-1, asyncio.Semaphore(1), time.monotonic())
        gate = asyncio.Semaphore(concurrency)
        t0 = time.monotonic()
        recs = await asyncio.gather(*(one(i, gate, t0) for i in range(runs)))
        return {"warmup": warm, "runs": list(recs), "wall": time.monotonic() - t0}

    result = asyncio.run(main())
    Path(out).write_text(json.dumps(result))


def measure_capacity(bed: Bed, runs: int, concurrency: int, scratch: Path) -> dict[str, Any]:
    log(f"bed capacity: {runs} cold executor runs (pool off), {concurrency} at a time, on CPU {BED_CPU}")
    out = scratch / "capacity.json"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CREATEOS_", "LANGFLOW_", "PYTHON")) and k != "VIRTUAL_ENV"
    }
    env.update(
        CREATEOS_SANDBOX_BASE_URL=bed.url,
        CREATEOS_SANDBOX_API_KEY=bed.api_key,
        CREATEOS_SANDBOX_ACCEPT_LOCAL_ISOLATION="true",
        LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS="true",
        CREATEOS_EXECUTOR_ROOTFS="langflow-lfx",
        CREATEOS_EXECUTOR_WARM_POOL="0",
        DO_NOT_TRACK="true",
        LANGFLOW_DO_NOT_TRACK="true",
    )
    argv = [str(venv_langflow() / "bin" / "python"), str(Path(__file__).resolve())]
    argv += ["--capacity-worker", f"{runs},{concurrency}", "--capacity-out", str(out)]
    with open(scratch / "capacity.log", "wb") as errlog:
        subprocess.run(
            on_cpu(SERVER_CPU, argv),
            cwd=scratch,  # never the checkout: the worker must import the installed plugin
            env=env,
            stdout=errlog,
            stderr=subprocess.STDOUT,
            check=True,
            timeout=900,
        )
    raw = json.loads(out.read_text())
    recs = raw["runs"]
    firsts = [r["first_vertex"] for r in recs if "first_vertex" in r]
    errors = [r["error"] for r in recs if "error" in r]
    per_run = [r["first_vertex"] - r["start"] for r in recs if "first_vertex" in r]
    result = {
        "runs": runs,
        "concurrency": concurrency,
        "errors": len(errors),
        "error_samples": errors[:3],
        # guests booted and run to the first vertex, per second of the whole batch
        "guests_per_s": len(firsts) / max(firsts) if firsts else 0.0,
        "complete_per_s": len([r for r in recs if "complete" in r]) / raw["wall"],
        "first_vertex_s": {"p50": percentile(per_run, 0.5), "max": max(per_run, default=float("nan"))},
        "warmup_first_vertex_s": raw["warmup"].get("first_vertex"),
        "wall_s": raw["wall"],
    }
    log(
        f"  capacity {result['guests_per_s']:.3f} guests/s to the first vertex "
        f"(each {result['first_vertex_s']['p50']:.1f} s median), {len(errors)} errors"
    )
    return result


# --- the load generator (a separate process under nice -n 5, the dev venv's httpx) ----------


def expected(surface: str) -> Callable[[dict[str, Any], str], str | None]:
    """A check of one answer: None when it is right, else what is wrong."""

    def text_of(answer: dict[str, Any]) -> str:
        return answer["outputs"][0]["outputs"][0]["results"]["message"]["text"]

    def block(text: str) -> dict[str, Any]:
        return json.loads(text.strip().removeprefix("```json").removesuffix("```"))

    def chat(answer: dict[str, Any], sent: str) -> str | None:
        text = text_of(answer)
        return None if text == sent else f"answer {text[:80]!r} for input {sent!r}"

    def code(answer: dict[str, Any], _sent: str) -> str | None:
        data = block(text_of(answer))
        if str(data.get("result", "")).strip() != "42" or data.get("error") or data.get("exit_code", 0) != 0:
            return f"unexpected result {json.dumps(data)[:200]}"
        return None

    return chat if surface in ("inprocess", "executor") else code


def load_worker(spec_path: str) -> None:
    import asyncio

    import httpx

    spec = json.loads(Path(spec_path).read_text())
    check = expected(spec["surface"])
    url = f"{spec['url']}/api/v1/run/{spec['flow_id']}?stream=false"
    headers = {"x-api-key": spec["api_key"], "Content-Type": "application/json"}
    records: list[dict[str, Any]] = []
    counter = iter(range(1_000_000))

    async def caller(client: httpx.AsyncClient, t0: float, stop_at: float) -> None:
        budget = spec.get("runs")  # a fixed number of runs per caller (warm-up) instead of seconds
        while (budget is None and time.monotonic() < stop_at) or (budget is not None and budget > 0):
            if budget is not None:
                budget -= 1
            n = next(counter)
            sent = f"s8-{spec['tag']}-{n}"
            body = {"input_value": sent, "input_type": "chat", "output_type": "chat", "session_id": sent}
            rec: dict[str, Any] = {"n": n, "start": time.monotonic() - t0}
            try:
                resp = await asyncio.wait_for(client.post(url, json=body, headers=headers), CLIENT_TIMEOUT)
                rec["status"] = resp.status_code
                if resp.status_code != 200:
                    rec["error"] = f"HTTP {resp.status_code}"
                    rec["detail"] = resp.text[:400]
                else:
                    answer = resp.json()
                    try:
                        wrong = check(answer, sent)
                    except Exception as exc:
                        wrong = f"unreadable answer ({type(exc).__name__}: {exc})"
                    if wrong:
                        rec["error"] = "wrong answer"
                        rec["detail"] = wrong[:400]
                    else:
                        with contextlib.suppress(Exception):
                            data = json.loads(
                                answer["outputs"][0]["outputs"][0]["results"]["message"]["text"]
                                .strip()
                                .removeprefix("```json")
                                .removesuffix("```")
                            )
                            rec["guest"] = data.get("sandbox_id")
                            rec["reused"] = data.get("reused_guest")
            except asyncio.TimeoutError:
                rec["error"] = "timeout"
                rec["detail"] = f"no answer within {CLIENT_TIMEOUT:.0f} s"
            except Exception as exc:
                rec["error"] = type(exc).__name__
                rec["detail"] = str(exc)[:400]
            rec["end"] = time.monotonic() - t0
            rec["latency"] = rec["end"] - rec["start"]
            records.append(rec)

    async def main() -> float:
        limits = httpx.Limits(
            max_connections=spec["concurrency"], max_keepalive_connections=spec["concurrency"]
        )
        async with httpx.AsyncClient(limits=limits, timeout=CLIENT_TIMEOUT + 10) as client:
            print("ready", flush=True)
            sys.stdin.readline()  # go
            t0 = time.monotonic()
            print(f"started {time.time()}", flush=True)
            stop_at = t0 + spec["seconds"]
            await asyncio.gather(*(caller(client, t0, stop_at) for _ in range(spec["concurrency"])))
            return time.monotonic() - t0

    wall = asyncio.run(main())
    Path(spec["out"]).write_text(json.dumps({"records": records, "wall": wall}))
    print("done", flush=True)


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


# --- one cell ------------------------------------------------------------------------------


def wait_idle(server: Server, timeout: float, pool: int = 0) -> dict[str, Any]:
    """Until the server's worker is quiet (< 5 % of a CPU over 1 s, its idle rate is about 4 %),
    createos-local's process tree with its guests is quiet (< 10 %), and no guest of the runs
    is left but the executor's pool (`pool` of them, all up) and the component's reused guest
    (kept by design). CPU 1's own busy figure would not do: other work on this machine may run
    there too. Returns what was seen last."""
    started = time.monotonic()
    bed_pid = server.bed.process.pid if server.bed.process else 0
    last_worker, last_bed = server.cpu()[0], tree_cpu_seconds(bed_pid)
    quiet_for = 0
    seen: dict[str, Any] = {}
    while True:
        time.sleep(1.0)
        now_worker, now_bed = server.cpu()[0], tree_cpu_seconds(bed_pid)
        worker, bed = now_worker - last_worker, now_bed - last_bed
        last_worker, last_bed = now_worker, now_bed
        prefixes = by_prefix(server.bed.live())
        runs_left = sum(n for p, n in prefixes.items() if p not in ("lf-xw-", "lf-c-"))
        pool_ok = prefixes.get("lf-xw-", 0) >= pool
        seen = {"worker_cpu": round(worker, 3), "bed_cpu": round(bed, 3), "live": prefixes}
        quiet = worker < 0.05 and bed < 0.10 and runs_left == 0 and pool_ok
        quiet_for = quiet_for + 1 if quiet else 0
        if quiet_for >= 2:
            seen["idle"] = True
            break
        if time.monotonic() - started > timeout:
            seen["idle"] = False
            break
    seen["waited_s"] = round(time.monotonic() - started, 1)
    if not seen["idle"]:
        log(f"  not idle after {seen['waited_s']:.0f} s: {seen}")
    return seen


def run_load(
    server: Server,
    surface: str,
    concurrency: int,
    seconds: float,
    scratch: Path,
    tag: str,
    runs: int | None = None,
) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """The load generator, started and waiting for "go" (its imports are done by then)."""
    spec = {
        "url": server.lf.url,
        "api_key": server.api_key,
        "flow_id": server.flows[surface],
        "surface": surface,
        "concurrency": concurrency,
        "seconds": seconds,
        "runs": runs,
        "tag": tag,
        "out": str(scratch / f"load-{tag}.json"),
    }
    spec_path = scratch / f"load-{tag}.spec.json"
    spec_path.write_text(json.dumps(spec))
    proc = subprocess.Popen(
        ["nice", "-n", "5", sys.executable, str(Path(__file__).resolve()), "--load-worker", str(spec_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=scratch,
    )
    assert proc.stdin and proc.stdout
    assert proc.stdout.readline().strip() == "ready"
    return proc, spec


def warm_up(server: Server, surface: str, scratch: Path, runs: int = 2) -> list[dict[str, Any]]:
    """`runs` runs one after the other (imports, caches, the executor's pool registered)."""
    proc, spec = run_load(server, surface, 1, 0.0, scratch, f"{surface}-warmup", runs=runs)
    assert proc.stdin
    proc.stdin.write("go\n")
    proc.stdin.flush()
    proc.communicate(timeout=runs * (CLIENT_TIMEOUT + 10) + 30)
    return json.loads(Path(spec["out"]).read_text())["records"]


class RssSampler(threading.Thread):
    def __init__(self, server: Server) -> None:
        super().__init__(daemon=True)
        self.server = server
        self.peak = 0.0
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.wait(0.5):
            self.peak = max(self.peak, self.server.rss_mib())


def cell(
    server: Server, surface: str, concurrency: int, seconds: float, scratch: Path, idle_timeout: float
) -> dict[str, Any]:
    tag = f"{surface}-{concurrency}"
    pool = EXECUTOR_POOL if surface == "executor" else 0
    before_idle = wait_idle(server, idle_timeout, pool)
    rss_before = server.rss_mib()
    proc, spec = run_load(server, surface, concurrency, seconds, scratch, tag)
    assert proc.stdin and proc.stdout
    bed_pid = server.bed.process.pid if server.bed.process else 0
    cpu0 = server.cpu()
    bed0 = tree_cpu_seconds(bed_pid)
    sampler = RssSampler(server)
    sampler.start()
    bed_busy = CpuBusy(BED_CPU)
    server_busy = CpuBusy(SERVER_CPU)
    t_go, t_go_wall = time.monotonic(), time.time()
    proc.stdin.write("go\n")
    proc.stdin.flush()
    t_start = float(proc.stdout.readline().split()[1])
    # the bed's affinity, checked once while guests run
    time.sleep(min(seconds / 2, 5.0))
    bed_affinity = check_affinity(server.bed.process.pid, {BED_CPU}) if server.bed.process else {}
    proc.communicate(timeout=seconds + CLIENT_TIMEOUT + 120)
    t_end = time.time()
    cpu1 = server.cpu()
    busy = {"server_cpu": round(server_busy.busy(), 2), "bed_cpu": round(bed_busy.busy(), 2)}
    raw = json.loads(Path(spec["out"]).read_text())
    after_idle = wait_idle(server, idle_timeout, pool)
    cpu2 = server.cpu()
    t_idle, t_idle_wall = time.monotonic(), time.time()
    bed2 = tree_cpu_seconds(bed_pid)
    sampler.stop_event.set()
    rss_after = server.rss_mib()
    records = raw["records"]
    ok = [r for r in records if "error" not in r]
    errors: dict[str, int] = {}
    for r in records:
        if "error" in r:
            errors[r["error"]] = errors.get(r["error"], 0) + 1
    lat = [r["latency"] for r in ok]
    in_window = [r for r in ok if r["end"] <= seconds]
    lags = server.lag_samples(t_start, t_end)
    sent = len(records)
    # runs the server finished in the cell's time (for the executor, from its own log: a run a
    # client gave up on still runs to its end), the denominator of the CPU per run
    server_side = server.executor_runs(t_go_wall, t_idle_wall) if surface == "executor" else None
    runs = server_side["ended"] if server_side else sent
    result = {
        "surface": surface,
        "concurrency": concurrency,
        "seconds": seconds,
        "sent": sent,
        "ok": len(ok),
        "errors": sum(errors.values()),
        "error_kinds": errors,
        "error_samples": [
            {k: r.get(k) for k in ("error", "detail", "latency")} for r in records if "error" in r
        ][:5],
        # runs answered right per second, from the first run sent to the last answer: the callers
        # hold C in flight for the cell's seconds, then the last C drain, so in a steady state
        # this is the service rate (Little: C runs in flight / latency) however long a run takes
        "throughput": len(ok) / raw["wall"] if raw["wall"] else 0.0,
        # only the runs answered within the cell's seconds, per second of the cell
        "throughput_window": len(in_window) / seconds,
        "wall_s": raw["wall"],
        "latency_s": {q: percentile(lat, v) for q, v in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))}
        | {"max": max(lat, default=float("nan"))},
        "cpu_per_run_ms": {
            # the gunicorn worker from the first run sent until it and the bed were idle again,
            # less its idle rate (measured before the cells) over that time, per run sent
            "worker": (cpu2[0] - cpu0[0] - server.idle_rate[0] * (t_idle - t_go)) / max(runs, 1) * 1000,
            # the same for Langflow's whole process tree (langflow run, gunicorn, worker, any children)
            "tree": (cpu2[1] - cpu0[1] - server.idle_rate[1] * (t_idle - t_go)) / max(runs, 1) * 1000,
            # the worker, gross (idle rate included)
            "worker_gross": (cpu2[0] - cpu0[0]) / max(runs, 1) * 1000,
            "worker_until_last_answer": (cpu1[0] - cpu0[0]) / max(sent, 1) * 1000,
            # createos-local with its guests (what the bed spent per run)
            "bed": (bed2 - bed0) / max(runs, 1) * 1000,
            "runs": runs,
        },
        # both idle waits ended idle: nothing of another cell ran during this one
        "clean": bool(before_idle.get("idle") and after_idle.get("idle")),
        "server_side": server_side,
        "lag_ms": {
            "n": len(lags),
            "p50": percentile(lags, 0.5),
            "p99": percentile(lags, 0.99),
            "max": max(lags, default=float("nan")),
        },
        "rss_mib": {
            "before": round(rss_before, 1),
            "after": round(rss_after, 1),
            "delta": round(rss_after - rss_before, 1),
            "peak": round(max(sampler.peak, rss_before, rss_after), 1),
        },
        "cpu_busy": busy,
        "idle_before": before_idle,
        "idle_after": after_idle,
        "bed_affinity": bed_affinity,
        "guests": sorted({r["guest"] for r in ok if r.get("guest")}),
        "reused_runs": sum(1 for r in ok if r.get("reused")),
        "latencies": [round(x, 3) for x in lat],
    }
    if surface.startswith("component"):
        result["distinct_guests"] = len(result.pop("guests"))
    else:
        result.pop("guests")
    log(
        f"  {tag}: {result['throughput']:.2f} runs/s, p50 {result['latency_s']['p50']:.2f} s "
        f"p99 {result['latency_s']['p99']:.2f} s, {result['errors']}/{sent} errors {errors or ''}, "
        f"CPU {result['cpu_per_run_ms']['worker']:.0f} ms/run, lag p99 {result['lag_ms']['p99']:.1f} ms, "
        f"RSS {rss_before:.0f}->{rss_after:.0f} MiB, idle after: {after_idle}"
    )
    return result


# --- targets -------------------------------------------------------------------------------


def verdicts(doc: dict[str, Any]) -> list[dict[str, Any]]:
    cells = {(c["surface"], c["concurrency"]): c for c in doc["cells"]}
    capacity = doc.get("capacity", {}).get("guests_per_s")
    out: list[dict[str, Any]] = []

    def add(surface: str, conc: int, what: str, value: str, met: bool | None) -> None:
        out.append({"surface": surface, "concurrency": conc, "target": what, "value": value, "met": met})

    for (surface, conc), c in sorted(cells.items()):
        ref = cells.get(("inprocess", conc))
        if surface == "executor":
            add(
                surface,
                conc,
                "0 errors (120 s client timeout)",
                f"{c['errors']}/{c['sent']}",
                c["errors"] == 0,
            )
            if capacity:
                ratio = c["throughput"] / capacity
                add(
                    surface,
                    conc,
                    "throughput >= 0.8 x bed capacity",
                    f"{c['throughput']:.3f} / {capacity:.3f} = {ratio:.2f}",
                    ratio >= 0.8,
                )
            if ref:
                mine, theirs = c["cpu_per_run_ms"]["worker"], ref["cpu_per_run_ms"]["worker"]
                add(
                    surface,
                    conc,
                    "server CPU/run <= in-process CPU/run",
                    f"{mine:.0f} vs {theirs:.0f} ms"
                    + ("" if c.get("clean") else " (server not idle around the cell)"),
                    mine <= theirs,
                )
        if surface != "inprocess":
            lag = c["lag_ms"]["p99"]
            ref_lag = ref["lag_ms"]["p99"] if ref else float("nan")
            within = lag <= 50 and (ref is None or lag <= 2 * max(ref_lag, 1e-9))
            add(
                surface,
                conc,
                "lag p99 <= 50 ms and <= 2x in-process",
                f"{lag:.1f} ms (in-process {ref_lag:.1f} ms)",
                within,
            )
            add(
                surface,
                conc,
                "RSS back within 32 MiB",
                f"{c['rss_mib']['delta']:+.1f} MiB"
                + ("" if c["idle_after"].get("idle") else " (measured before the server was idle)"),
                c["rss_mib"]["delta"] <= 32,
            )
    return out


# --- report ----------------------------------------------------------------------------------


def _s(v: float) -> str:
    if v != v:
        return "n/a"
    return f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s"


def table(doc: dict[str, Any]) -> list[str]:
    lines = [
        "| Surface | In flight | Runs/s | p50 | p95 | p99 | Errors | Server CPU/run (worker; tree) | Lag p99 (max) | RSS before → after |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in doc["cells"]:
        lat, cpu, lag, rss = c["latency_s"], c["cpu_per_run_ms"], c["lag_ms"], c["rss_mib"]
        errs = f"{c['errors']}/{c['sent']}"
        if c["error_kinds"]:
            errs += " (" + ", ".join(f"{k}: {n}" for k, n in c["error_kinds"].items()) + ")"
        lines.append(
            f"| {c['surface']} | {c['concurrency']} | {c['throughput']:.2f} | {_s(lat['p50'])} | {_s(lat['p95'])} | "
            f"{_s(lat['p99'])} | {errs} | {cpu['worker']:.0f} ms; {cpu['tree']:.0f} ms | "
            f"{lag['p99']:.1f} ms ({lag['max']:.0f}) | {rss['before']:.0f} → {rss['after']:.0f} MiB "
            f"({rss['delta']:+.1f}) |"
        )
    return lines


def detail_lines(doc: dict[str, Any]) -> list[str]:
    lines = [
        "| Surface | In flight | Idle before / after | Runs/s in the cell's seconds | Runs the server ended (ok), "
        "time inside it p50 / max | CPU/run gross (worker) | CPU 0 busy (the worker's share) | Bed CPU/run "
        "| Lag p50 | RSS peak | Guests |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in doc["cells"]:
        side = c.get("server_side")
        if side:
            ended = (
                f"{side['ended']} ({side['ok']}), {_s(side['took_s']['p50'])} / {_s(side['took_s']['max'])}; "
                f"{side['waited_in_line']} waited in line, {side.get('gave_up_in_line', 0)} gave up there"
            )
        else:
            ended = f"{c['cpu_per_run_ms']['runs']} (answers)"
        before, after = c["idle_before"], c["idle_after"]
        idle = " / ".join(
            ("yes" if w.get("idle") else f"**no** ({w.get('waited_s', 0):.0f} s: {w.get('live')})")
            for w in (before, after)
        )
        guests = f"{c['distinct_guests']} distinct" if "distinct_guests" in c else ""
        if c.get("reused_runs"):
            guests += f", {c['reused_runs']} runs on a reused guest"
        # until the last answer: the worker's CPU seconds per second of wall time, against CPU 0's
        worker_share = c["cpu_per_run_ms"]["worker_until_last_answer"] * c["sent"] / 1000 / c["wall_s"]
        lines.append(
            f"| {c['surface']} | {c['concurrency']} | {idle} | {c['throughput_window']:.2f} | {ended} | "
            f"{c['cpu_per_run_ms']['worker_gross']:.0f} ms | {c['cpu_busy']['server_cpu']:.0%} "
            f"({worker_share:.0%}) | {c['cpu_per_run_ms']['bed']:.0f} ms | "
            f"{c['lag_ms']['p50']:.1f} ms | {c['rss_mib']['peak']:.0f} MiB | {guests} |"
        )
    return lines


def target_lines(doc: dict[str, Any]) -> list[str]:
    lines = ["| Surface | In flight | Target | Measured | Met? |", "|---|---|---|---|---|"]
    for v in doc["verdicts"]:
        mark = "yes" if v["met"] else "**no**"
        lines.append(f"| {v['surface']} | {v['concurrency']} | {v['target']} | {v['value']} | {mark} |")
    return lines


def render_markdown(doc: dict[str, Any]) -> str:
    meta, cap = doc["meta"], doc.get("capacity") or {}
    lines = [
        "# S8: a Langflow server under concurrent runs",
        "",
        "Generated by `benchmarks/server_bench.py` (`make bench` runs it short, `make bench-server` long).",
        "Each cell holds C runs in flight through `POST /api/v1/run` for the cell's seconds (120 s client",
        "timeout), then lets the last C drain. See docs/performance.md (S8) for the method.",
        "",
        "| | |",
        "|---|---|",
        f"| Date | {meta['date']} |",
        f"| Machine | {meta['host']}, {meta['cpus']} CPUs, {meta['mem_gib']} GiB RAM, {meta['cpu']} |",
        f"| Load average (start → end) | {', '.join(f'{x:.1f}' for x in meta['loadavg_start'])} → "
        f"{', '.join(f'{x:.1f}' for x in meta.get('loadavg_end', ()))} |",
        f"| Langflow | {meta.get('langflow', '?')} with langflow-sandbox-createos {meta.get('plugin', '?')} "
        f"(.venv-langflow), one gunicorn worker |",
        f"| Confinement | {meta['confinement']} |",
        f"| Cell | {meta['seconds']:.0f} s per cell; executor warm pool {EXECUTOR_POOL}, "
        f"CREATEOS_EXECUTOR_MAX_GUESTS={meta.get('executor_max_guests', 8)}, "
        f"CREATEOS_EXECUTOR_MAX_WAIT_SECONDS default (120) |",
        f"| Duration | {meta.get('duration_s', 0):.0f} s{' (quick: not a result)' if meta.get('quick') else ''} |",
        "",
    ]
    if cap:
        lines += [
            f"**Bed capacity**: {cap['guests_per_s']:.3f} guests/s booted and run to the first vertex "
            f"({cap['runs']} cold executor runs of Chat Input → Chat Output through `CreateOSExecutor`, "
            f"{cap['concurrency']} at a time, no pool; each took {_s(cap['first_vertex_s']['p50'])} median "
            f"to its first vertex; {cap['errors']} errors).",
            "",
        ]
    lines += [
        *table(doc),
        "",
        "Runs/s: runs answered right per second from the first run sent to the last answer (the last C",
        "runs drain after the cell's seconds). Server CPU/run: utime+stime of the gunicorn worker (and of",
        "Langflow's whole process tree) from the first run sent until the server and the bed were idle",
        "again, less the server's idle rate over that time, per run the server ended (the executor's",
        "own log line per run; a run whose caller timed out still runs to its end). Lag: how late a",
        "10 ms sleep on the server's event loop woke up, over the cell. RSS: the worker's VmRSS before",
        "the cell and once idle after it.",
        "",
        *detail_lines(doc),
        "",
        "Targets (reported, not asserted):",
        "",
        *target_lines(doc),
    ]
    notes = doc.get("notes") or []
    if notes:
        lines += ["", "Observed:", ""] + [f"- {n}" for n in notes]
    lines.append("")
    return "\n".join(lines)


def write_results(doc: dict[str, Any], out: Path, plot: bool = True) -> None:
    """s8.json (without the per-run latencies), s8.md, s8.png and latest.md's S8 block."""
    summary = json.loads(json.dumps(doc))
    for c in summary["cells"]:
        c.pop("latencies", None)
    (out / "s8.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "s8.md").write_text(render_markdown(summary))
    if plot:
        render_plot(doc, out / "s8.png")
    update_latest(out)


def latest_section(results: Path = RESULTS) -> str:
    """The S8 block of latest.md (benchmarks/report.py adds it when s8.json exists)."""
    path = results / "s8.json"
    if not path.exists():
        return ""
    doc = json.loads(path.read_text())
    cap = doc.get("capacity") or {}
    met = sum(1 for v in doc["verdicts"] if v["met"])
    lines = [
        LATEST_BEGIN,
        "",
        f"## S8: a Langflow server under concurrent runs ({doc['meta']['date']})",
        "",
        f"From `benchmarks/server_bench.py` ([s8.md](s8.md), [s8.png](s8.png)); bed capacity "
        f"{cap.get('guests_per_s', float('nan')):.3f} guests/s; {met} of {len(doc['verdicts'])} targets met.",
        "",
        *table(doc),
        "",
        LATEST_END,
    ]
    return "\n".join(lines)


def update_latest(results: Path) -> None:
    latest = results / "latest.md"
    if not latest.exists():
        return
    text = latest.read_text()
    section = latest_section(results)
    if LATEST_BEGIN in text and LATEST_END in text:
        head, rest = text.split(LATEST_BEGIN, 1)
        tail = rest.split(LATEST_END, 1)[1]
        text = head + section + tail
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    latest.write_text(text)


def render_plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {
        "inprocess": "#555555",
        "executor": "#d9534f",
        "backend": "#2e7dd1",
        "component": "#2e9e5b",
        "component-reuse": "#e0a030",
    }
    fig, (ax_lat, ax_tp) = plt.subplots(1, 2, figsize=(13, 5.2), dpi=110)
    for surface in SURFACES:
        cs = sorted((c for c in doc["cells"] if c["surface"] == surface), key=lambda c: c["concurrency"])
        if not cs:
            continue
        xs = [c["concurrency"] for c in cs]
        col = colors[surface]
        for q, style in (("p50", "-"), ("p95", "--"), ("p99", ":")):
            ax_lat.plot(
                xs,
                [c["latency_s"][q] for c in cs],
                style,
                color=col,
                marker="o",
                label=f"{surface} {q}" if q == "p50" else None,
            )
        for c in cs:
            if c["errors"]:
                ax_lat.annotate(
                    f"{c['errors']}/{c['sent']} failed",
                    (c["concurrency"], c["latency_s"]["p99"]),
                    fontsize=8,
                    color=col,
                )
        ax_tp.plot(xs, [c["throughput"] for c in cs], "-", color=col, marker="o", label=surface)
    cap = (doc.get("capacity") or {}).get("guests_per_s")
    if cap:
        ax_tp.axhline(cap, color="#d9534f", linestyle="--", linewidth=1)
        ax_tp.axhline(0.8 * cap, color="#d9534f", linestyle=":", linewidth=1)
        ax_tp.text(
            ax_tp.get_xlim()[0], cap, f" bed capacity {cap:.2f}/s (dotted: 0.8x)", fontsize=8, va="bottom"
        )
    ax_lat.axhline(CLIENT_TIMEOUT, color="black", linewidth=0.8, linestyle="-.")
    ax_lat.set_yscale("log")
    ax_lat.set_xscale("log", base=2)
    ax_tp.set_xscale("log", base=2)
    ax_tp.set_yscale("log")
    for ax in (ax_lat, ax_tp):
        ticks = sorted({c["concurrency"] for c in doc["cells"]})
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(t) for t in ticks])
        ax.set_xlabel("runs in flight")
        ax.grid(alpha=0.25, which="both")
    ax_lat.set_ylabel(
        "latency of the runs answered right, s\n(solid p50, dashed p95, dotted p99; -. 120 s timeout)"
    )
    ax_tp.set_ylabel("runs/s answered right")
    ax_lat.legend(fontsize=8, loc="lower right")
    ax_tp.legend(fontsize=8, loc="center right")
    meta = doc["meta"]
    fig.suptitle(
        f"S8: Langflow {meta.get('langflow', '')} + createos-local, latency and throughput vs runs in flight "
        f"({meta['date']}, {meta['cpus']} CPUs; server on CPU {SERVER_CPU}, guests on CPU {BED_CPU})",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


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
