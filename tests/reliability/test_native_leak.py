"""Found by the 30-minute soak: the client's RSS grew ~7 MiB/min under faults. Narrowed to
the native client alone: ``Client.list()`` called after a ``run_program`` that failed (as
``runtime.reap_lost_create`` does after a failed create) leaks ~10 KiB per call with 8
threads (no Python object is left: tracemalloc and gc see nothing; without the list, or
without the failed run_program, RSS is flat). Not fixed here: the C engine is being
reworked by its owner; this test reproduces it and starts passing once it is fixed.
"""

from __future__ import annotations

import gc
import secrets
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from langflow_sandbox_createos import runtime

from . import harness

THREADS = 8
OPS = 800


def _rss_mib() -> float:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:")) / 1024


@pytest.fixture
def plane() -> Iterator[Any]:
    (p,) = harness.start_planes(1)
    try:
        yield p
    finally:
        p.stop()


@pytest.mark.xfail(
    reason="native client leaks when list() follows a failed run_program (see docstring)", strict=False
)
@pytest.mark.timeout(180)
def test_list_after_a_failed_run_program_does_not_grow_rss(plane: Any) -> None:
    native = runtime._native()
    client = native.Client(plane.url, plane.api_key)
    plane.set_faults({"rules": [{"route": "create", "status": 500, "probability": 0.3}]})

    def op() -> None:
        name = "lf-" + secrets.token_hex(9)
        try:
            client.run_program(
                {"shape": "s-2vcpu-4gb", "name": name}, "true", [], timeout=10, delete="background"
            )
        except native.CreateOSError:
            client.list(prefix=name)
        client.drain_deletes(0)

    try:
        for _ in range(50):
            op()
        gc.collect()
        before = _rss_mib()

        def worker() -> None:
            for _ in range(OPS // THREADS):
                op()

        threads = [threading.Thread(target=worker) for _ in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        gc.collect()
        growth = _rss_mib() - before
    finally:
        plane.clear_faults()
        client.drain_deletes(10)
        client.close()
    assert growth < 3.0, f"RSS grew {growth:.1f} MiB over {OPS} calls ({growth * 1024 / OPS:.1f} KiB each)"
