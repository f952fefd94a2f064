"""Side-by-side benchmark: this plugin ("ours") against langflow-sandbox-createos 0.2.0 ("peer").

    make bench                       # the one entry point (builds the peer venv if missing)
    .venv/bin/python benchmarks/run.py [--quick] [--only S1,S2] [--no-plot] [--ours-root WORKTREE]

One createos-local serves both plugins. Each plugin runs in its own long-lived worker
process (benchmarks/worker.py under its own venv: the two distributions share an import
name), and the scenarios interleave them A B A B ... so drift of this machine (other jobs,
thermal, page cache) lands on both. Results: benchmarks/results/latest.md, latest.png and
raw JSON under benchmarks/results/raw/ (gitignored).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from langflow_sandbox_createos.local.images import TEMPLATE_NAME  # noqa: E402
from langflow_sandbox_createos.local.testing import LocalControlPlane  # noqa: E402

PEER_VERSION = "0.2.0"
PEER_VENV = HERE / ".peer-venv"
RESULTS = HERE / "results"
WORKER = HERE / "worker.py"
LOGS = RESULTS / "raw" / "logs"
API_KEY = "bench-key"

S1_FAULTS = {"latency_ms": 25, "boot_delay_ms": 200}
S3_FAULTS = {"latency_ms": 0, "boot_delay_ms": 50}
NO_FAULTS = {"latency_ms": 0, "boot_delay_ms": 0}


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --- the peer's environment ----------------------------------------------------------------


def ensure_peer_venv() -> Path:
    """benchmarks/.peer-venv with langflow-sandbox-createos==0.2.0 from PyPI (never into ours)."""
    python = PEER_VENV / "bin" / "python"
    stamp = PEER_VENV / f".installed-{PEER_VERSION}"
    if stamp.exists() and python.exists():
        return python
    log(
        f"building {PEER_VENV.relative_to(ROOT)} (langflow-sandbox-createos=={PEER_VERSION} from PyPI, ~1 min)"
    )
    if PEER_VENV.exists():
        shutil.rmtree(PEER_VENV)
    base = getattr(sys, "_base_executable", None) or shutil.which("python3") or sys.executable
    subprocess.run([base, "-m", "venv", str(PEER_VENV)], check=True)
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            f"langflow-sandbox-createos=={PEER_VERSION}",
        ],
        check=True,
    )
    stamp.touch()
    return python


# --- workers ---------------------------------------------------------------------------------


class Worker:
    """A worker process speaking JSON lines. cwd is a scratch dir, so a checkout on sys.path
    can never shadow the plugin its venv has installed."""

    def __init__(self, name: str, python: Path | str, env: dict[str, str], cwd: str) -> None:
        self.name = name
        LOGS.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [str(python), str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(LOGS / f"{name}.stderr.log", "ab"),  # noqa: SIM115 - lives with the process
            env=env,
            cwd=cwd,
            text=True,
            bufsize=1,
        )

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.name} died (rc={self.proc.poll()}); see its stderr log")
        answer = json.loads(line)
        if not answer.pop("ok"):
            raise RuntimeError(f"{self.name} {op} failed: {answer['error']}\n{answer.get('trace', '')}")
        return answer

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(Exception):
                self.call("shutdown")
            assert self.proc.stdin
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def worker_env(cp: LocalControlPlane) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CREATEOS_", "LANGFLOW_", "PYTHON")) and k not in ("VIRTUAL_ENV",)
    }
    env.update(
        {
            "CREATEOS_SANDBOX_BASE_URL": cp.url,
            "CREATEOS_SANDBOX_API_KEY": cp.api_key,
            "LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS": "true",
            "CREATEOS_SANDBOX_ACCEPT_LOCAL_ISOLATION": "true",  # createos-local
            "LANGFLOW_SANDBOX_TIMEOUT_SECONDS": "30",
            "CREATEOS_EXECUTOR_TIMEOUT_SECONDS": "120",
            "CREATEOS_EXECUTOR_ROOTFS": TEMPLATE_NAME,  # devbox:1 has no lfx
            "CREATEOS_SANDBOX_WARM_POOL": "0",
            "LANGFLOW_DO_NOT_TRACK": "true",
            "DO_NOT_TRACK": "true",
        }
    )
    return env


def ours_env(env: dict[str, str], root: Path) -> dict[str, str]:
    """Our worker's environment: `root`'s package first on sys.path, ahead of the editable
    install in .venv, so a worktree's copy (with its in-place build) is what runs."""
    return {**env, "PYTHONPATH": str(root)}


