"""Native client benchmark against createos-local with injected latency.

    .venv/bin/python benchmarks/native_bench.py [--latency-ms 20] [--requests 400]
        [--executions 40] [--threads 1,8,32,64] [--json out.json]

Reports, for the client process only (the control plane is another process):
  - client CPU time per control-plane request (GET /v1/whoami), one thread;
  - client CPU time per full execution (run_program: create, stream exec, delete);
  - requests per second and CPU per request with N threads sharing one Client.
CPU time is time.process_time() of this process: the calling threads and the
client's I/O thread together. With latency injected the server's answer time
is mostly sleep, so requests/s with N threads shows how well concurrent calls
overlap on one client (connections are reused; see the connections column).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from langflow_sandbox_createos import _createos
from langflow_sandbox_createos.local.testing import LocalControlPlane

SPEC = {"shape": "s-1vcpu-256mb"}


def measure(fn, count: int, threads: int = 1) -> dict[str, float]:
    per_thread = max(1, count // threads)
    barrier = threading.Barrier(threads + 1)
    errors: list[BaseException] = []

    def work() -> None:
        barrier.wait()
        for _ in range(per_thread):
            try:
                fn()
            except BaseException as exc:
                errors.append(exc)

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    barrier.wait()
    for t in pool:
        t.join()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    done = per_thread * threads
    return {
        "calls": done,
        "errors": len(errors),
        "wall_s": wall,
        "per_s": done / wall,
        "cpu_us_per_call": cpu / done * 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--latency-ms", type=int, default=20)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--executions", type=int, default=40)
    ap.add_argument("--threads", default="1,8,32,64")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows: list[dict[str, object]] = []
    with LocalControlPlane() as cp:
        client = _createos.Client(cp.url, cp.api_key, control_timeout=120)
        client.whoami()  # warm: connection, engine thread
        cp.set_faults({"latency_ms": args.latency_ms})

        def row(name: str, threads: int, fn, count: int) -> None:
            conns0 = client.stats()["connections_opened"]
            m = measure(fn, count, threads)
            m.update(name=name, threads=threads, connections=client.stats()["connections_opened"] - conns0)
            rows.append(m)

        row("control request (whoami)", 1, client.whoami, args.requests)
        row(
            "full execution (run_program)",
            1,
            lambda: client.run_program(SPEC, "echo", ["x"], timeout=60),
            args.executions,
        )
        for n in (int(x) for x in args.threads.split(",")):
            row("control request (whoami)", n, client.whoami, max(args.requests, n * 10))
        for n in (int(x) for x in args.threads.split(",") if int(x) > 1):
            row(
                "full execution (run_program)",
                n,
                lambda: client.run_program(SPEC, "echo", ["x"], timeout=60),
                max(args.executions, n * 2),
            )
        client.close()
        server = cp.stats()
    print(
        f"\nnative client {_createos.__version__} (libcurl {_createos.curl_version}, jansson "
        f"{_createos.jansson_version}); createos-local with {args.latency_ms} ms injected latency\n"
    )
    head = f"{'operation':30} {'threads':>7} {'calls':>6} {'errors':>6} {'calls/s':>9} {'client CPU/call':>16} {'new conns':>9}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['name']:30} {r['threads']:>7} {r['calls']:>6} {r['errors']:>6} {r['per_s']:>9.1f} "
            f"{r['cpu_us_per_call']:>13.0f} us {r['connections']:>9}"
        )
    print(
        f"\nserver: {sum(server['requests'].values())} requests on {server['connections_opened']} connections"
    )
    if args.json:
        args.json.write_text(json.dumps({"latency_ms": args.latency_ms, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
