"""What a guest's own network and root-in-userns setup cost createos-local: create, first exec.

    .venv/bin/python benchmarks/guest_setup.py [--rounds 20] [--package-root DIR]

Per round and per egress (deny-all ``240.0.0.0/4``, the backend's network-off default, and
allow-all ``*``, which also starts the guest's NAT): create a sandbox, time its first exec of
``true`` (which waits for the guest's PID 1 and network when they are still starting), a
second exec, and the delete. Medians and p90 over the rounds, interleaved. ``--package-root``
runs createos-local from another checkout (for a before/after, e.g. a worktree of an older
commit): its package is imported first, so the server it starts is that checkout's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
EGRESS = {"deny": ["240.0.0.0/4"], "open": ["*"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--package-root", default=None)
    args = parser.parse_args()
    # the server runs from wherever the imported package lives (with_this_package_importable)
    package_root = str(Path(args.package_root).resolve()) if args.package_root else str(REPO)
    sys.path.insert(0, package_root)
    from langflow_sandbox_createos.local import testing

    samples: dict[str, dict[str, list[float]]] = {
        name: {"create": [], "first_exec": [], "second_exec": [], "delete": []} for name in EGRESS
    }
    with (
        testing.LocalControlPlane() as cp,
        httpx.Client(base_url=cp.url, headers={"X-Api-Key": cp.api_key}, timeout=60) as client,
    ):
        for round_ in range(args.rounds + 2):
            for name, egress in EGRESS.items():
                t0 = time.perf_counter()
                sb = client.post("/v1/sandboxes", json={"shape": "s-1vcpu-256mb", "egress": egress}).json()
                sid = sb["data"]["id"]
                t1 = time.perf_counter()
                for _ in range(2):
                    answer = client.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "true"}).json()
                    assert answer["data"]["result"]["exit_code"] == 0, answer
                    if _ == 0:
                        t2 = time.perf_counter()
                t3 = time.perf_counter()
                client.delete(f"/v1/sandboxes/{sid}")
                t4 = time.perf_counter()
                if round_ < 2:  # warm-up
                    continue
                row = samples[name]
                row["create"].append(t1 - t0)
                row["first_exec"].append(t2 - t1)
                row["second_exec"].append(t3 - t2)
                row["delete"].append(t4 - t3)
    report = {
        name: {
            step: {
                "median_ms": round(statistics.median(values) * 1000, 1),
                "p90_ms": round(sorted(values)[int(len(values) * 0.9) - 1] * 1000, 1),
            }
            for step, values in row.items()
        }
        for name, row in samples.items()
    }
    print(json.dumps({"package_root": testing.__file__, "rounds": args.rounds, **report}, indent=1))


if __name__ == "__main__":
    main()