# --- statistics ------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    data = sorted(values)
    if not data:
        return float("nan")
    pos = (len(data) - 1) * q
    lo, hi = int(pos), min(int(pos) + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def summary(values: Sequence[float]) -> dict[str, Any]:
    return {
        "n": len(values),
        "median": percentile(values, 0.5),
        "p10": percentile(values, 0.1),
        "p90": percentile(values, 0.9),
        "samples": list(values),
    }


class S2Floor:
    """S2's floor: benchmarks/s2_floor.c, a one-thread libcurl client with no Python, replaying
    the create and exec bodies our backend sends (and the delete) on one kept-alive
    connection. What the three requests of a backend run cost any libcurl client here."""

    def __init__(self, wire: dict[str, Any], cp: LocalControlPlane) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="s2-floor-")
        self.dir = Path(self._tmp.name)
        self.binary = self.dir / "s2_floor"
        cc = os.environ.get("CC", "cc")
        subprocess.run(
            [cc, "-O2", "-o", str(self.binary), str(HERE / "s2_floor.c"), "-lcurl", "-ljansson"],
            check=True,
        )
        (self.dir / "create.json").write_text(json.dumps(wire["create"]))
        (self.dir / "exec.json").write_text(json.dumps(wire["exec"], separators=(",", ":")))
        self.cp = cp

    def sample(self, runs: int) -> float:
        """One process, `runs` measured runs (after its warm-up): CPU per run in ms."""
        out = subprocess.run(
            [
                str(self.binary),
                self.cp.url,
                str(self.dir / "create.json"),
                str(self.dir / "exec.json"),
                str(runs),
            ],
            env={**os.environ, "CREATEOS_SANDBOX_API_KEY": self.cp.api_key},
            capture_output=True,
            text=True,
            check=True,
        )
        return float(json.loads(out.stdout)["cpu_per_run"]) * 1000

    def close(self) -> None:
        self._tmp.cleanup()


def interleave(
    n: int, a: Callable[[], float | None], b: Callable[[], float | None]
) -> tuple[list[float], list[float]]:
    """A B A B ...: n samples of each."""
    xs: list[float] = []
    ys: list[float] = []
    for _ in range(n):
        x = a()
        if x is not None:
            xs.append(x)
        y = b()
        if y is not None:
            ys.append(y)
    return xs, ys


# --- scenarios -------------------------------------------------------------------------------


