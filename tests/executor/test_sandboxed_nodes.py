"""Sandboxed nodes inside an executor run behave as on the host (issue 31).

The Python Interpreter (lfx's sandbox dispatch) and the CreateOS Sandbox component run in the
guest of a whole-flow run, where there is no CreateOS key and none of the host's settings:
the guest asks the host, which runs each call with its own backend or component engine under
the run's identity. Each flow runs in-process (the reference) and through our executor, and
both must agree (tests/executor/parity's machinery: outputs, event types, stored messages).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from backend.conftest import clean_backend_env, sandbox_view  # tests/ is the import root
from lfx.execution.backends.in_process import InProcessExecutor
from lfx.utils.python_repl_security import CodeExecutionDisabledError
from lfx.utils.sandbox.base import SandboxExecutionError

import langflow_sandbox_createos
from langflow_sandbox_createos.backend.engine import create_backend
from langflow_sandbox_createos.component import reuse
from langflow_sandbox_createos.executor import CreateOSExecutor, bridge

from .flow_components.bridge_abuser import BridgeAbuser
from .parity.test_parity import FLOW_ID, USER_ID, HostMemory, Run, assert_same, both, memory, run_flow

__all__ = ["memory"]  # the fixture, imported for this module's tests
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]

PACKAGE_DIR = Path(langflow_sandbox_createos.__file__).resolve().parent


@pytest.fixture
def host_backend(executor_env: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """This process as a Langflow host with LANGFLOW_SANDBOX_BACKEND=createos."""
    import lfx.utils.sandbox as dispatch
    from lfx.utils.sandbox import registry

    clean_backend_env(monkeypatch)
    if "createos" not in registry.known_sandbox_backends():
        registry.register_sandbox_backend("createos", create_backend)
    for module in (registry, dispatch):
        monkeypatch.setattr(module, "get_sandbox_backend", lambda: "createos")
    yield executor_env
    create_backend().shutdown()  # queued deletes finish before the control plane is checked


@pytest.fixture
def no_host_backend(executor_env: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    import lfx.utils.sandbox as dispatch
    from lfx.utils.sandbox import registry

    for module in (registry, dispatch):
        monkeypatch.setattr(module, "get_sandbox_backend", lambda: "none")
    return executor_env


@pytest.fixture
def component_cls() -> type:
    from lfx.extension.loader import load_extension

    result = load_extension(PACKAGE_DIR)
    return next(c.klass for c in result.components if c.klass.display_name == "CreateOS Sandbox")


def guests(cp: Any) -> list[dict[str, Any]]:
    return cp.sandboxes()


def names_since(cp: Any, before: set[str]) -> list[str]:
    return sorted(
        sb["name"].rsplit("-", 1)[0] for sb in cp.sandboxes() if sb["id"] not in before and sb.get("name")
    )


def shown(run: Run) -> dict[str, Any]:
    """The Data a Chat Output rendered (as a JSON block) in the run's first output."""
    text = run.outputs[0][0]["message"][1]
    return json.loads(text.removeprefix("```json").removesuffix("```"))


def interpreter_graph(code: str, imports: str = "math") -> Any:
    from lfx.components.input_output import ChatOutput
    from lfx.components.utilities.python_repl_core import PythonREPLComponent
    from lfx.graph import Graph

    repl = PythonREPLComponent(_id="PythonREPLComponent-br01", global_imports=imports, python_code=code)
    out = ChatOutput(_id="ChatOutput-br02")
    out.set(input_value=repl.run_python_repl)
    return Graph(repl, out, flow_id=FLOW_ID, user_id=USER_ID)


# top-level imports: refused by the restricted in-process mode, run by a sandbox backend
MICROVM_CODE = (
    "import json, os, sys\n"
    "print(json.dumps({'sandboxed': 'CREATEOS_SANDBOX_ID' in os.environ, 'sum': sum(range(10))}))\n"
)


