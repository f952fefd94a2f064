"""What a run may reach on the host is what its own flow may reach in-process (issue 41).

Flow code in a guest is hostile: it calls the host's entry points (history reads, sandbox
requests) with arguments of its own choosing. Each check runs the same flow in-process (the
reference, under lfx's own flow scope and the host memory's ownership rules) and through the
executor, and compares; the hostile ones also say what the guest must not get.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

import pytest
from lfx.execution.backends.in_process import InProcessExecutor
from lfx.schema.message import Message

from langflow_sandbox_createos.executor import CreateOSExecutor

from .flow_components.code_swapper import CodeSwapper
from .flow_components.credential_judge import CredentialJudge
from .flow_components.global_reader import GlobalReader
from .flow_components.history_thief import HistoryThief
from .parity.test_parity import (
    FLOW_ID,
    USER_ID,
    HostMemory,
    assert_same,
    both,
    live_values_graph,
    memory,
    middle,
    run_flow,
)
from .test_sandboxed_nodes import host_backend

__all__ = ["host_backend", "memory"]  # fixtures, imported for this module's tests
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]

OTHER_FLOW = str(uuid.UUID(int=43))
OTHER_USER = str(uuid.UUID(int=8))


async def _seed(memory: HostMemory, text: str, session: str, flow_id: str, user_id: str) -> None:
    """A message some earlier run stored (outside any flow scope: Langflow's own write)."""
    await memory.astore_message(
        Message(text=text, sender="User", sender_name="User", session_id=session),
        flow_id=flow_id,
        user_id=user_id,
    )


def thief_graph() -> Any:
    from lfx.components.input_output import ChatInput, ChatOutput
    from lfx.graph import Graph

    chat_in = ChatInput(_id="chat_input")
    thief = HistoryThief(_id="thief", other_flow=OTHER_FLOW, other_session="s-other", other_user=OTHER_USER)
    thief.set(input_value=chat_in.message_response)
    chat_out = ChatOutput(_id="chat_output")
    chat_out.set(input_value=thief.steal, should_store_message=False)
    return Graph(chat_in, chat_out, flow_id=FLOW_ID, user_id=USER_ID)


async def test_hostile_history_reads_cover_only_the_runs_flow_and_owner(
    executor_env: Any, memory: HostMemory
) -> None:
    """Another flow's messages (by its id, by its session, both), another user's messages in this
    very flow and session, and an unfiltered read: the guest gets what lfx's flow scope gives a
    component in-process, and no secret. Fails on ac8509d (the host read the flow the guest
    named, outside lfx's flow scope: "SECRET of another flow" came back)."""
    await _seed(memory, "SECRET of another flow", "s-other", OTHER_FLOW, USER_ID)
    await _seed(memory, "SECRET of another user", "s-theft", FLOW_ID, OTHER_USER)
    await _seed(memory, "own history", "s-theft", FLOW_ID, USER_ID)
    reference, ours = await both(thief_graph, memory, "s-theft", "who am i")
    assert_same(reference, ours)
    report = json.loads(ours.outputs[0][0]["message"][1])
    assert "SECRET" not in json.dumps(report), report
    assert report["by_flow_id"] == report["by_flow_and_session"] == report["by_user"] == [], report
    assert report["by_session"] == [], report  # the other flow's session, read within this flow
    assert "own history" in report["no_filter"] and "who am i" in report["no_filter"], report


def history_for(user_id: str) -> Any:
    from lfx.components.input_output import ChatOutput
    from lfx.components.models_and_agents.memory import MemoryComponent
    from lfx.graph import Graph

    history = MemoryComponent(_id="history")
    history.set(template="{text}")
    chat_out = ChatOutput(_id="chat_output")
    chat_out.set(input_value=history.retrieve_messages_as_text, should_store_message=False)
    return Graph(history, chat_out, flow_id=FLOW_ID, user_id=user_id)


async def test_message_history_reads_only_its_owners_messages(executor_env: Any, memory: HostMemory) -> None:
    """Two users of one flow, one session id: each one's Message History shows their own
    messages only, in-process and under the executor."""
    await _seed(memory, "from user A", "s-shared", FLOW_ID, USER_ID)
    await _seed(memory, "from user B", "s-shared", FLOW_ID, OTHER_USER)
    for user, own, other in (
        (USER_ID, "from user A", "from user B"),
        (OTHER_USER, "from user B", "from user A"),
    ):
        reference, ours = await both(lambda user=user: history_for(user), memory, "s-shared")
        assert_same(reference, ours)
        shown = ours.outputs[0][0]["message"][1]
        assert own in shown and other not in shown, (user, shown)


async def test_stored_messages_keep_the_runs_owner(executor_env: Any, memory: HostMemory) -> None:
    """Every message a guest stores is stored under the run's owner, as in-process."""

    def chat_for(user_id: str) -> Any:
        graph = live_values_graph()
        graph.user_id = user_id
        return graph

    for user in (USER_ID, OTHER_USER):
        reference, ours = await both(lambda user=user: chat_for(user), memory, f"s-own-{user[-4:]}", "x")
        assert_same(reference, ours)
        assert ours.owners and set(ours.owners) == {user}, ours.owners


async def test_a_fixed_python_interpreter_runs_its_own_code(
    host_backend: Any, memory: HostMemory, caplog: pytest.LogCaptureFixture
) -> None:
    """A Python Interpreter whose code is a plain field of the flow: hostile flow code in the
    guest asks the host to run other code (and an environment) for it, and the host runs the
    node's own code, as in-process. Fails on ac8509d (the guest's code ran: "guest code yes")."""
    from lfx.components.input_output import ChatOutput
    from lfx.components.utilities.python_repl_core import PythonREPLComponent
    from lfx.graph import Graph

    def graph() -> Any:
        repl = PythonREPLComponent(
            _id="PythonREPLComponent-own", global_imports="math", python_code="print('node code')"
        )
        swapper = CodeSwapper(_id="CodeSwapper-own", target="PythonREPLComponent-own")
        swapper.set(seen=repl.run_python_repl)
        out = ChatOutput(_id="ChatOutput-own")
        out.set(input_value=swapper.swap)
        return Graph(repl, out, flow_id=FLOW_ID, user_id=USER_ID)

    caplog.set_level(logging.WARNING, logger="langflow_sandbox_createos.executor")
    ours = await run_flow(CreateOSExecutor(), graph(), memory, "s-own-code", [])
    report = json.loads(next(text for _, text, _ in ours.messages if text.startswith("{")))
    assert report == {"stdout": "node code\n"}, report
    assert any("the node's own code ran" in r.getMessage() for r in caplog.records)


async def test_variables_resolve_from_the_hosts_environment_without_a_database(
    executor_env: Any, memory: HostMemory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """lfx with no database (`lfx run`): in-process a load_from_db field reads this process's
    environment. Under the executor the host sends exactly what that would read, with no
    CREATEOS_EXECUTOR_ENV, and never logs it. Fails on ac8509d ("g:None")."""
    secret = "greeting-" + uuid.uuid4().hex
    monkeypatch.setenv("PARITY_GLOBAL_GREETING", secret)
    caplog.set_level(logging.DEBUG)
    reference, ours = await both(
        lambda: middle(GlobalReader, "read"), memory, "s-env", "g", fallback_to_env_vars=True
    )
    assert_same(reference, ours)
    assert ours.outputs[0][0]["message"][1] == f"g:{secret}"
    leaked = [r.name for r in caplog.records if secret in r.getMessage()]
    assert not leaked, leaked


async def test_a_served_flows_no_env_fallback_holds_in_the_guest(
    executor_env: Any, memory: HostMemory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`no_env_fallback` in the graph's context (lfx's serving plane): neither run reads the
    environment, not even a variable CREATEOS_EXECUTOR_ENV forwards to the guest, so the
    field is None in both and lfx refuses it with the same error."""
    monkeypatch.setenv("PARITY_GLOBAL_GREETING", "from-env")
    monkeypatch.setenv("CREATEOS_EXECUTOR_ENV", "PARITY_GLOBAL_GREETING")

    def graph() -> Any:
        built = middle(GlobalReader, "read")
        built.context = {"no_env_fallback": True}
        return built

    errors = []
    for executor in (InProcessExecutor(), CreateOSExecutor()):
        with pytest.raises(Exception) as caught:  # each executor raises its own class
            await run_flow(
                executor, graph(), memory, "s-noenv", [{"input_value": "g"}], fallback_to_env_vars=True
            )
        errors.append(str(caught.value))
    # the field resolved to None in both runs, and lfx refused it the same way
    assert all("Invalid value type <class 'NoneType'>" in text for text in errors), errors


@pytest.mark.parametrize("allowlisted", [False, True], ids=["not-allowlisted", "allowlisted"])
async def test_a_key_from_the_servers_environment_is_judged_as_the_servers_in_the_guest(
    executor_env: Any, memory: HostMemory, monkeypatch: pytest.MonkeyPatch, allowlisted: bool
) -> None:
    """A load_from_db key that resolves to a value of the server's environment may go only to an
    endpoint the operator sanctioned (lfx's credential guard, which compares the key with every
    value of os.environ). The guest must judge it as the server would: refused to a tenant's
    endpoint, allowed to an allowlisted one. Without the host's environment values and policy
    in the guest's environment, the guest would send the operator's key anywhere."""
    monkeypatch.setenv("PARITY_PROVIDER_KEY", "sk-operator-" + uuid.uuid4().hex)
    if allowlisted:
        monkeypatch.setenv("LANGFLOW_PROVIDER_CREDENTIAL_ALLOWED_HOSTS", "http://10.213.1.2")
    else:
        monkeypatch.delenv("LANGFLOW_PROVIDER_CREDENTIAL_ALLOWED_HOSTS", raising=False)
    reference, ours = await both(
        lambda: middle(CredentialJudge, "judge"),
        memory,
        f"s-judge-{allowlisted}",
        "j",
        fallback_to_env_vars=True,
    )
    assert_same(reference, ours)
    verdict = ours.outputs[0][0]["message"][1]
    assert verdict.startswith("allowed (a key)" if allowlisted else "refused: Refusing to send"), verdict


class _RecordingUploads:
    """The real native client; every file uploaded through it is recorded (path, bytes)."""

    def __init__(self, real: Any, uploads: list[tuple[str, bytes]]) -> None:
        self._real = real
        self._uploads = uploads

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._real, name)
        if name != "upload":
            return attr

        def upload(sandbox_id: str, path: str, data: bytes, *args: Any, **kwargs: Any) -> Any:
            self._uploads.append((path, bytes(data)))
            return attr(sandbox_id, path, data, *args, **kwargs)

        return upload


async def test_a_large_specs_file_never_holds_the_variables(
    executor_env: Any, memory: HostMemory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spec over 4 MiB is uploaded to the guest's /workspace; the run user's variables stay on
    the exec's stdin, and the field still resolves in the guest."""
    from langflow_sandbox_createos.core import connection
    from langflow_sandbox_createos.core.native import load_native

    secret = "large-spec-secret-" + uuid.uuid4().hex
    monkeypatch.setenv("PARITY_GLOBAL_GREETING", secret)
    uploads: list[tuple[str, bytes]] = []
    native = load_native()
    real_client = native.Client
    monkeypatch.setattr(native, "Client", lambda *a, **kw: _RecordingUploads(real_client(*a, **kw), uploads))
    monkeypatch.setattr(connection, "endpoints", connection._Endpoints())

    def graph() -> Any:
        built = middle(GlobalReader, "read")
        built.context = {"padding": "p" * (5 * 1024 * 1024)}  # the spec goes over 4 MiB
        return built

    ours = await run_flow(
        CreateOSExecutor(), graph(), memory, "s-large", [{"input_value": "g"}], fallback_to_env_vars=True
    )
    assert ours.outputs[0][0]["message"][1] == f"g:{secret}"
    specs = [data for path, data in uploads if path.startswith("/workspace/.createos-run/")]
    assert specs and len(specs[0]) > 4 * 1024 * 1024, [path for path, _ in uploads]
    assert not any(secret.encode() in data for _, data in uploads)
