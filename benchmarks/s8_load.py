"""S8: the load generator (a separate process under nice -n 5, the dev venv's httpx)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from s8_common import CLIENT_TIMEOUT, HERE
from s8_flows import code_result, expected
from s8_server import Fleet

# --- the load generator (a separate process under nice -n 5, the dev venv's httpx) ----------


def load_worker(spec_path: str) -> None:
    import asyncio

    import httpx

    spec = json.loads(Path(spec_path).read_text())
    check = expected(spec["surface"], spec.get("flow", "chat"))
    records: list[dict[str, Any]] = []
    counter = iter(range(1_000_000))

    async def caller(client: httpx.AsyncClient, t0: float, stop_at: float, target: dict[str, str]) -> None:
        # callers are dealt round the servers of the cell: each keeps to one
        url = f"{target['url']}/api/v1/run/{target['flow_id']}?stream=false"
        headers = {"x-api-key": target["api_key"], "Content-Type": "application/json"}
        budget = spec.get("runs")  # a fixed number of runs per caller (warm-up) instead of seconds
        while (budget is None and time.monotonic() < stop_at) or (budget is not None and budget > 0):
            if budget is not None:
                budget -= 1
            n = next(counter)
            sent = f"s8-{spec['tag']}-{n}"
            body = {"input_value": sent, "input_type": "chat", "output_type": "chat", "session_id": sent}
            rec: dict[str, Any] = {"n": n, "server": target["name"], "start": time.monotonic() - t0}
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
                            data = code_result(answer)
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
            targets = spec["targets"]
            await asyncio.gather(
                *(caller(client, t0, stop_at, targets[i % len(targets)]) for i in range(spec["concurrency"]))
            )
            return time.monotonic() - t0

    wall = asyncio.run(main())
    Path(spec["out"]).write_text(json.dumps({"records": records, "wall": wall}))
    print("done", flush=True)


def run_load(
    fleet: Fleet,
    surface: str,
    concurrency: int,
    seconds: float,
    scratch: Path,
    tag: str,
    runs: int | None = None,
) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """The load generator, started and waiting for "go" (its imports are done by then). Its
    callers are dealt round the fleet's servers (one server: all of them on it)."""
    spec = {
        "targets": [
            {"name": s.name, "url": s.lf.url, "api_key": s.api_key, "flow_id": s.flows[surface]}
            for s in fleet.servers
        ],
        "surface": surface,
        "flow": fleet.flow,
        "concurrency": concurrency,
        "seconds": seconds,
        "runs": runs,
        "tag": tag,
        "out": str(scratch / f"load-{tag}.json"),
    }
    spec_path = scratch / f"load-{tag}.spec.json"
    spec_path.write_text(json.dumps(spec))
    proc = subprocess.Popen(
        ["nice", "-n", "5", sys.executable, str(HERE / "server_bench.py"), "--load-worker", str(spec_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=scratch,
    )
    assert proc.stdin and proc.stdout
    assert proc.stdout.readline().strip() == "ready"
    return proc, spec


def warm_up(fleet: Fleet, surface: str, scratch: Path, runs: int = 2) -> list[dict[str, Any]]:
    """`runs` runs one after the other on each server of the fleet (imports, caches, the
    executor's pool registered): as many callers as servers, each with `runs` runs."""
    tag = f"{fleet.topology}-{surface}-warmup"
    proc, spec = run_load(fleet, surface, len(fleet.servers), 0.0, scratch, tag, runs=runs)
    assert proc.stdin
    proc.stdin.write("go\n")
    proc.stdin.flush()
    proc.communicate(timeout=runs * (CLIENT_TIMEOUT + 10) + 30)
    return json.loads(Path(spec["out"]).read_text())["records"]
