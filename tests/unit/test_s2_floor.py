"""S2's floor (benchmarks/s2_floor.c, driven by benchmarks/run.py's S2Floor): a one-thread
libcurl client replays the create and exec bodies our backend's own worker reports, and the
delete, against createos-local; a run whose program fails is counted, not hidden."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from langflow_sandbox_createos.local.testing import LocalControlPlane

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")


def wire(bench_run: ModuleType, cp: LocalControlPlane, tmp_path: Path) -> dict[str, Any]:
    """What our backend sends for print(1), asked of a benchmark worker as make bench does."""
    worker = bench_run.Worker("ours-floor-test", sys.executable, bench_run.worker_env(cp), str(tmp_path))
    try:
        return worker.call("wire", code="print(1)")
    finally:
        worker.close()


def test_the_floor_replays_the_backends_requests(
    bench_run: ModuleType, cp: LocalControlPlane, tmp_path: Path
) -> None:
    sent = wire(bench_run, cp, tmp_path)
    assert sent["exec"]["stdin"] == "print(1)" and sent["exec"]["stream"] is True
    assert sent["create"]["rootfs"] and "name" not in sent["create"]
    floor = bench_run.S2Floor(sent, cp)
    try:
        r = floor.sample(3)
    finally:
        floor.close()
    assert not floor.dir.exists()
    assert r > 0
    # cp's teardown asserts that no guest is left: the floor deleted each one


def test_a_failing_run_fails_the_floor(bench_run: ModuleType, cp: LocalControlPlane, tmp_path: Path) -> None:
    sent = wire(bench_run, cp, tmp_path)
    sent["exec"]["stdin"] = "raise SystemExit(3)"
    floor = bench_run.S2Floor(sent, cp)
    try:
        with pytest.raises(subprocess.CalledProcessError) as failed:
            floor.sample(2)
    finally:
        floor.close()
    counted = json.loads(failed.value.stdout)
    assert counted["failures"] == counted["runs"] + counted["warm_runs"] == 4