class Bench:
    def __init__(self, cp: LocalControlPlane, ours: Worker, peer: Worker, quick: bool) -> None:
        self.cp = cp
        self.w = {"ours": ours, "peer": peer}
        self.quick = quick
        self.results: dict[str, Any] = {}

    def n(self, full: int, quick: int) -> int:
        return quick if self.quick else full

    def faults(self, faults: dict[str, Any]) -> None:
        self.cp.set_faults({**faults, "rules": []})

    def settle(self) -> None:
        """Between scenarios: nothing left running from the previous one."""
        left = self.cp.wait_until_no_live(timeout=30.0)
        for sb in left:
            if sb["status"] != "destroying":
                self.cp.delete_sandbox(sb["id"])
        self.cp.wait_until_no_live(timeout=30.0)

    def record(self, key: str, ours: Sequence[float], peer: Sequence[float], **extra: Any) -> None:
        o, p = summary(ours), summary(peer)
        self.results[key] = {
            "ours": o,
            "peer": p,
            "ratio": o["median"] / p["median"] if p["median"] else None,
            **extra,
        }
        log(
            f"{key}: ours {o['median']:.4g} [{o['p10']:.4g}, {o['p90']:.4g}]  peer {p['median']:.4g} "
            f"[{p['p10']:.4g}, {p['p90']:.4g}]  ratio {self.results[key]['ratio']:.3f}"
        )

    def backend_latency(self, name: str, pool_ready: bool) -> float:
        r = self.w[name].call("run", code="print(1)", pool_ready=pool_ready)
        assert r["exit_code"] == 0 and r["stdout"] == "1\n", r
        return r["wall"]

    def s1(self) -> None:
        log("S1: print(1) through the backend, 25 ms per request + 200 ms boot")
        self.settle()
        self.faults(S1_FAULTS)
        trials = self.n(15, 4)
        for name in self.w:  # warm: connections, preflight, catalog
            self.backend_latency(name, False)
        floor_guest = self.floor_guest()
        floors: list[float] = []

        def peer_then_floor(pool_ready: bool) -> float:
            wall = self.backend_latency("peer", pool_ready)
            floors.append(self.floor(floor_guest))
            return wall

        ours, peer = interleave(
            trials, lambda: self.backend_latency("ours", False), lambda: peer_then_floor(False)
        )
        self.record("S1_pool_off", ours, peer, unit="s", better="lower", floor=summary(floors))

        self.w["ours"].call("set_env", vars={"CREATEOS_SANDBOX_WARM_POOL": "2"})
        self.backend_latency("ours", False)  # creates the pool for this configuration
        floors = []
        ours, peer = interleave(
            trials, lambda: self.backend_latency("ours", True), lambda: peer_then_floor(True)
        )
        self.record("S1_pool_on", ours, peer, unit="s", better="lower", pool_size=2, floor=summary(floors))
        self.w["ours"].call("set_env", vars={"CREATEOS_SANDBOX_WARM_POOL": "0"})
        self.w["ours"].call("shutdown")  # deletes the pool
        self.cp.delete_sandbox(floor_guest)

    def floor_guest(self) -> str:
        status, body = self.cp._request(
            "POST", "/v1/sandboxes", {"shape": "s-2vcpu-4gb", "egress": ["240.0.0.0/4"]}, auth=True
        )
        assert status == 200, body
        return body["data"]["id"]

    def floor(self, guest: str) -> float:
        """The floor any client pays: one exec round trip of `python3 -c print(1)` on a guest
        that already exists (stdlib urllib, buffered exec), under the same injected latency."""
        body = {"cmd": "timeout", "args": ["--signal=KILL", "30", "python3", "-u", "-c", "print(1)"]}
        started = time.perf_counter()
        status, answer = self.cp._request("POST", f"/v1/sandboxes/{guest}/exec", body, auth=True)
        wall = time.perf_counter() - started
        assert status == 200 and answer["data"]["result"]["stdout"] == "1\n", answer
        return wall

    def s2(self) -> None:
        log("S2: client CPU per backend run (user+sys of the worker process), no latency")
        self.settle()
        self.faults(NO_FAULTS)
        rounds, per = self.n(8, 3), self.n(10, 5)
        for name in self.w:
            self.w[name].call("cpu", n=2)

        def one(name: str) -> float:
            r = self.w[name].call("cpu", n=per)
            assert r["failures"] == 0, r
            return r["cpu_per_run"] * 1000

        floor = S2Floor(self.w["ours"].call("wire", code="print(1)"), self.cp)
        floors: list[float] = []

        def peer_then_floor() -> float:
            cpu = one("peer")
            floors.append(floor.sample(per))
            return cpu

        try:
            ours, peer = interleave(rounds, lambda: one("ours"), peer_then_floor)
        finally:
            floor.close()
        self.record(
            "S2_cpu_ms",
            ours,
            peer,
            unit="ms CPU/run",
            better="lower",
            runs_per_sample=per,
            floor=summary(floors),
        )

    def s3(self) -> None:
        log("S3: 16 threads x 25 runs in one process, 50 ms boot delay")
        self.settle()
        self.faults(S3_FAULTS)
        rounds = 1  # 400 runs each; the spread below is per-run latency inside the round
        runs = self.n(25, 5)
        detail: dict[str, list[dict[str, Any]]] = {"ours": [], "peer": []}

        def one(name: str) -> float:
            r = self.w[name].call("threads", threads=16, runs=runs)
            detail[name].append(
                {
                    k: r[k]
                    for k in (
                        "runs_per_s",
                        "wall",
                        "done",
                        "errors",
                        "error_samples",
                        "cpu_per_run",
                        "latency",
                    )
                }
            )
            log(f"  {name}: {r['runs_per_s']:.2f} runs/s, {r['errors']} errors, {r['wall']:.1f} s")
            self.settle()
            return r["runs_per_s"]

        ours, peer = interleave(rounds, lambda: one("ours"), lambda: one("peer"))
        self.record("S3_runs_per_s", ours, peer, unit="runs/s", better="higher", detail=detail)

    def s4(self, pythons: dict[str, Path | str], envs: dict[str, dict[str, str]], cwd: str) -> None:
        log("S4: a guest prints 512 MiB; peak RSS growth of a fresh worker")
        self.settle()
        self.faults(NO_FAULTS)
        mib = self.n(512, 128)
        runs: dict[str, list[dict[str, Any]]] = {"ours": [], "peer": []}
        # Two runs of ours, one of the peer: the peer's 512 MiB buffered answer takes 35-100 s
        # on this machine, and a peak RSS is far less noisy than a latency.
        for trial in range(self.n(2, 1)):
            for name in ("ours", "peer") if trial == 0 else ("ours",):
                worker = Worker(f"s4-{name}", pythons[name], envs[name], cwd)
                try:
                    r = worker.call("big_output", mib=mib)
                finally:
                    worker.close()
                runs[name].append(r)
                log(
                    f"  {name}: completed={r.get('completed')} growth={r['peak_rss_growth_mib']:.1f} MiB "
                    f"stdout={r.get('stdout_mib', 0):.1f} MiB truncation_note={r.get('truncation_note')} {r.get('error', '')}"
                )
                self.settle()
        self.record(
            "S4_peak_rss_growth_mib",
            [r["peak_rss_growth_mib"] for r in runs["ours"]],
            [r["peak_rss_growth_mib"] for r in runs["peer"]],
            unit="MiB",
            better="lower",
            printed_mib=mib,
            runs=runs,
        )

    def s5(self) -> None:
        log("S5: component, Guest Reuse on: runs 2-10 on one guest (25 ms latency, 200 ms boot)")
        self.settle()
        self.faults(S1_FAULTS)
        sequences = self.n(2, 1)
        samples: dict[str, list[float]] = {"ours": [], "peer": []}
        firsts: dict[str, list[float]] = {"ours": [], "peer": []}
        stamp = int(time.time())
        for seq in range(sequences):
            guests: dict[str, set[str]] = {"ours": set(), "peer": set()}
            for i in range(10):
                for name in ("ours", "peer"):
                    r = self.w[name].call("component", flow_id=f"bench-{name}-{stamp}-{seq}", code="print(1)")
                    assert r["result"] == "1", r
                    guests[name].add(r["sandbox_id"])
                    (firsts if i == 0 else samples)[name].append(r["wall"])
            assert all(len(g) == 1 for g in guests.values()), guests
            for sb in self.cp.live_sandboxes():  # reused guests outlive the runs by design
                if sb["status"] != "destroying":
                    self.cp.delete_sandbox(sb["id"])
        self.record(
            "S5_reuse_latency_s",
            samples["ours"],
            samples["peer"],
            unit="s",
            better="lower",
            first_run={k: summary(v) for k, v in firsts.items()},
        )

    def s6(self) -> None:
        log("S6: executor, ChatInput -> Sleepy(3 s) -> ChatOutput (25 ms latency, 200 ms boot)")
        self.settle()
        self.faults(S1_FAULTS)
        trials = self.n(2, 1)
        runs: dict[str, list[dict[str, Any]]] = {"ours": [], "peer": []}

        def one(name: str) -> float:
            r = self.w[name].call("executor")
            runs[name].append(r)
            log(
                f"  {name}: first event {r['first_event']:.2f} s, RunComplete {r.get('complete', float('nan')):.2f} s, "
                f"{r['events']} events, text={r.get('text')!r}"
            )
            return r["first_event"]

        for name in self.w:  # warm: imports, lfx graph machinery
            self.w[name].call("executor")
        ours, peer = interleave(trials, lambda: one("ours"), lambda: one("peer"))
        self.record_s6("S6", ours, peer, runs)

        log("S6 with CREATEOS_EXECUTOR_WARM_POOL=1 (ours; the peer has no pool)")
        self.w["ours"].call("set_env", vars={"CREATEOS_EXECUTOR_WARM_POOL": "1"})
        runs = {"ours": [], "peer": []}

        def pooled() -> float:
            self.w["ours"].call("arun_pool_ready")
            return one("ours")

        self.w["ours"].call("executor")  # registers the pool (this run goes cold)
        ours, peer = interleave(trials, pooled, lambda: one("peer"))
        self.w["ours"].call("shutdown")
        self.w["ours"].call("set_env", vars={"CREATEOS_EXECUTOR_WARM_POOL": "0"})
        self.record_s6("S6_pool", ours, peer, runs)

    def record_s6(
        self, prefix: str, ours: list[float], peer: list[float], runs: dict[str, list[dict[str, Any]]]
    ) -> None:
        self.record(f"{prefix}_first_event_s", ours, peer, unit="s", better="lower")
        self.results[f"{prefix}_first_event_s"]["ours_first_vertex"] = summary(
            [r["first_vertex"] for r in runs["ours"] if r.get("first_vertex") is not None] or [float("nan")]
        )
        self.record(
            f"{prefix}_complete_s",
            [r["complete"] for r in runs["ours"]],
            [r["complete"] for r in runs["peer"]],
            unit="s",
            better="lower",
            runs=runs,
        )

    def s7(self) -> None:
        log("S7: ChatInput -> ChatOutput through Graph.arun: in-process, ours pool on/off, peer")
        self.settle()
        self.faults(S1_FAULTS)
        trials = self.n(5, 2)
        peer_texts: set[str] = set()

        host_cpu: dict[str, list[float]] = {"in-process": [], "pool on": []}

        def arun(name: str, kind: str, pool_ready: bool = False, owned: bool = False) -> float:
            r = self.w[name].call("arun", kind=kind, pool_ready=pool_ready, owned=owned)
            if name == "ours":
                assert r["text"] == "hi", r
                if kind == "in-process" or pool_ready:
                    host_cpu["pool on" if pool_ready else "in-process"].append(r["cpu"] * 1000)
            elif r["text"] != "hi":  # timed all the same; its answer is reported
                peer_texts.add(repr(r["text"]))
            return r["wall"]

        ours = self.w["ours"]
        arun("ours", "in-process")  # imports
        host_cpu["in-process"].clear()
        in_process = [arun("ours", "in-process") for _ in range(trials)]
        ours.call("set_env", vars={"CREATEOS_EXECUTOR_WARM_POOL": "0"})
        arun("ours", "createos")
        arun("peer", "createos")
        off, peer = interleave(trials, lambda: arun("ours", "createos"), lambda: arun("peer", "createos"))
        rss_pool0 = ours.call("rss")["rss_kib"] / 1024
        ours.call("set_env", vars={"CREATEOS_EXECUTOR_WARM_POOL": "1"})
        arun("ours", "createos")  # registers the pool (cold)
        on, peer_on = interleave(
            trials, lambda: arun("ours", "createos", pool_ready=True), lambda: arun("peer", "createos")
        )
        ours.call("shutdown")
        ours.call("set_env", vars={"CREATEOS_EXECUTOR_WARM_POOL": "4"})
        arun("ours", "createos")
        ours.call("arun_pool_ready")
        rss_pool4 = ours.call("rss")["rss_kib"] / 1024
        ours.call("shutdown")
        ours.call("set_env", vars={"CREATEOS_EXECUTOR_WARM_POOL": "0", "CREATEOS_EXECUTOR_REUSE": "true"})
        arun("ours", "createos", owned=True)  # starts the flow's reused guest (cold)
        reused, peer_reuse = interleave(
            trials, lambda: arun("ours", "createos", owned=True), lambda: arun("peer", "createos")
        )
        ours.call("shutdown")
        ours.call("set_env", vars={"CREATEOS_EXECUTOR_REUSE": "false"})
        self.record("S7_in_process_s", in_process, in_process, unit="s", better="lower")
        self.record(
            "S7_reuse_s",
            reused,
            peer_reuse,
            unit="s",
            better="lower",
            minus_in_process=statistics.median(reused) - statistics.median(in_process),
        )
        self.record(
            "S7_pool_on_s",
            on,
            peer_on,
            unit="s",
            better="lower",
            minus_in_process=statistics.median(on) - statistics.median(in_process),
            rss_mib={"pool0": round(rss_pool0, 1), "pool4": round(rss_pool4, 1)},
            host_cpu_ms={k: summary(v) for k, v in host_cpu.items() if v},
            peer_wrong_texts=sorted(peer_texts),
        )
        self.record("S7_pool_off_s", off, peer, unit="s", better="lower")


