"""Fixtures for the CreateOS Sandbox component: the class as lfx's extension loader loads it,
a clean settings environment pointed at createos-local, and a helper that runs the component
inside a real lfx Graph the way Langflow runs a flow (a new graph per run)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from lfx.extension.loader import load_extension
from lfx.graph.graph.base import Graph

import langflow_sandbox_createos
from langflow_sandbox_createos.component import reuse
from langflow_sandbox_createos.core import connection, pool_keeper
from langflow_sandbox_createos.local.testing import LocalControlPlane

PACKAGE_DIR = Path(langflow_sandbox_createos.__file__).resolve().parent
REUSE_PREFIX = reuse.NAME_PREFIX
USER_ID = "00000000-0000-4000-8000-000000000001"  # the Langflow user of run_flow's runs

# Every variable the component reads, so a developer's shell cannot leak into a test.
COMPONENT_VARS = (
    "LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS",
    "CREATEOS_API_KEY",
    "CREATEOS_SANDBOX_ROOTFS",
    "CREATEOS_SANDBOX_SHAPE",
    "CREATEOS_SANDBOX_MAX_OUTPUT_BYTES",
    "CREATEOS_SANDBOX_MAX_GUESTS",
    "CREATEOS_SANDBOX_MAX_WAIT_SECONDS",
)


@pytest.fixture(scope="session")
def component_cls() -> type:
    """The component class exactly as Langflow gets it: loaded file by file by lfx."""
    result = load_extension(PACKAGE_DIR)
    assert result.errors == [], result.errors
    found = [c.klass for c in result.components if c.klass.display_name == "CreateOS Sandbox"]
    assert len(found) == 1, result.components
    return found[0]


@pytest.fixture
def env(
    cp: LocalControlPlane, createos_env: LocalControlPlane, monkeypatch: pytest.MonkeyPatch
) -> LocalControlPlane:
    for name in COMPONENT_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS", "true")
    reuse.guest_ids.clear()
    return cp


@pytest.fixture
def reuse_env(env: LocalControlPlane) -> Iterator[LocalControlPlane]:
    """`env`, plus deletion of the reused `lf-c-` guests the test created."""
    before = {sb["id"] for sb in env.live_sandboxes()}
    yield env
    for sb in env.live_sandboxes():
        if sb["id"] not in before and sb["status"] != "destroying":
            env.delete_sandbox(sb["id"])
            pool_keeper.release(sb["id"])  # gone: this process's keeper has nothing to delete
    reuse.guest_ids.clear()
    assert env.wait_until_no_live(timeout=10.0) == []


def client() -> Any:
    return connection.endpoints.get().client


@dataclass
class FlowRun:
    results: dict[str, Any]
    files: Any  # lfx DataFrame
    component: Any
    seconds: float


def run_flow(
    component_cls: type,
    *,
    flow_id: str = "flow-test",
    component_id: str = "CreateOSSandbox-t0001",
    user_id: str | None = USER_ID,
    session_id: str | None = None,
    principal: Any = None,
    end_user_id: str | None = None,
    **params: Any,
) -> FlowRun:
    """One flow run: a fresh component instance in a fresh Graph, as Langflow builds them
    (Langflow stamps the graph with the run's user id, and the run's session id)."""
    component = component_cls(_id=component_id, **params)
    graph = Graph(component, component, flow_id=flow_id, user_id=user_id)
    if session_id is not None:
        graph.session_id = session_id
    if principal is not None:  # Langflow stamps each served run with its execution principal
        graph.execution_principal = principal
    if end_user_id is not None:  # ... and, serving to end users, the gateway's end-user id
        graph.end_user_id = end_user_id

    async def go() -> None:
        async for _ in graph.async_start():
            pass

    started = time.monotonic()
    asyncio.run(go())
    seconds = time.monotonic() - started
    vertex = graph.get_vertex(component_id)
    return FlowRun(vertex.results["results"].data, vertex.results["files"], component, seconds)


def live_ids(plane: LocalControlPlane) -> set[str]:
    return {sb["id"] for sb in plane.live_sandboxes()}


def all_ids(plane: LocalControlPlane) -> set[str]:
    return {sb["id"] for sb in plane.sandboxes()}


class StallWatch:
    """A thread that wakes every `period` seconds and records how late it woke: the longest
    gap shows whether something held every thread of the process (the GIL) meanwhile."""

    def __init__(self, period: float = 0.02) -> None:
        self.period = period
        self.gaps: list[float] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._tick, daemon=True)

    def _tick(self) -> None:
        last = time.monotonic()
        while not self._done.is_set():
            time.sleep(self.period)
            now = time.monotonic()
            self.gaps.append(now - last)
            last = now

    @property
    def longest(self) -> float:
        return max(self.gaps, default=0.0)

    def __enter__(self) -> StallWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
