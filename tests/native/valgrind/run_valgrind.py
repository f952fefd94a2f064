"""Run subset.py under valgrind against a fresh createos-local and judge the log.

    .venv/bin/python tests/native/valgrind/run_valgrind.py

Passes when nothing is definitely or indirectly lost and no valgrind error has a
frame in the native client. (CPython 3.11 itself reports "uninitialised value"
noise at start-up from its random seeding; those frames are not ours.)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from langflow_sandbox_createos.local.testing import LocalControlPlane  # noqa: E402


def main() -> int:
    log = Path(tempfile.mkdtemp()) / "valgrind.log"
    with LocalControlPlane() as cp:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONMALLOC": "malloc"}
        argv = [
            "valgrind",
            "--leak-check=full",
            "--show-leak-kinds=definite,indirect",
            "--num-callers=40",
            f"--log-file={log}",
            sys.executable,
            str(Path(__file__).with_name("subset.py")),
            cp.url,
            cp.api_key,
        ]
        run = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    text = log.read_text()
    print(run.stdout.strip())
    lost = {
        kind: int(n.replace(",", ""))
        for kind, n in re.findall(r"(definitely|indirectly) lost: ([\d,]+) bytes", text)
    }
    ours = re.compile(r"_createos|\((?:engine|http|ops|client|module|common|envelope|ndjson)\.c:\d+\)")
    blocks = re.split(r"\n==\d+== \n", text)
    errors = [b for b in blocks if ours.search(b) and re.search(r"Invalid|uninitialised|lost in", b)]
    summary = re.findall(r"ERROR SUMMARY: .*", text)
    print(
        f"valgrind: {lost}, errors in native-client frames: {len(errors)}; {summary[-1] if summary else ''}"
    )
    print(f"log: {log}")
    ok = run.returncode in (0,) or "subset ok" in run.stdout
    return 0 if ok and not any(lost.values()) and not errors else 1


if __name__ == "__main__":
    sys.exit(main())