# --- verdicts --------------------------------------------------------------------------------

TARGETS: dict[str, tuple[str, str, Callable[[dict[str, Any]], bool]]] = {
    "S1_pool_off": ("S1 latency, pool off", "ours/peer <= 0.85", lambda r: r["ratio"] <= 0.85),
    "S1_pool_on": ("S1 latency, pool on", "ours/peer <= 0.15", lambda r: r["ratio"] <= 0.15),
    "S2_cpu_ms": ("S2 client CPU per run", "ours/peer <= 0.25", lambda r: r["ratio"] <= 0.25),
    "S3_runs_per_s": ("S3 throughput, 16 threads", "ours/peer >= 2.0", lambda r: r["ratio"] >= 2.0),
    "S4_peak_rss_growth_mib": (
        "S4 peak RSS growth, 512 MiB printed",
        "ours <= 64 MiB, completes with a truncation note",
        lambda r: (
            r["ours"]["median"] <= 64
            and all(x.get("completed") and x.get("truncation_note") for x in r["runs"]["ours"])
        ),
    ),
    "S5_reuse_latency_s": ("S5 component reuse, runs 2-10", "ours/peer <= 0.6", lambda r: r["ratio"] <= 0.6),
    "S6_first_event_s": (
        "S6 executor, time to first event",
        "ours <= 1.5 s; peer's first event only at the end",
        lambda r: r["ours"]["p90"] <= 1.5,
    ),
    "S6_complete_s": ("S6 executor, time to RunComplete", "(reported)", lambda r: True),
    "S6_pool_first_event_s": (
        "S6 executor with the pool, first event",
        "ours' first vertex result <= 1.0 s",
        lambda r: r["ours_first_vertex"]["median"] <= 1.0,
    ),
    "S6_pool_complete_s": (
        "S6 executor with the pool, RunComplete",
        "ours <= 3.8 s",
        lambda r: r["ours"]["median"] <= 3.8,
    ),
    "S7_in_process_s": ("S7 Graph.arun in-process (reference)", "(reported)", lambda r: True),
    "S7_reuse_s": (
        "S7 Graph.arun, ours with CREATEOS_EXECUTOR_REUSE (a warm guest of the flow's domain)",
        "ours - in-process <= 20 ms",
        lambda r: r["minus_in_process"] <= 0.020,
    ),
    "S7_pool_on_s": (
        "S7 Graph.arun, ours with the pool",
        "ours - in-process <= 0.5 s, ours/peer <= 0.15, RSS pool 4 - pool 0 <= 64 MiB",
        lambda r: (
            r["minus_in_process"] <= 0.5
            and r["ratio"] <= 0.15
            and r["rss_mib"]["pool4"] - r["rss_mib"]["pool0"] <= 64
        ),
    ),
    "S7_pool_off_s": (
        "S7 Graph.arun, ours without the pool",
        "ours/peer <= 0.8",
        lambda r: r["ratio"] <= 0.8,
    ),
}


