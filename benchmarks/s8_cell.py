"""S8: one cell: C runs in flight for N seconds against one surface, and what it cost the server."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from s8_bed import by_prefix
from s8_common import BED_CPU, CLIENT_TIMEOUT, EXECUTOR_POOL, EXECUTOR_SURFACES, SERVER_CPU, log, percentile
from s8_load import run_load
from s8_proc import CpuBusy, check_affinity, tree_cpu_seconds
from s8_server import Fleet

# --- one cell ------------------------------------------------------------------------------


def wait_idle(fleet: Fleet, timeout: float, pool: int = 0) -> dict[str, Any]:
    """Until the fleet's workers are quiet (< 5 % of a CPU each over 1 s, a worker's idle rate is
    about 4 %), createos-local's process tree with its guests is quiet (< 10 %), and no guest of
    the runs is left but the executor's pool (`pool` of them, all up) and what the fleet keeps
    by design (the component's reused guest; the warm executor's guests). CPU 1's own busy
    figure would not do: other work on this machine may run there too. Returns what was seen
    last."""
    started = time.monotonic()
    bed_pid = fleet.bed.process.pid if fleet.bed.process else 0
    last_worker, last_bed = fleet.cpu()[0], tree_cpu_seconds(bed_pid)
    quiet_for = 0
    seen: dict[str, Any] = {}
    while True:
        time.sleep(1.0)
        now_worker, now_bed = fleet.cpu()[0], tree_cpu_seconds(bed_pid)
        worker, bed = now_worker - last_worker, now_bed - last_bed
        last_worker, last_bed = now_worker, now_bed
        prefixes = by_prefix(fleet.bed.live())
        runs_left = sum(n for p, n in prefixes.items() if p not in fleet.kept)
        pool_ok = prefixes.get("lf-xw-", 0) >= pool
        seen = {"worker_cpu": round(worker, 3), "bed_cpu": round(bed, 3), "live": prefixes}
        quiet = worker < 0.05 * fleet.workers and bed < 0.10 and runs_left == 0 and pool_ok
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


class RssSampler(threading.Thread):
    def __init__(self, fleet: Fleet) -> None:
        super().__init__(daemon=True)
        self.fleet = fleet
        self.peak = 0.0
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.wait(0.5):
            self.peak = max(self.peak, self.fleet.rss_mib())


def cell(
    fleet: Fleet,
    surface: str,
    concurrency: int,
    seconds: float,
    scratch: Path,
    idle_timeout: float,
    model: Any = None,
) -> dict[str, Any]:
    """One cell on `fleet`; `model` (the work flow's model server) counts the model calls."""
    tag = f"{fleet.topology}-{surface}-{concurrency}"
    # the warm pool is filled only once a run without a trust domain takes from it: under
    # executor-reuse every run of the cell has one (its flow and user), so no pool is awaited
    pool = EXECUTOR_POOL if surface in EXECUTOR_SURFACES and surface != "executor-reuse" else 0
    before_idle = wait_idle(fleet, idle_timeout, pool)
    rss_before = fleet.rss_mib()
    proc, spec = run_load(fleet, surface, concurrency, seconds, scratch, tag)
    assert proc.stdin and proc.stdout
    bed_pid = fleet.bed.process.pid if fleet.bed.process else 0
    cpu0 = fleet.cpu()
    bed0 = tree_cpu_seconds(bed_pid)
    calls0 = len(model.seen()) if model is not None else 0
    sampler = RssSampler(fleet)
    sampler.start()
    bed_busy = CpuBusy(BED_CPU)
    server_busy = CpuBusy(SERVER_CPU)
    t_go, t_go_wall = time.monotonic(), time.time()
    proc.stdin.write("go\n")
    proc.stdin.flush()
    t_start = float(proc.stdout.readline().split()[1])
    # the bed's affinity, checked once while guests run
    time.sleep(min(seconds / 2, 5.0))
    bed_affinity = check_affinity(fleet.bed.process.pid, {BED_CPU}) if fleet.bed.process else {}
    proc.communicate(timeout=seconds + CLIENT_TIMEOUT + 120)
    t_end = time.time()
    cpu1 = fleet.cpu()
    busy = {"server_cpu": round(server_busy.busy(), 2), "bed_cpu": round(bed_busy.busy(), 2)}
    raw = json.loads(Path(spec["out"]).read_text())
    after_idle = wait_idle(fleet, idle_timeout, pool)
    cpu2 = fleet.cpu()
    t_idle, t_idle_wall = time.monotonic(), time.time()
    bed2 = tree_cpu_seconds(bed_pid)
    sampler.stop_event.set()
    rss_after = fleet.rss_mib()
    records = raw["records"]
    ok = [r for r in records if "error" not in r]
    errors: dict[str, int] = {}
    for r in records:
        if "error" in r:
            errors[r["error"]] = errors.get(r["error"], 0) + 1
    lat = [r["latency"] for r in ok]
    in_window = [r for r in ok if r["end"] <= seconds]
    lags = fleet.lag_samples(t_start, t_end)
    sent = len(records)
    # runs the server finished in the cell's time (for the executor, from its own log: a run a
    # client gave up on still runs to its end), the denominator of the CPU per run
    server_side = fleet.executor_runs(t_go_wall, t_idle_wall) if surface in EXECUTOR_SURFACES else None
    if server_side:
        server_side.pop("_ended")
        # the warm executor keeps a guest per flow and owner: few distinct guests; without it
        # each run had its own
        server_side["distinct_guests"] = len(set(server_side.pop("guests")))
    runs = server_side["ended"] if server_side else sent
    refused = [r for r in records if str(r.get("error", "")).startswith("HTTP ")]
    per_server: dict[str, int] = {}
    for r in ok:
        per_server[r["server"]] = per_server.get(r["server"], 0) + 1
    result = {
        "surface": surface,
        "flow": fleet.flow,
        "topology": fleet.topology,
        "workers": fleet.workers,
        "concurrency": concurrency,
        "seconds": seconds,
        "sent": sent,
        "ok": len(ok),
        "errors": sum(errors.values()),
        "error_kinds": errors,
        # a caller left without an answer (the client's timeout), against one answered with a
        # refusal (an HTTP error status) and how long the slowest refusal took
        "timeouts": errors.get("timeout", 0),
        "refused": len(refused),
        "refusal_latency_max_s": max((r["latency"] for r in refused), default=None),
        "ok_per_server": per_server,
        "model_calls": (len(model.seen()) - calls0) if model is not None else None,
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
            # the gunicorn worker(s) from the first run sent until they and the bed were idle
            # again, less their idle rate (measured before the cells) over that time, per run
            "worker": (cpu2[0] - cpu0[0] - fleet.idle_rate[0] * (t_idle - t_go)) / max(runs, 1) * 1000,
            # the same for Langflow's whole process tree (langflow run, gunicorn, worker, any children)
            "tree": (cpu2[1] - cpu0[1] - fleet.idle_rate[1] * (t_idle - t_go)) / max(runs, 1) * 1000,
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
