"""Found by the 30-minute soak: the client's RSS grew ~7 MiB/min under faults.

Cause: ``Client.list()`` (which the guest lease (``lease._reap_lost_create``) calls after every create whose
answer was lost) gathered every row of the account before filtering by name, and terminal
rows stay listed, so each call held memory proportional to every guest ever created; with
several threads each glibc arena kept its own high-water mark, growing with the account.
Now rows are filtered page by page, so a call holds one page plus the kept rows.

The check: the soak's traffic shape in miniature (8 threads, a create that fails 30 % of
the time followed by a lookup by name, the other 70 % adding a destroyed row each), in
phases; after two warm-up phases (connections, pools and caches at their size), the heap must
stay flat while the account's rows keep growing. Measured the same way outside pytest with
400 operations a phase, before the fix RSS rose 16.5 MiB over three measured phases (about
5.5 MiB a phase); after it, 0.1. The test runs 240 a phase and measures two phases (about
55 s instead of 117 s in make test): the old leak would still show about 6.6 MiB, against
the 1 MiB allowed.

What is measured is the thing itself: the bytes malloc has handed out and not taken back
(``mallinfo2``: every arena, mmapped chunks too), not RSS. RSS also counts free memory glibc
keeps in each thread's arena, which moves with the allocator's placement and the machine's
load: on a fresh-clone run of e8f911e it grew 6.9 MiB (379.9 -> 390.2 MiB) with no leak
under it -- ASan's leak mode on the same traffic (see docs/native-client.md, "Memory")
found nothing from the client, and the heap in use stayed flat. A leak of what a call
holds (pages of rows, a request) grows the heap in use by megabytes over these phases.
"""

from __future__ import annotations

import gc
import secrets
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from native.heap import heap_in_use  # tests/ is on sys.path (rootdir without __init__.py)

from langflow_sandbox_createos.core.native import load_native

from . import harness

THREADS = 8
PHASE_OPS = 240
PHASES = 4
WARMUP_PHASES = 2
ALLOWED_MIB = 1.0


def _heap_mib() -> float:
    """MiB malloc has handed out and not taken back (all arenas, mmapped chunks included)."""
    return heap_in_use() / (1 << 20)


@pytest.fixture
def plane() -> Iterator[Any]:
    (p,) = harness.start_planes(1)
    try:
        yield p
    finally:
        p.stop()


@pytest.mark.timeout(300)
def test_list_memory_does_not_grow_with_the_accounts_rows(plane: Any) -> None:
    native = load_native()
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

    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(PHASE_OPS // THREADS):
                op()
        except BaseException as exc:  # re-raised in the test's own thread below
            errors.append(exc)

    def phase() -> float:
        threads = [threading.Thread(target=worker) for _ in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]  # an assertion in a worker fails the test, not only warns
        gc.collect()
        return _heap_mib()

    try:
        heap = [phase() for _ in range(PHASES)]
        rows = len(client.list())
    finally:
        plane.clear_faults()
        client.drain_deletes(10)
        client.close()
    growth = max(heap[WARMUP_PHASES:]) - heap[WARMUP_PHASES - 1]
    assert looked_up, "no create failed: the fault did not apply"
    assert rows >= PHASES * PHASE_OPS // 2, f"only {rows} rows: the account did not grow"
    assert growth < ALLOWED_MIB, (
        f"malloc's heap in use grew {growth:.2f} MiB after warm-up while the account grew to "
        f"{rows} rows (per phase: {', '.join(f'{h:.2f}' for h in heap)} MiB)"
    )
    print(f"heap in use per phase: {', '.join(f'{h:.2f}' for h in heap)} MiB; {rows} rows")