def verdicts(results: dict[str, Any]) -> None:
    for key, (_, _, check) in TARGETS.items():
        if key in results:
            try:
                results[key]["met"] = bool(check(results[key]))
            except Exception:
                results[key]["met"] = False
    if "S6_first_event_s" in results and "S6_complete_s" in results:
        peer_runs = results["S6_complete_s"]["runs"]["peer"]
        results["S6_first_event_s"]["peer_first_event_at_end"] = all(
            r["first_event"] >= 0.9 * r["complete"] for r in peer_runs if r.get("complete")
        )
        results["S6_first_event_s"]["met"] = (
            results["S6_first_event_s"]["met"] and results["S6_first_event_s"]["peer_first_event_at_end"]
        )


def machine_info(infos: dict[str, dict[str, Any]]) -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    return {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "host": f"{platform.system()} {platform.release()} ({platform.machine()})",
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "mem_gib": round(mem_gib, 1),
        "loadavg_start": os.getloadavg(),
        "ours": infos["ours"],
        "peer": infos["peer"],
    }


ALL_SCENARIOS = frozenset({"S1", "S2", "S3", "S4", "S5", "S6", "S7"})


def result_name(only: set[str], quick: bool) -> str:
    """`latest` for a full run; a partial or quick one never overwrites it (latest.md is the
    table the README and performance.md quote): `partial-S2-S7`, `quick-...`."""
    if only >= ALL_SCENARIOS and not quick:
        return "latest"
    return ("quick-" if quick else "partial-") + "-".join(sorted(only & ALL_SCENARIOS) or ["none"])


