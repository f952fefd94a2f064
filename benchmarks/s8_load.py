"""S8: the load generator (a separate process under nice -n 5, the dev venv's httpx)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from s8_common import CLIENT_TIMEOUT, HERE
from s8_server import Server

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
        ["nice", "-n", "5", sys.executable, str(HERE / "server_bench.py"), "--load-worker", str(spec_path)],
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
