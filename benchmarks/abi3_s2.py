"""S2 for the two builds of the native client, side by side: the Limited API one (abi3, what
every wheel and sdist build ships) and the version-specific one (CREATEOS_FULL_API=1).

    make bench-abi3
    .venv/bin/python benchmarks/abi3_s2.py [--rounds 12] [--per 10]

S2 as benchmarks/run.py measures it: client CPU (user + sys of the whole worker process, the
native I/O thread included) per backend run, `print(1)` on createos-local with no injected
latency. Both builds are compiled from the same sources with the same flags, each into its
own copy of the package; one createos-local serves two workers (benchmarks/worker.py, the same
.venv, each with its copy first on PYTHONPATH), and the rounds interleave them A B A B ...
Writes benchmarks/results/abi3-s2.json and prints the table docs/performance.md quotes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from run import (  # noqa: E402
    API_KEY,
    NO_FAULTS,
    RESULTS,
    ROOT,
    LocalControlPlane,
    Worker,
    interleave,
    log,
    summary,
    worker_env,
)

BUILDS = {"abi3": {}, "full": {"CREATEOS_FULL_API": "1"}}


def build(name: str, extra_env: dict[str, str], into: Path) -> Path:
    """The package with this build's extension, in into/langflow_sandbox_createos."""
    pkg = into / "langflow_sandbox_createos"
    shutil.copytree(
        ROOT / "langflow_sandbox_createos", pkg, ignore=shutil.ignore_patterns("*.so", "__pycache__")
    )
    env = {**os.environ, **extra_env}
    env.pop("CREATEOS_SANITIZE", None)
    env.pop("CREATEOS_DEBUG", None)
    subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(into), "--build-temp",
         str(into / "obj"), "--force"],
        cwd=ROOT, env=env, check=True, capture_output=True,
    )  # fmt: skip
    built = sorted(pkg.glob("_createos*.so"))
    assert len(built) == 1, built
    log(f"{name}: {built[0].name}")
    return built[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--per", type=int, default=10, help="backend runs per sample")
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="createos-abi3-bench-"))
    started = time.monotonic()
    try:
        files = {name: build(name, env, scratch / name) for name, env in BUILDS.items()}
        extra = ["--max-sandboxes", "5000"]
        with LocalControlPlane(api_key=API_KEY, boot_delay_ms=0, extra_args=extra) as cp:
            cp.set_faults({**NO_FAULTS, "rules": []})
            workers = {}
            for name in BUILDS:
                env = {**worker_env(cp), "PYTHONPATH": str(scratch / name)}
                workers[name] = Worker(f"abi3-s2-{name}", sys.executable, env, str(scratch))
            try:
                infos = {name: w.call("info") for name, w in workers.items()}
                for name, info in infos.items():
                    assert info["plugin"] == "ours", info
                    assert info.get("native") == str(files[name]), (info, files[name])
                for w in workers.values():
                    w.call("cpu", n=3)  # warm-up: imports, first connection, lfx's registry

                def one(name: str) -> float:
                    r = workers[name].call("cpu", n=args.per)
                    assert r["failures"] == 0, r
                    return r["cpu_per_run"] * 1000

                abi3, full = interleave(args.rounds, lambda: one("abi3"), lambda: one("full"))
            finally:
                for w in workers.values():
                    w.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    a, f = summary(abi3), summary(full)
    ratio = a["median"] / f["median"]
    doc = {
        "scenario": "S2 client CPU per backend run (ms), abi3 vs version-specific",
        "rounds": args.rounds,
        "runs_per_sample": args.per,
        "abi3": a,
        "full": f,
        "ratio_abi3_over_full": ratio,
        "python": sys.version.split()[0],
        "libcurl": infos["abi3"].get("libcurl"),
        "loadavg_end": os.getloadavg(),
        "duration_s": round(time.monotonic() - started, 1),
        "samples": {"abi3": abi3, "full": full},
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "abi3-s2.json").write_text(json.dumps(doc, indent=1))
    print("| build | S2 client CPU per run, median [p10, p90] |")
    print("|---|---|")
    print(
        f"| abi3 (Limited API 3.10, `{files['abi3'].name}`) | {a['median']:.3f} ms [{a['p10']:.3f}, {a['p90']:.3f}] |"
    )
    print(
        f"| version-specific (`{files['full'].name}`) | {f['median']:.3f} ms [{f['p10']:.3f}, {f['p90']:.3f}] |"
    )
    print(f"abi3 / version-specific: {ratio:.3f} ({(ratio - 1) * 100:+.1f} %); budget: within 5 %")
    return 0 if ratio <= 1.05 else 1


if __name__ == "__main__":
    sys.exit(main())