def stop_on_sigterm() -> None:
    """SIGTERM (a CI time limit, `kill`) unwinds like Ctrl-C: the `finally` blocks stop the
    workers, the servers and createos-local with its guests (the default action would kill
    this process alone and leave them running)."""

    def unwind(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, unwind)


def main(argv: Sequence[str] | None = None) -> int:
    stop_on_sigterm()
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="few samples, 128 MiB for S4 (a smoke test)")
    parser.add_argument(
        "--only",
        default=",".join(sorted(ALL_SCENARIOS)),
        help="comma-separated scenarios; a subset writes partial-<scenarios>.md, not latest.md",
    )
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--out", default=str(RESULTS), help="results directory")
    parser.add_argument(
        "--ours-root",
        default=str(ROOT),
        help="the checkout (a worktree, say) whose langflow_sandbox_createos, built in place, is 'ours' "
        "(default: the one this script is in, whatever .venv has installed)",
    )
    args = parser.parse_args(argv)
    only = {s.strip().upper() for s in args.only.split(",") if s.strip()}
    out = Path(args.out)
    started = time.monotonic()

    peer_python = ensure_peer_venv()
    pythons: dict[str, Path | str] = {"ours": sys.executable, "peer": peer_python}
    scratch = tempfile.mkdtemp(prefix="createos-bench-")
    # Buffered exec answers carry up to 1 GiB per stream here, so the peer (buffered exec)
    # receives what its guest printed, as the real service would send it; the default cap
    # of createos-local (64 MiB) would hide most of S4's cost.
    extra = ["--max-exec-output-bytes", str(1 << 30), "--max-sandboxes", "5000"]
    ours_root = Path(args.ours_root).resolve()
    with LocalControlPlane(api_key=API_KEY, boot_delay_ms=0, extra_args=extra) as cp:
        env = worker_env(cp)
        ours = Worker("ours", pythons["ours"], ours_env(env, ours_root), scratch)
        peer = Worker("peer", pythons["peer"], env, scratch)
        try:
            infos = {"ours": ours.call("info"), "peer": peer.call("info")}
            assert infos["ours"]["plugin"] == "ours" and infos["peer"]["plugin"] == "peer", infos
            assert Path(infos["ours"]["package"]).is_relative_to(ours_root), (infos["ours"], ours_root)
            log(
                f"ours {infos['ours']['plugin_version']} (libcurl {infos['ours'].get('libcurl')}), "
                f"peer {infos['peer']['plugin_version']}, lfx {infos['ours']['lfx']}/{infos['peer']['lfx']}"
            )
            bench = Bench(cp, ours, peer, args.quick)
            meta = machine_info(infos)
            meta["control_plane"] = {"isolation": cp.stats().get("isolation"), "args": extra}
            if "S1" in only:
                bench.s1()
            if "S2" in only:
                bench.s2()
            if "S3" in only:
                bench.s3()
            if "S5" in only:
                bench.s5()
            if "S6" in only:
                bench.s6()
            if "S7" in only:
                bench.s7()
            if "S4" in only:
                bench.s4(pythons, {"ours": ours_env(env, ours_root), "peer": env}, scratch)
        finally:
            ours.close()
            peer.close()
        bench.settle()
    results = bench.results
    verdicts(results)
    meta["duration_s"] = round(time.monotonic() - started, 1)
    meta["quick"] = args.quick
    meta["loadavg_end"] = os.getloadavg()
    doc = {"meta": meta, "results": results}

    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = result_name(only, args.quick)
    (raw / f"{stamp}.json").write_text(json.dumps(doc, indent=1))
    (raw / f"{name}.json").write_text(json.dumps(doc, indent=1))
    from report import render_markdown, render_plot  # benchmarks/report.py

    (out / f"{name}.md").write_text(render_markdown(doc, TARGETS, out))
    if not args.no_plot:
        render_plot(doc, TARGETS, out / f"{name}.png")
    log(f"done in {meta['duration_s']:.0f} s: {out / f'{name}.md'}")
    shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
