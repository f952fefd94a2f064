"""Fixtures for the whole-flow executor: settings pointed at createos-local, real flows
built from real lfx components, and a way for a fresh process to discover our entry point."""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from langflow_sandbox_createos.executor import CreateOSExecutor
from langflow_sandbox_createos.executor import spec as executor_spec
from langflow_sandbox_createos.local.images import TEMPLATE_NAME

REPO = Path(__file__).resolve().parents[2]

# The guest image every executor test runs on: the ONE place to change it. A rootfs with lfx
# installed: createos-local's langflow-lfx template (devbox:1 is a plain image without lfx).
EXECUTOR_ROOTFS = TEMPLATE_NAME

EXECUTOR_VARS = (
    "CREATEOS_API_KEY",
    "CREATEOS_SANDBOX_ROOTFS",
    "CREATEOS_SANDBOX_MAX_OUTPUT_BYTES",
    "CREATEOS_EXECUTOR_SHAPE",
    "CREATEOS_EXECUTOR_TIMEOUT_SECONDS",
    "CREATEOS_EXECUTOR_EGRESS",
    "CREATEOS_EXECUTOR_INSTALL_LFX",
    "CREATEOS_EXECUTOR_PIP",
    "CREATEOS_EXECUTOR_LFX_VERSION",
    "CREATEOS_EXECUTOR_ENV",
    "CREATEOS_EXECUTOR_WARM_POOL",
    "CREATEOS_EXECUTOR_WARM_POOL_IDLE_SECONDS",
    "CREATEOS_EXECUTOR_MAX_GUESTS",
    "CREATEOS_EXECUTOR_MAX_WAIT_SECONDS",
    "CREATEOS_EXECUTOR_REUSE",
    "CREATEOS_EXECUTOR_REUSE_IDLE_SECONDS",
    "CREATEOS_EXECUTOR_REUSE_MAX_RUNS",
    "LANGFLOW_EXECUTOR_KIND",
)


@pytest.fixture
def executor_env(cp: Any, createos_env: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The control plane, with every executor setting at its default except a test-sized timeout
    and the template rootfs (set by ``createos_env``)."""
    for name in EXECUTOR_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CREATEOS_EXECUTOR_TIMEOUT_SECONDS", "180")
    monkeypatch.setenv("CREATEOS_EXECUTOR_ROOTFS", EXECUTOR_ROOTFS)
    executor_spec.guest_knowledge.clear()
    return cp


@pytest.fixture
def executor(executor_env: Any) -> CreateOSExecutor:
    return CreateOSExecutor()


# --- flows --------------------------------------------------------------------------------


def chat_graph() -> Any:
    """The contract suite's reference unit: ChatInput -> ChatOutput."""
    from lfx.components.input_output import ChatInput, ChatOutput
    from lfx.graph import Graph

    chat_in = ChatInput(_id="chat-in")
    chat_out = ChatOutput(_id="chat-out")
    chat_out.set(input_value=chat_in.message_response)
    return Graph(chat_in, chat_out)


def middle_graph(component_cls: type, method: str, vertex_id: str = "middle", **params: Any) -> Any:
    """ChatInput -> <custom component, given `params`> -> ChatOutput."""
    from lfx.components.input_output import ChatInput, ChatOutput
    from lfx.graph import Graph

    chat_in = ChatInput(_id="chat-in")
    middle = component_cls(_id=vertex_id)
    middle.set(input_value=chat_in.message_response, **params)
    chat_out = ChatOutput(_id="chat-out")
    chat_out.set(input_value=getattr(middle, method))
    return Graph(chat_in, chat_out)


def chat_unit(text: str = "hi") -> Any:
    from lfx.execution.types import Unit
    from lfx.schema.schema import InputValueRequest

    return Unit(graph=chat_graph(), runtime_options={"initial_inputs": InputValueRequest(input_value=text)})


@pytest.fixture
def unit_factory() -> Callable[[], Any]:
    return chat_unit


async def drain(stream: Any) -> list[Any]:
    return [item async for item in stream]


# --- a fresh process that discovers our entry point ----------------------------------------


def _declared_entry_point() -> str:
    text = (REPO / "pyproject.toml").read_text()
    section = text.split('[project.entry-points."lfx.executors"]', 1)[1].split("[", 1)[0]
    match = re.search(r'^createos\s*=\s*"([^"]+)"', section, re.MULTILINE)
    assert match, "pyproject declares no lfx.executors entry point named createos"
    return match.group(1)


def entry_point_path(tmp_path: Path) -> str:
    """A sys.path entry that makes `importlib.metadata` see the entry point pyproject declares,
    for a checkout that is not pip-installed (an installed package already provides it)."""
    from importlib.metadata import entry_points

    if any(ep.name == "createos" for ep in entry_points(group="lfx.executors")):
        return str(REPO)
    dist = tmp_path / "dist" / "langflow_sandbox_createos_checkout-0.0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: langflow-sandbox-createos-checkout\nVersion: 0.0.0\n"
    )
    (dist / "entry_points.txt").write_text(f"[lfx.executors]\ncreateos = {_declared_entry_point()}\n")
    return os.pathsep.join([str(REPO), str(tmp_path / "dist")])


def child_env(cp: Any, tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TMPDIR")}
    env.update(
        HOME=str(tmp_path),
        # not "<cwd>/langflow": a directory by that name on sys.path would pose as Langflow
        LANGFLOW_CONFIG_DIR=str(tmp_path / "lf-config"),
        PYTHONPATH=entry_point_path(tmp_path),
        CREATEOS_SANDBOX_API_KEY=cp.api_key,
        CREATEOS_SANDBOX_BASE_URL=cp.url,
        CREATEOS_EXECUTOR_TIMEOUT_SECONDS="180",
        CREATEOS_EXECUTOR_ROOTFS=EXECUTOR_ROOTFS,
        LANGFLOW_DO_NOT_TRACK="true",
    )
    env.update(extra)
    return env


PYTHON = sys.executable


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def served_by_reused_guests(seconds: float = 30.0) -> int:
    """How many runs this process's reused guests served, once each run has given its guest
    back (a run's guest goes back once its exec has ended); the guests are deleted."""
    from langflow_sandbox_createos.executor import reuse

    deadline = time.monotonic() + seconds
    while any(guest.runs for guest in reuse.domains.guests()) and time.monotonic() < deadline:
        time.sleep(0.05)
    served = sum(guest.served for guest in reuse.domains.guests())
    reuse.domains.shutdown()
    return served