async def test_python_interpreter_runs_on_the_hosts_backend(host_backend: Any, memory: HostMemory) -> None:
    before = {sb["id"] for sb in guests(host_backend)}
    reference, ours = await both(lambda: interpreter_graph(MICROVM_CODE), memory, "s-int")
    assert_same(reference, ours)
    assert json.loads(shown(reference)["result"]) == {"sandboxed": True, "sum": 45}  # imports and all
    # the reference ran one backend guest; ours the executor's guest and one backend guest
    assert names_since(host_backend, before) == ["lf", "lf", "lf-x"]


async def test_python_interpreter_errors_are_the_hosts(host_backend: Any, memory: HostMemory) -> None:
    """A failing program, and a backend that refuses (domain allowlist): the same outcome."""
    reference, ours = await both(
        lambda: interpreter_graph("import sys\nsys.exit('bad input')\n"), memory, "s-e"
    )
    assert_same(reference, ours)
    assert "bad input" in shown(reference)["error"]


async def test_a_refusing_host_backend_refuses_in_the_guest_too(
    host_backend: Any, memory: HostMemory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LANGFLOW_SANDBOX_ALLOWED_DOMAINS", "pypi.org")
    inputs = [{"input_value": "x"}]
    with pytest.raises(Exception, match="domain") as in_process:
        await run_flow(InProcessExecutor(), interpreter_graph("print(1)"), memory, "s-r", inputs)
    with pytest.raises(SandboxExecutionError) as ours:
        await run_flow(CreateOSExecutor(), interpreter_graph("print(1)"), memory, "s-r", inputs)
    assert str(in_process.value).splitlines()[-1] in str(ours.value)


async def test_without_a_host_backend_the_node_is_restricted_in_both(
    no_host_backend: Any, memory: HostMemory
) -> None:
    reference, ours = await both(lambda: interpreter_graph("print(math.floor(2.5) + 40)"), memory, "s-no")
    assert_same(reference, ours)
    assert shown(reference) == {"result": "42"}
    # what issue 31 saw under the executor while the host had a backend: here, with none, it
    # is the answer in-process too
    reference, ours = await both(lambda: interpreter_graph(MICROVM_CODE), memory, "s-no2")
    assert_same(reference, ours)
    assert "Imports are not allowed" in shown(reference)["error"]


async def test_the_hosts_code_execution_policy_holds_in_the_guest(
    host_backend: Any, memory: HostMemory, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lfx.utils.python_repl_security as security

    def blocked() -> None:
        raise CodeExecutionDisabledError(
            "Python code execution is disabled because block_code_interpreter_components is True."
        )

    monkeypatch.setattr(security, "ensure_code_execution_enabled", blocked)
    before = {sb["id"] for sb in guests(host_backend)}
    inputs = [{"input_value": "x"}]
    with pytest.raises(ValueError, match="block_code_interpreter_components") as in_process:
        await run_flow(InProcessExecutor(), interpreter_graph("print(1)"), memory, "s-p", inputs)
    with pytest.raises(SandboxExecutionError, match="block_code_interpreter_components") as ours:
        await run_flow(CreateOSExecutor(), interpreter_graph("print(1)"), memory, "s-p", inputs)
    assert "Error building Component Python Interpreter" in str(ours.value)
    assert str(in_process.value).splitlines()[-1] in str(ours.value)
    assert names_since(host_backend, before) == ["lf-x"]  # no backend guest: refused before


async def test_a_pooled_runner_answers_with_each_runs_view_of_the_host(
    host_backend: Any, memory: HostMemory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pooled runner points lfx's sandbox seams while it waits for its spec, before any run
    exists; what they answer is still each run's own view of the host (its backend, its
    code-execution verdict)."""
    import lfx.utils.python_repl_security as security

    from langflow_sandbox_createos.core import connection, settings
    from langflow_sandbox_createos.executor import pool

    def blocked() -> None:
        raise CodeExecutionDisabledError(
            "Python code execution is disabled because block_code_interpreter_components is True."
        )

    monkeypatch.setenv("CREATEOS_EXECUTOR_WARM_POOL", "1")
    try:
        assert pool.take(connection.endpoints.get(), settings.executor_settings(), {})[0] is None
        assert pool.pool().wait_full(240)
        before = {sb["id"] for sb in guests(host_backend)}
        reference, ours = await both(lambda: interpreter_graph(MICROVM_CODE), memory, "s-pool")
        assert_same(reference, ours)
        assert json.loads(shown(ours)["result"]) == {"sandboxed": True, "sum": 45}
        # two backend guests (the reference's, ours through the host) and no cold executor guest
        assert [n for n in names_since(host_backend, before) if n != "lf-xw"] == ["lf", "lf"]
        assert pool.pool().wait_full(240)
        monkeypatch.setattr(security, "ensure_code_execution_enabled", blocked)
        before = {sb["id"] for sb in guests(host_backend)}
        with pytest.raises(SandboxExecutionError, match="block_code_interpreter_components"):
            await run_flow(
                CreateOSExecutor(), interpreter_graph("print(1)"), memory, "s-pool2", [{"input_value": "x"}]
            )
        assert [n for n in names_since(host_backend, before) if n != "lf-xw"] == []
    finally:
        pool.shutdown()


# --- the CreateOS Sandbox component --------------------------------------------------------

PER_RUN = ("sandbox_id", "exec_ms")


def sandbox_graph(component_cls: type, **params: Any) -> Any:
    from lfx.components.input_output import ChatOutput
    from lfx.graph import Graph

    node = component_cls(_id="CreateOSSandbox-br11", **params)
    out = ChatOutput(_id="ChatOutput-br12")
    out.set(input_value=node.run_sandbox)
    return Graph(node, out, flow_id=FLOW_ID, user_id=USER_ID)


def masked(run: Run) -> list[Any]:
    """The Results (rendered by Chat Output as JSON) minus what differs per run."""
    body = shown(run)
    return [{k: v for k, v in body.items() if k not in PER_RUN}, run.events, [m[0] for m in run.messages]]


FILES_CODE = (
    "import pathlib\n"
    "art = pathlib.Path('/workspace/artifacts')\n"
    "art.mkdir(parents=True, exist_ok=True)\n"
    "(art / 'a.txt').write_text('alpha')\n"
    "(art / 'b.bin').write_bytes(bytes(range(5)))\n"
    "print('wrote 2')\n"
)


@pytest.mark.parametrize(
    ("params", "keeps"),
    [
        ({"python_code": "print(6 * 7)"}, 0),
        ({"python_code": FILES_CODE, "collect_artifacts": True}, 0),
        ({"command": "echo from a shell; echo err >&2"}, 0),
        ({"python_code": "print('reused')", "session_mode": "flow"}, 1),
    ],
    ids=["python", "return-files", "command", "reuse-flow"],
)
async def test_the_component_runs_on_the_host_engine(
    host_backend: Any, memory: HostMemory, component_cls: type, params: dict[str, Any], keeps: int
) -> None:
    reuse.guest_ids.clear()
    before = {sb["id"] for sb in guests(host_backend)}
    reference, ours = await both(lambda: sandbox_graph(component_cls, **params), memory, "s-comp")
    results = shown(ours)
    if keeps:  # the in-process run made the reused guest; the executor's run found that very one
        assert (shown(reference)["reused_guest"], results["reused_guest"]) == (False, True)
        assert shown(reference)["sandbox_id"] == results["sandbox_id"]
        results["reused_guest"] = False
    assert masked(reference)[1:] == masked(ours)[1:]
    assert masked(reference)[0] == {k: v for k, v in results.items() if k not in PER_RUN}
    assert results["exit_code"] == 0 and results["exec_ms"] is not None, results
    if params.get("collect_artifacts"):
        assert results["artifact_count"] == 2
    made = names_since(host_backend, before)
    reused = [sb for sb in host_backend.live_sandboxes() if sb["name"].startswith(reuse.NAME_PREFIX)]
    if keeps:  # in-process and in the guest: the same reused guest (the host's identity)
        assert len(reused) == 1, reused
        for sb in reused:
            host_backend.delete_sandbox(sb["id"])
    else:
        assert made.count("lf-c") == 2 and made.count("lf-x") == 1, made
    assert not [sb for sb in host_backend.live_sandboxes() if sb["status"] != "destroying"]


async def test_the_component_files_output_crosses(
    host_backend: Any, memory: HostMemory, component_cls: type
) -> None:
    from lfx.components.input_output import ChatOutput
    from lfx.components.processing.parser import ParserComponent
    from lfx.graph import Graph

    def graph() -> Any:
        node = component_cls(_id="CreateOSSandbox-br21", python_code=FILES_CODE, collect_artifacts=True)
        parse = ParserComponent(_id="Parser-br22")
        parse.set(input_data=node.collected_files, pattern="{path}={size}", mode="Parser")
        out = ChatOutput(_id="ChatOutput-br23")
        out.set(input_value=parse.parse_combined_text)
        return Graph(node, out, flow_id=FLOW_ID, user_id=USER_ID)

    reference, ours = await both(graph, memory, "s-files")
    assert_same(reference, ours)
    assert sorted(reference.outputs[0][0]["message"][1].split("\n")) == ["a.txt=5", "b.bin=5"]


async def test_a_guest_cannot_ask_for_runs_its_nodes_would_not_make(
    host_backend: Any, memory: HostMemory, component_cls: type
) -> None:
    """Hostile flow code finds the runner's bridge and forges requests: each is refused, or
    runs exactly what the node's own settings say (program, network, shape, reuse, image)."""
    from lfx.components.input_output import ChatOutput
    from lfx.graph import Graph

    def graph() -> Any:
        target = component_cls(_id="CreateOSSandbox-abuse", python_code="print('node program')")
        abuser = BridgeAbuser(_id="BridgeAbuser-abuse", target="CreateOSSandbox-abuse")
        abuser.set(seen=target.run_sandbox)
        out = ChatOutput(_id="ChatOutput-abuse")
        out.set(input_value=abuser.abuse)
        return Graph(target, out, flow_id=FLOW_ID, user_id=USER_ID)

    before = {sb["id"] for sb in guests(host_backend)}
    ours = await run_flow(CreateOSExecutor(), graph(), memory, "s-abuse", [])
    report = json.loads(next(m[1] for m in ours.messages if m[1].startswith("{")))
    refused = "SandboxExecutionError: CreateOS executor: sandbox request refused"
    assert report["not_a_sandbox_node"].startswith(refused), report
    assert report["unknown_node"].startswith(refused), report
    assert report["backend_from_chat_output"].startswith(refused), report
    assert report["unknown_request"].startswith(refused), report
    forged = report["forged_settings"]
    assert forged["stdout"] == "node program\n", forged  # the node's program, not the guest's
    guest = sandbox_view(host_backend, forged["sandbox_id"])
    assert guest["name"].startswith(reuse.NAME_PREFIX) and guest["id"] not in before
    # the node's settings: no network, the default shape and image, no reuse
    assert (guest["egress"], guest["shape"], guest["rootfs"]) == (["240.0.0.0/4"], "s-2vcpu-4gb", "devbox:1")
    made = [sb for sb in host_backend.sandboxes() if sb["id"] not in before]
    assert not [sb for sb in made if sb["status"] not in ("destroyed", "destroying")], made


def test_guest_view_reports_the_hosts_backend_and_verdict(host_backend: Any) -> None:
    view = bridge.guest_view()
    assert view == {"backend": "createos", "policy": None}
