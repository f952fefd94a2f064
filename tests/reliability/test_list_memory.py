"""Found by the 30-minute soak: the client's RSS grew ~7 MiB/min under faults.

Cause: ``Client.list()`` (which ``runtime.reap_lost_create`` calls after every create whose
answer was lost) gathered every row of the account before filtering by name, and terminal
rows stay listed, so each call held memory proportional to every guest ever created; with
several threads each glibc arena kept its own high-water mark, growing with the account.
Now rows are filtered page by page, so a call holds one page plus the kept rows.

The check: the soak's traffic shape in miniature (8 threads, a create that fails 30 % of
the time followed by a lookup by name, the other 70 % adding a destroyed row each), in
phases; after two warm-up phases (every thread's arena at its high-water mark), RSS must
stay flat while the account's rows keep growing. Measured the same way outside pytest,
before the fix RSS rose 16.5 MiB over the three measured phases; after it, 0.1.
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
PHASE_OPS = 400
PHASES = 5
WARMUP_PHASES = 2
ALLOWED_MIB = 6.0


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


@pytest.mark.timeout(300)
def test_list_memory_does_not_grow_with_the_accounts_rows(plane: Any) -> None:
    native = runtime._native()
    client = native.Client(plane.url, plane.api_key)
    plane.set_faults({"rules": [{"route": "create", "status": 500, "probability": 0.3}]})
    looked_up: list[int] = []

    def op() -> None:
        name = "lf-" + secrets.token_hex(9)
        try:
            client.run_program(
                {"shape": "s-2vcpu-4gb", "name": name}, "true", [], timeout=10, delete="background"
            )
        except native.CreateOSError:
            assert client.list(prefix=name) == []  # a refused create left no row
            looked_up.append(1)
        client.drain_deletes(0)

    def phase() -> float:
        threads = [
            threading.Thread(target=lambda: [op() for _ in range(PHASE_OPS // THREADS)])
            for _ in range(THREADS)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        gc.collect()
        return _rss_mib()

    try:
        rss = [phase() for _ in range(PHASES)]
        rows = len(client.list())
    finally:
        plane.clear_faults()
        client.drain_deletes(10)
        client.close()
    growth = max(rss[WARMUP_PHASES:]) - rss[WARMUP_PHASES - 1]
    assert looked_up, "no create failed: the fault did not apply"
    assert rows >= PHASES * PHASE_OPS // 2, f"only {rows} rows: the account did not grow"
    assert growth < ALLOWED_MIB, (
        f"RSS grew {growth:.1f} MiB after warm-up while the account grew to {rows} rows "
        f"(per phase: {', '.join(f'{r:.1f}' for r in rss)} MiB)"
    )
