"""The executor as lfx itself finds it: a fresh process, LANGFLOW_EXECUTOR_KIND=createos and the
lfx.executors entry point, compared with the same process running in-process."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from .conftest import PYTHON, chat_graph, child_env

pytestmark = pytest.mark.timeout(300)

ARUN_CHILD = r"""
import asyncio, json, sys
from lfx.graph import Graph
from lfx.graph.schema import RunOutputs

async def main():
    graph = Graph.from_payload(json.load(open(sys.argv[1])))
    runs = await graph.arun([{"input_value": "from arun"}])
    assert all(isinstance(r, RunOutputs) for r in runs), [type(r) for r in runs]
    from lfx.execution import get_default_coordinator
    print(json.dumps({
        "kind": get_default_coordinator()._executor_kind,
        "texts": [o.results["message"].text for r in runs for o in r.outputs],
        "inputs": [r.inputs for r in runs],
    }))

asyncio.run(main())
"""


def _flow_file(tmp_path: Path) -> Path:
    path = tmp_path / "flow.json"
    path.write_text(json.dumps(chat_graph().dump()))
    return path


def _run(argv: list[str], env: dict[str, str], tmp_path: Path) -> dict[str, Any]:
    done = subprocess.run(
        argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _executor_guests(cp: Any) -> list[dict[str, Any]]:
    return [sb for sb in cp.sandboxes() if (sb.get("name") or "").startswith("lf-x-")]


def test_lfx_run_matches_in_process(executor_env: Any, tmp_path: Path) -> None:
    flow = _flow_file(tmp_path)
    argv = [PYTHON, "-m", "lfx", "run", str(flow), "hello there", "--format", "json"]
    before = {sb["id"] for sb in _executor_guests(executor_env)}

    local = _run(argv, child_env(executor_env, tmp_path), tmp_path)
    assert not {sb["id"] for sb in _executor_guests(executor_env)} - before  # in-process: no guest

    remote = _run(argv, child_env(executor_env, tmp_path, LANGFLOW_EXECUTOR_KIND="createos"), tmp_path)
    ran = [sb for sb in _executor_guests(executor_env) if sb["id"] not in before]
    assert len(ran) == 1, ran  # the guest that ran the flow
    assert executor_env.wait_until_no_live(timeout=5.0) == []

    fields = ("result", "type", "component", "component_id", "success")
    assert {k: remote.get(k) for k in fields} == {k: local.get(k) for k in fields}
    assert remote["result"] == "hello there"


def test_graph_arun_returns_run_outputs(executor_env: Any, tmp_path: Path) -> None:
    flow = _flow_file(tmp_path)
    argv = [PYTHON, "-c", ARUN_CHILD, str(flow)]
    local = _run(argv, child_env(executor_env, tmp_path), tmp_path)
    remote = _run(argv, child_env(executor_env, tmp_path, LANGFLOW_EXECUTOR_KIND="createos"), tmp_path)
    assert (local["kind"], remote["kind"]) == ("in-process", "createos")
    assert remote["texts"] == local["texts"] == ["from arun"]
    assert remote["inputs"] == local["inputs"]
    assert executor_env.wait_until_no_live(timeout=5.0) == []
