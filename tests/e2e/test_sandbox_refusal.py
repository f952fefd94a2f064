"""What Langflow makes of the backend's and the component's refusal (issue 45): a Python
Interpreter node (the sandbox backend) or a CreateOS Sandbox node (the component) whose line
is full is refused at once with ``SandboxUnavailableError`` chained from lfx's
``IntegrationError`` (503, retryable). Langflow's run API answers a failed run with
``integration_http_error`` of what the run raised, which walks the exception's chain; whether
that chain survives lfx's own wrapping of a node's failure (the vertex's build error, the
graph's) decides between a typed 503 and a generic 500.

Each surface runs in a fresh process of Langflow's own environment (.venv-langflow: Langflow
1.13 and lfx from PyPI, with this package installed as users install it): the real lfx graph
runs the node in-process, as Langflow's ``/api/v1/run`` runs a flow without the executor, with
the surface's one slot held and a hold of 600 s observed, and Langflow's own
``integration_http_error`` judges what the run raised (for the flow's owner, and for any other
caller). No server is started for this: the function is the run API's own, and the executor's
refusal is checked over HTTP on a real server in test_executor_shedding.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from backend.conftest import lfx_process_env  # tests/ is the import root

from .conftest import VENV_LANGFLOW

pytestmark = [pytest.mark.langflow, pytest.mark.timeout(600)]

CHILD = r"""
import asyncio, json, sys
from lfx.graph import Graph
from langflow.api.utils.execution_errors import integration_http_error
from langflow_sandbox_createos.core import admission

if sys.argv[1] == "backend":
    from lfx.components.utilities.python_repl_core import PythonREPLComponent as Node
    node, line = Node(_id="PythonREPLComponent-r0001", python_code="print(1)"), admission.backend_line
else:
    from langflow_sandbox_createos.components.createos.createos_sandbox import CreateOSSandboxComponent as Node
    node, line = Node(_id="CreateOSSandbox-r0002", python_code="print(1)"), admission.component_line
line.enter(1, lambda *_: None)  # the one slot, held by another run
line.observe_hold(600.0)  # runs here hold their slot 600 s
graph = Graph(node, node, flow_id="00000000-0000-4000-8000-0000000000aa", user_id="00000000-0000-4000-8000-0000000000bb")
report = {}
try:
    asyncio.run(graph.arun([{"input_value": "x"}]))
except Exception as exc:
    chain, link = [], exc
    while link is not None:
        chain.append(type(link).__name__)
        link = link.__cause__ or link.__context__
    report["chain"] = chain
    for who, expose in (("owner", True), ("other", False)):
        typed = integration_http_error(exc, expose_details=expose)
        report[who] = None if typed is None else {"status": typed.status_code, "detail": typed.detail}
print(json.dumps(report, default=str))
"""


def refusal(surface: str, cp: Any, tmp_path: Path) -> dict[str, Any]:
    env = lfx_process_env(cp, tmp_path)
    env.update(CREATEOS_SANDBOX_MAX_GUESTS="1", CREATEOS_SANDBOX_MAX_WAIT_SECONDS="30")
    done = subprocess.run(
        [str(VENV_LANGFLOW / "bin" / "python"), "-c", CHILD, surface],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0 and done.stdout.strip(), done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("surface", ["backend", "component"])
def test_a_refused_sandbox_run_is_a_503_from_langflows_run_api(surface: str, cp: Any, tmp_path: Path) -> None:
    before = {sb["id"] for sb in cp.sandboxes()}
    report = refusal(surface, cp, tmp_path)
    # lfx wraps the node's failure twice (the vertex's build error, then the graph's); the
    # refusal and its 503 are still on the chain Langflow walks
    assert report.get("chain", [])[-2:] == ["SandboxUnavailableError", "CapacityError"], report
    owner, other = report["owner"], report["other"]
    assert owner is not None and owner["status"] == 503, report
    detail = owner["detail"]
    assert detail["error_code"] == "provider-unavailable" and detail["provider"] == "createos", detail
    assert detail["retryable"] is True and detail["retry_after"] >= 600, detail
    assert "was refused at once" in detail["message"], detail
    assert "CREATEOS_SANDBOX_MAX_GUESTS=1" in detail["message"], detail
    assert "CREATEOS_SANDBOX_MAX_WAIT_SECONDS=30" in detail["message"], detail
    # a caller who does not own the flow gets Langflow's generic message, but the same status,
    # code, hint (the settings, when to retry) and retry_after
    assert other is not None and other["status"] == 503, report
    assert other["detail"]["message"] != detail["message"], other
    assert other["detail"]["hint"] == detail["hint"] and "CREATEOS_SANDBOX_MAX_GUESTS" in detail["hint"], (
        other
    )
    assert other["detail"]["retry_after"] == detail["retry_after"], other
    assert {sb["id"] for sb in cp.sandboxes()} == before  # nothing of it ran: no guest
