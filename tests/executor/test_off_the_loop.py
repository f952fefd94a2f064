"""Nothing of ours waits on the control plane on the event loop's thread (issue 30: "no
blocking call on the server's event loop from our code paths").

A Langflow server runs every flow on one event loop; a native call that waits for the network
there (a create, an exec, an upload, a delete) stalls every other request of the server for
as long as it waits. Here every native client call that can wait is recorded, with whether
its thread was running an event loop, while real flows run on a running loop against
createos-local:

- the Python Interpreter under the backend and the CreateOS Sandbox component, in-process
  and inside an executor run (where the host answers the guest's bridge requests);
- pooled executor runs (the warm guest taken, the pool refilled, the run's guest deleted);
- a cold executor run whose spec is over the stdin threshold, so ``_Run.stage()`` uploads it.

The client is the real one, wrapped: every call goes to createos-local over HTTP as usual.
"""

from __future__ import annotations

import asyncio
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from langflow_sandbox_createos.core import connection
from langflow_sandbox_createos.core.native import load_native

from .conftest import middle_graph
from .flow_components.digest import Digest
from .parity.test_parity import HostMemory, both, memory
from .test_sandboxed_nodes import MICROVM_CODE, component_cls, host_backend, interpreter_graph, sandbox_graph

__all__ = ["component_cls", "host_backend", "memory"]  # fixtures, imported for this module's tests
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]

# The client's methods that wait on the control plane (every other one reads local state).
WAITS = frozenset(
    {
        "create", "delete", "download", "exec", "fork", "get", "get_egress", "list", "patch", "pause",
        "put_egress", "resume", "rootfs", "run_program", "shapes", "upload", "whoami",
    }
)  # fmt: skip


def _on_a_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


@dataclass
class LoopWatch:
    """Every waiting call made through a watched client: (method, on a loop's thread, where)."""

    calls: list[tuple[str, bool, str]] = field(default_factory=list)
    uploaded: list[str] = field(default_factory=list)  # the guest paths of the uploads

    def record(self, method: str, args: tuple[Any, ...]) -> None:
        on_loop = _on_a_loop()
        where = "".join(traceback.format_stack(limit=12)[:-2]) if on_loop else ""
        self.calls.append((method, on_loop, where))
        if method == "upload":
            self.uploaded.append(str(args[1]))

    def methods(self) -> set[str]:
        return {method for method, _, _ in self.calls}

    def on_the_loop(self) -> list[str]:
        return [
            f"{method} called on the event loop's thread:\n{where}"
            for method, on_loop, where in self.calls
            if on_loop
        ]


class _Watched:
    """The real native client, with each waiting call recorded before it is made."""

    def __init__(self, real: Any, watch: LoopWatch) -> None:
        self._real = real
        self._watch = watch

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._real, name)
        if name not in WAITS:
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self._watch.record(name, args)
            return attr(*args, **kwargs)

        return call


@pytest.fixture
def watch(host_backend: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[LoopWatch]:
    """Endpoints made from here on use a watched client (a fresh endpoint table: none made
    before this test is reused)."""
    native = load_native()
    real_client: Callable[..., Any] = native.Client
    seen = LoopWatch()
    monkeypatch.setattr(native, "Client", lambda *a, **kw: _Watched(real_client(*a, **kw), seen))
    table = connection._Endpoints()
    monkeypatch.setattr(connection, "endpoints", table)
    yield seen
    from langflow_sandbox_createos.backend.engine import create_backend
    from langflow_sandbox_createos.core.lease import wait_for_deletes

    wait_for_deletes(30)
    create_backend().shutdown()
    table.clear()


async def test_sandboxed_nodes_in_process_and_in_an_executor_run(
    watch: LoopWatch, memory: HostMemory, component_cls: type
) -> None:
    reference, ours = await both(lambda: interpreter_graph(MICROVM_CODE), memory, "loop-int")
    assert reference.outputs == ours.outputs
    reference, ours = await both(
        lambda: sandbox_graph(component_cls, python_code="print(6 * 7)"), memory, "loop-c"
    )
    assert reference.events == ours.events
    # the backend's runs, the component's guest, the executor's spec upload and deletes
    assert {"run_program", "create", "exec", "upload", "delete"} <= watch.methods(), watch.methods()
    violations = watch.on_the_loop()
    assert not violations, "\n\n".join(violations)


async def test_pooled_executor_runs(
    watch: LoopWatch, memory: HostMemory, monkeypatch: pytest.MonkeyPatch
) -> None:
    from langflow_sandbox_createos.core import settings
    from langflow_sandbox_createos.executor import pool

    from .conftest import chat_graph

    monkeypatch.setenv("CREATEOS_EXECUTOR_WARM_POOL", "1")
    # the test's own waits and its first take (which starts the pool) are off the loop too
    try:
        first = await asyncio.to_thread(
            pool.take, connection.endpoints.get(), settings.executor_settings(), {}
        )
        assert first[0] is None
        for session in ("loop-p1", "loop-p2"):
            assert await asyncio.to_thread(pool.pool().wait_full, 240)
            before = len(watch.calls)
            reference, ours = await both(chat_graph, memory, session)
            assert reference.outputs == ours.outputs
            assert watch.calls[before:], "the pooled run made no call through the watched client"
    finally:
        await asyncio.to_thread(pool.shutdown)
    assert {"create", "exec", "upload", "delete"} <= watch.methods(), watch.methods()
    violations = watch.on_the_loop()
    assert not violations, "\n\n".join(violations)


async def test_a_cold_run_whose_spec_is_uploaded(watch: LoopWatch, memory: HostMemory) -> None:
    """A cold executor run of a flow whose spec is over ``STDIN_SPEC_MAX_BYTES``: ``_Run.stage()``
    uploads it before the exec, and that upload waits off the loop too. Fails on ac8509d with
    the stage's upload moved onto the loop (issue 43: no flow of this file was that large)."""
    from langflow_sandbox_createos.executor import run as executor_run

    payload = "0123456789abcdef" * (executor_run.STDIN_SPEC_MAX_BYTES // 16 + 4096)  # 4 MiB + 64 KiB
    reference, ours = await both(lambda: middle_graph(Digest, "digest", payload=payload), memory, "loop-big")
    assert reference.outputs == ours.outputs
    staged = [path for path in watch.uploaded if path.startswith(f"{executor_run.SPEC_DIR}/")]
    assert len(staged) == 1, watch.uploaded  # the spec went as a file, through the watched client
    violations = watch.on_the_loop()
    assert not violations, "\n\n".join(violations)
