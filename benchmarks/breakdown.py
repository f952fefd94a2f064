"""Where the time of one warm backend run goes, measured interleaved on one existing guest.

    .venv/bin/python benchmarks/breakdown.py [--rounds 20] [--latency-ms 25]

Per round, on the same guest and under the same injected latency, each of:
  floor/urllib     buffered exec of `timeout --signal=KILL 30 python3 -u -c print(1)` (stdlib HTTP)
  native/stream    the same command through the native client's streaming exec
  native/buffered  the same command through the native client's buffered exec
  script/stream    the backend's own guest script (sh: write the program, time it, run it)
  script/before    the guest script as it was before docs/performance.md's change (mkdir and
                   four `date` processes around the program), for the before/after figure
  true/stream      `/bin/true`: the control plane's fixed cost of one exec
Median and p10-p90 per row. The difference between rows says what each layer costs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from langflow_sandbox_createos import _createos
from langflow_sandbox_createos.backend.engine import _Program
from langflow_sandbox_createos.local.testing import LocalControlPlane

CMD = ["timeout", "--signal=KILL", "30", "python3", "-u", "-c", "print(1)"]


def before_script(path: str, n: int) -> str:
    """The backend's guest script before the change (commit 4a1592f), kept for comparison."""
    return (
        f"mkdir -p /workspace && cat > {path} || exit $?\n"
        "exec 3>&2 2>/dev/null\n"
        "t0=$(date +%s%N); s0=$(date +%s)\n"
        f"(exec 2>&3 3>&-; exec timeout --signal=KILL {n} python3 -u {path})\n"
        "r=$?\n"
        "t1=$(date +%s%N); s1=$(date +%s)\n"
        'case "$t0$t1" in *[!0-9]*) ;; '
        "*) printf '\\037createos:program_ms=%s\\n' $(( (t1 - t0) / 1000000 )) >&3 ;; esac\n"
        f'if [ "$r" -eq 137 ] && [ $((s1 - s0)) -ge {n} ]; then exit 124; fi\n'
        'exit "$r"\n'
    )


def pct(values: list[float], q: float) -> float:
    data = sorted(values)
    pos = (len(data) - 1) * q
    lo, hi = int(pos), min(int(pos) + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--latency-ms", type=int, default=25)
    parser.add_argument("--json", help="write the samples here")
    args = parser.parse_args()

    with LocalControlPlane(api_key="bench-key") as cp:
        cp.set_faults({"latency_ms": args.latency_ms, "boot_delay_ms": 0, "rules": []})
        client = _createos.Client(cp.url, cp.api_key)
        guest = client.create({"shape": "s-2vcpu-4gb", "egress": ["240.0.0.0/4"]})["id"]
        program = _Program.build("print(1)", 30)

        def urllib_exec() -> None:
            body = json.dumps({"cmd": CMD[0], "args": CMD[1:]}).encode()
            request = urllib.request.Request(
                f"{cp.url}/v1/sandboxes/{guest}/exec",
                data=body,
                method="POST",
                headers={"X-Api-Key": cp.api_key, "Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=60) as response:
                assert json.loads(response.read())["data"]["result"]["stdout"] == "1\n"

        cases = {
            "floor/urllib": urllib_exec,
            "native/stream": lambda: client.exec(guest, CMD[0], CMD[1:], timeout=60),
            "native/buffered": lambda: client.exec(guest, CMD[0], CMD[1:], timeout=60, stream=False),
            "script/stream": lambda: client.exec(
                guest, "/bin/sh", ["-c", program.script], stdin=program.stdin, timeout=60
            ),
            "script/before": lambda: client.exec(
                guest, "/bin/sh", ["-c", before_script(program.path, 30)], stdin=program.stdin, timeout=60
            ),
            "true/stream": lambda: client.exec(guest, "/bin/true", timeout=60),
        }
        samples: dict[str, list[float]] = {name: [] for name in cases}
        for fn in cases.values():  # warm
            fn()
        for _ in range(args.rounds):
            for name, fn in cases.items():
                started = time.perf_counter()
                fn()
                samples[name].append(time.perf_counter() - started)
        client.delete(guest)
        client.close()

    print(
        f"{'case':18s} {'median':>9s} {'p10':>9s} {'p90':>9s}   (ms, {args.rounds} rounds, {args.latency_ms} ms latency)"
    )
    for name, values in samples.items():
        print(
            f"{name:18s} {pct(values, 0.5) * 1000:9.1f} {pct(values, 0.1) * 1000:9.1f} {pct(values, 0.9) * 1000:9.1f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(samples))
    return 0


if __name__ == "__main__":
    sys.exit(main())
