"""S8: createos-local confined to the bed's CPU, and the bed's capacity."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from s8_common import BED_CPU, HERE, SERVER_CPU, log, percentile, venv_langflow
from s8_proc import on_cpu

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
    argv = [str(venv_langflow() / "bin" / "python"), str(HERE / "server_bench.py")]
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
