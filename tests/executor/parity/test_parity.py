"""Parity: each flow runs through lfx's in-process executor and through ours (createos-local,
a real guest), the way Graph.arun drives them (one Unit, the legacy path, a real lfx event
manager, a session id), and the two runs must agree on outputs, the sequence of event types,
and the chat messages stored with their session ids.

Chat memory on the host is a small in-memory store standing in for Langflow's database
(lfx alone persists nothing), with Langflow's ownership rules (`HostMemory`); both executors
write to and read from the same store, and the owner of every stored message is compared."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from lfx.events.event_manager import create_default_event_manager
from lfx.execution.backends.in_process import InProcessExecutor
from lfx.execution.types import RunComplete, Unit
from lfx.schema.data import Data
from lfx.schema.message import Message
from lfx.utils.sandbox.base import SandboxExecutionError

from langflow_sandbox_createos.executor import CreateOSExecutor

from ..conftest import drain
from ..flow_components.global_reader import GlobalReader
from ..flow_components.raiser import Raiser
from ..flow_components.request_reader import RequestReader

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(240)]

FLOW_ID = str(uuid.UUID(int=42))
USER_ID = str(uuid.UUID(int=7))  # Langflow always runs a flow as some user


class HostMemory:
    """Stands in for Langflow's message table behind lfx.memory's dispatch, with Langflow's
    ownership rules (`langflow.memory`): each message keeps the owner it was stored with, a read
    returns only its owner's messages, and while lfx's flow scope is bound (lfx binds it around
    each component; the executor's host binds it around each history read) a read or a write
    is held to the scope's flow and owner exactly as Langflow's `_message_scope` holds it."""

    def __init__(self) -> None:
        from lfx.memory import stubs

        self.stubs = stubs
        self.messages: list[Message] = []
        self.owners: dict[str, str | None] = {}  # message id -> the user_id it was stored with

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stubs, name)

    @staticmethod
    def _scope(flow_id: Any, user_id: Any) -> tuple[str | None, str | None]:
        """Langflow's `_message_scope`: the (flow, owner) a caller may use."""
        from lfx.memory import flow_context as fc

        requested_flow, requested_owner = fc.coerce_flow_id(flow_id), fc.coerce_flow_id(user_id)
        if not fc.has_current_flow_scope():
            return _text(requested_flow), _text(requested_owner)
        graph_flow = fc.coerce_flow_id(fc.get_current_flow_id())
        graph_owner = fc.get_current_message_owner_id()
        if graph_flow is None or graph_owner is None:
            return None, None
        executor = fc.get_current_message_executor_id()
        owner_ok = user_id is None or requested_owner in (graph_owner, executor)
        if (flow_id is not None and requested_flow != graph_flow) or not owner_ok:
            return None, None
        return _text(graph_flow), _text(graph_owner)

    def owner_of(self, message: Message) -> str | None:
        return self.owners.get(str(message.id))

    async def astore_message(
        self, message: Message, flow_id: Any = None, run_id: Any = None, user_id: Any = None
    ):
        from lfx.memory.flow_context import has_current_flow_scope, should_persist_messages

        if not should_persist_messages():  # as Langflow's own store does
            return [message]
        if has_current_flow_scope():
            flow_id, user_id = self._scope(flow_id, user_id)
            if flow_id is None or user_id is None:
                raise ValueError(
                    "A valid matching flow and message owner are required to store chat history."
                )
        if flow_id:
            message.flow_id = str(flow_id)
        own_id = getattr(message, "id", None)
        known = next((i for i, m in enumerate(self.messages) if own_id and str(m.id) == str(own_id)), None)
        if known is not None and self.owners.get(str(own_id)) == _text(user_id):
            self.messages[known] = message  # Langflow updates a stored message in place
            return [message]
        message.id = str(uuid.uuid4())
        self.owners[str(message.id)] = _text(user_id)
        self.messages.append(message)
        return [message]

    async def aupdate_messages(self, messages: Any) -> list[Message]:
        return messages if isinstance(messages, list) else [messages]

    async def delete_message(self, id_: str) -> None:
        self.messages = [m for m in self.messages if str(m.id) != str(id_)]

    async def aget_messages(
        self,
        session_id: Any = None,
        flow_id: Any = None,
        limit: Any = None,
        user_id: Any = None,
        sender: Any = None,
        **kw: Any,
    ):
        flow, owner = self._scope(flow_id, user_id)
        if flow is None or owner is None:  # Langflow answers an unscoped read with nothing
            return []
        found = [
            m
            for m in self.messages
            if (session_id is None or str(m.session_id) == str(session_id))
            and str(m.flow_id) == flow
            and self.owners.get(str(m.id)) == owner
            and (sender is None or m.sender == sender)
        ]
        if kw.get("order", "DESC") == "DESC":
            found = found[::-1]
        return found[: int(limit)] if limit else found


def _text(value: Any) -> str | None:
    return str(value) if value is not None else None


@pytest.fixture
def memory(monkeypatch: pytest.MonkeyPatch) -> HostMemory:
    import lfx.memory

    store = HostMemory()
    monkeypatch.setattr(lfx.memory, "_impl", lambda: store)
    return store


@dataclass
class Run:
    outputs: list[list[dict[str, Any]]]
    events: list[str]
    messages: list[tuple[str, str, str]]  # (sender, text, session id)
    # for each Message output: is its id the one the host's memory gave it when it was stored
    ids_stored: list[bool]
    owners: list[str | None]  # the owner each stored message was stored with


def _value(value: Any) -> Any:
    if isinstance(value, Message):
        return ("Message", value.text, value.sender, value.sender_name, str(value.session_id or ""))
    if isinstance(value, Data):
        return ("Data", json.dumps(value.data, sort_keys=True, default=str))
    return json.dumps(value, sort_keys=True, default=str)


async def run_flow(
    executor: Any,
    graph: Any,
    memory: HostMemory,
    session_id: str,
    inputs: list[dict[str, Any]],
    fallback_to_env_vars: bool = False,
) -> Run:
    queue: asyncio.Queue[Any] = asyncio.Queue()
    before = len(memory.messages)
    unit = Unit(
        graph=graph,
        inputs=inputs,
        runtime_options={
            "session_id": session_id,
            "event_manager": create_default_event_manager(queue),
            "outputs": [],
            "stream": False,
            "fallback_to_env_vars": fallback_to_env_vars,
            "_use_arun_legacy": True,
        },
    )
    items = await drain(executor.execute(unit))
    assert isinstance(items[-1], RunComplete)
    events = []
    while not queue.empty():
        _, body, _ = queue.get_nowait()
        events.append(json.loads(body)["event"])
    outputs = [
        [{key: _value(v) for key, v in (result.results or {}).items()} for result in run.outputs if result]
        for run in items[-1].outputs
    ]
    return _run_of(memory, before, outputs, events, items)


def _run_of(memory: HostMemory, before: int, outputs: Any, events: list[str], items: list[Any] | None) -> Run:
    """A run's record: its outputs and events, and what it stored in `memory` after `before`."""
    stored = [(m.sender, m.text, str(m.session_id)) for m in memory.messages[before:]]
    owners = [memory.owner_of(m) for m in memory.messages[before:]]
    ids = _ids_stored(items, memory, before) if items is not None else []
    return Run(outputs=outputs, events=events, messages=stored, ids_stored=ids, owners=owners)


def _ids_stored(items: list[Any], memory: HostMemory, before: int) -> list[bool]:
    """For each Message output of the run: is its id the one the host's memory gave it? (In-process
    a component goes on with the stored message, database id included.)"""
    host_ids = {str(m.id) for m in memory.messages[before:]}
    return [
        str(getattr(value, "id", None)) in host_ids
        for run in items[-1].outputs
        for result in run.outputs
        if result
        for value in (result.results or {}).values()
        if isinstance(value, Message)
    ]


async def both(
    make_graph: Any, memory: HostMemory, session_id: str, text: str = "hi", **options: Any
) -> tuple[Run, Run]:
    inputs = [{"input_value": text}]
    reference = await run_flow(InProcessExecutor(), make_graph(), memory, session_id, inputs, **options)
    ours = await run_flow(CreateOSExecutor(), make_graph(), memory, session_id, inputs, **options)
    return reference, ours


# --- flows: lfx's own components, no LLM -------------------------------------------------


def live_values_graph() -> Any:
    """lfx's contract unit: values set on live components, a handle field among them."""
    from lfx.components.input_output import ChatInput, ChatOutput
    from lfx.graph import Graph

    chat_in = ChatInput(_id="chat_input")
    chat_out = ChatOutput(input_value="test", _id="chat_output")
    chat_out.set(sender_name=chat_in.message_response)
    return Graph(chat_in, chat_out, flow_id=FLOW_ID, user_id=USER_ID)


def chain_graph(length: int = 20) -> Any:
    """ChatInput -> 18 Pass Message -> ChatOutput: 20 vertices."""
    from lfx.components.flow_controls.pass_message import PassMessageComponent
    from lfx.components.input_output import ChatInput, ChatOutput
    from lfx.graph import Graph

    chat_in = ChatInput(_id="chat_input")
    previous: Any = chat_in.message_response
    for index in range(length - 2):
        step = PassMessageComponent(_id=f"pass-{index:02d}")
        step.set(input_message=previous)
        previous = step.pass_message
    chat_out = ChatOutput(_id="chat_output")
    chat_out.set(input_value=previous)
    return Graph(chat_in, chat_out, flow_id=FLOW_ID, user_id=USER_ID)


def middle(component_cls: type, method: str) -> Any:
    from lfx.components.input_output import ChatInput, ChatOutput
    from lfx.graph import Graph

    chat_in = ChatInput(_id="chat_input")
    mid = component_cls(_id="middle")
    mid.set(input_value=chat_in.message_response)
    chat_out = ChatOutput(_id="chat_output")
    chat_out.set(input_value=getattr(mid, method))
    return Graph(chat_in, chat_out, flow_id=FLOW_ID, user_id=USER_ID)


def history_graph() -> Any:
    """Message History (retrieve) -> ChatOutput, which does not store what it shows."""
    from lfx.components.input_output import ChatOutput
    from lfx.components.models_and_agents.memory import MemoryComponent
    from lfx.graph import Graph

    history = MemoryComponent(_id="history")
    history.set(template="{sender}: {text}")
    chat_out = ChatOutput(_id="chat_output")
    chat_out.set(input_value=history.retrieve_messages_as_text, should_store_message=False)
    return Graph(history, chat_out, flow_id=FLOW_ID, user_id=USER_ID)


# --- the parity checks ---------------------------------------------------------------------


def assert_same(reference: Run, ours: Run) -> None:
    assert ours.outputs == reference.outputs
    assert ours.events == reference.events
    assert ours.messages == reference.messages
    assert ours.ids_stored == reference.ids_stored
    assert ours.owners == reference.owners


async def test_live_component_values_session_events_and_messages(
    executor_env: Any, memory: HostMemory
) -> None:
    reference, ours = await both(live_values_graph, memory, "s-42")
    assert_same(reference, ours)
    assert reference.outputs[0][0]["message"][1] == "test"  # the live value, not None
    assert ("User", "hi", "s-42") in ours.messages and ("Machine", "test", "s-42") in ours.messages
    assert ours.events == ["add_message", "add_message"]  # relayed from the guest, as in-process


async def test_twenty_vertex_chain(executor_env: Any, memory: HostMemory) -> None:
    reference, ours = await both(chain_graph, memory, "s-chain", "chained")
    assert_same(reference, ours)
    assert reference.outputs[0][0]["message"][1] == "chained"
    assert "add_message" in ours.events


async def test_message_history_sees_the_previous_run_of_the_session(
    executor_env: Any, memory: HostMemory
) -> None:
    await run_flow(
        CreateOSExecutor(), live_values_graph(), memory, "s-hist", [{"input_value": "remember me"}]
    )
    reference, ours = await both(history_graph, memory, "s-hist")
    assert_same(reference, ours)
    shown = ours.outputs[0][0]["message"][1]
    assert "User: remember me" in shown and "Machine: test" in shown


async def test_request_variables_cross(executor_env: Any, memory: HostMemory) -> None:
    def graph() -> Any:
        built = middle(RequestReader, "read")
        built.context = {"request_variables": {"GREETING": "hello-from-request"}}
        return built

    reference, ours = await both(graph, memory, "s-req", "q")
    assert_same(reference, ours)
    assert reference.outputs[0][0]["message"][1] == "q:hello-from-request"


async def test_global_variable_with_fallback_to_env_vars(
    executor_env: Any, memory: HostMemory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guest has no variable database: the variable reaches it only as an allowlisted
    environment variable, and then resolves as it does in-process."""
    monkeypatch.setenv("PARITY_GLOBAL_GREETING", "from-env")
    monkeypatch.setenv("CREATEOS_EXECUTOR_ENV", "PARITY_GLOBAL_GREETING")
    reference, ours = await both(
        lambda: middle(GlobalReader, "read"), memory, "s-var", "g", fallback_to_env_vars=True
    )
    assert_same(reference, ours)
    assert reference.outputs[0][0]["message"][1] == "g:from-env"


def router_graph() -> Any:
    """ChatInput -> Conditional Router (equals "yes") -> False branch -> ChatOutput."""
    from lfx.components.flow_controls.conditional_router import ConditionalRouterComponent
    from lfx.components.input_output import ChatInput, ChatOutput
    from lfx.graph import Graph

    chat_in = ChatInput(_id="chat_input")
    router = ConditionalRouterComponent(_id="router")
    router.set(input_text=chat_in.message_response, match_text="yes", operator="equals")
    on_false = ChatOutput(_id="out-false")
    on_false.set(input_value=router.false_response)
    return Graph(chat_in, on_false, flow_id=FLOW_ID, user_id=USER_ID)


async def test_conditional_router(executor_env: Any, memory: HostMemory) -> None:
    reference, ours = await both(router_graph, memory, "s-route", "no")
    assert_same(reference, ours)
    assert [m for m in ours.messages if m[0] == "Machine"] == [("Machine", "no", "s-route")]


async def test_a_component_that_raises(executor_env: Any, memory: HostMemory) -> None:
    inputs = [{"input_value": "x"}]
    with pytest.raises(ValueError, match="parity-boom on x") as in_process:
        await run_flow(InProcessExecutor(), middle(Raiser, "boom"), memory, "s-err", inputs)
    with pytest.raises(SandboxExecutionError, match="parity-boom on x") as ours:
        await run_flow(CreateOSExecutor(), middle(Raiser, "boom"), memory, "s-err", inputs)
    assert str(in_process.value).split(":")[0] in str(ours.value)  # "Error running graph"


# --- Loop: the streaming path (async_start), where lfx emits end_vertex per vertex ---------


def _feed_back(loop: Any, body_end: Any, output: str) -> None:
    """The body's end feeds the Loop's `item` input: an edge in the shape the canvas saves.
    (`loop.set(item=...)` is refused by the handle's declared types outside the canvas.)"""
    loop._edges.append(
        {
            "source": body_end.get_id(),
            "target": loop.get_id(),
            "data": {
                "sourceHandle": {
                    "dataType": type(body_end).__name__,
                    "id": body_end.get_id(),
                    "name": output,
                    "output_types": ["Message"],
                },
                "targetHandle": {
                    "dataType": "LoopComponent",
                    "id": loop.get_id(),
                    "name": "item",
                    "output_types": ["Data", "Message"],
                },
            },
        }
    )
    if body_end not in loop._components:
        loop._components.append(body_end)


def split_loop_flow(tag: str) -> dict[str, Any]:
    """Chat Input -> Split Text (",") -> Loop.item -> Chat Output -> back to Loop.item, as flow
    JSON (what Langflow stores and serves), its vertex ids ChatInput-<tag>1 .. ChatOutput-<tag>4."""
    from lfx.components.flow_controls.loop import LoopComponent
    from lfx.components.input_output import ChatInput, ChatOutput
    from lfx.components.processing.split_text import SplitTextComponent
    from lfx.graph import Graph

    chat_in = ChatInput(_id=f"ChatInput-{tag}1")
    split = SplitTextComponent(_id=f"SplitText-{tag}2")
    split.set(data_inputs=chat_in.message_response, separator=",", chunk_size=1, chunk_overlap=0)
    loop = LoopComponent(_id=f"LoopComponent-{tag}3")
    loop.set(data=split.split_text)
    body = ChatOutput(_id=f"ChatOutput-{tag}4")
    body.set(input_value=loop.item_output)
    _feed_back(loop, body, "message")
    return Graph(chat_in, body).dump()["data"]


def _rows() -> Any:
    from lfx.schema.dataframe import DataFrame

    return DataFrame([Data(text=f"row {i}") for i in range(3)])


def loop_item_only_graph() -> Any:
    """DataFrame -> Loop.item -> ChatOutput (stores each row) -> back to Loop.item."""
    from lfx.components.flow_controls.loop import LoopComponent
    from lfx.components.input_output import ChatOutput
    from lfx.graph import Graph

    loop = LoopComponent(_id="loop")
    loop.set(data=_rows())
    body = ChatOutput(_id="ChatOutput-body")
    body.set(input_value=loop.item_output)
    _feed_back(loop, body, "message")
    return Graph(loop, body, flow_id=FLOW_ID, user_id=USER_ID)


def loop_classic_parser_graph() -> Any:
    """DataFrame -> Loop.item -> Parser -> back to Loop.item; Loop.done -> a sink."""
    from lfx.components.flow_controls.loop import LoopComponent
    from lfx.components.processing.parser import ParserComponent
    from lfx.graph import Graph

    loop = LoopComponent(_id="loop")
    loop.set(data=_rows())
    parser = ParserComponent(_id="parser")
    parser.set(input_data=loop.item_output, pattern="Item: {text}", mode="Parser")
    _feed_back(loop, parser, "parsed_text")
    sink = LoopComponent(_id="done-sink")  # takes a DataFrame as it is
    sink.set(data=loop.done_output)
    return Graph(loop, sink, flow_id=FLOW_ID, user_id=USER_ID)


async def stream_flow(executor: Any, graph: Any, memory: HostMemory, session_id: str) -> Run:
    from lfx.schema.schema import InputValueRequest

    graph.session_id = session_id
    queue: asyncio.Queue[Any] = asyncio.Queue()
    before = len(memory.messages)
    unit = Unit(
        graph=graph,
        runtime_options={
            "initial_inputs": InputValueRequest(input_value=""),
            "event_manager": create_default_event_manager(queue),
        },
    )
    items = await drain(executor.execute(unit))
    assert isinstance(items[-1], RunComplete)
    events = []
    while not queue.empty():
        _, body, _ = queue.get_nowait()
        event = json.loads(body)
        build = event["data"].get("build_data") if isinstance(event["data"], dict) else None
        events.append(f"{event['event']}:{build['id']}" if build else event["event"])
    built = [
        [
            str(getattr(step.payload.vertex, "id", ""))
            for step in items[:-1]
            if hasattr(step.payload, "vertex")
        ]
    ]
    return _run_of(memory, before, built, events, items)


async def test_loop_item_only_topology(executor_env: Any, memory: HostMemory) -> None:
    reference = await stream_flow(InProcessExecutor(), loop_item_only_graph(), memory, "s-loop")
    ours = await stream_flow(CreateOSExecutor(), loop_item_only_graph(), memory, "s-loop")
    assert_same(reference, ours)
    # one body build and one stored message per row: the body got each item, not None
    assert reference.events.count("end_vertex:ChatOutput-body") == 3
    texts = [text for _, text, _ in ours.messages]
    assert len(texts) == 3 and all(f'"row {i}"' in text for i, text in enumerate(texts))


async def test_loop_classic_topology_feeding_a_parser(executor_env: Any, memory: HostMemory) -> None:
    reference = await stream_flow(InProcessExecutor(), loop_classic_parser_graph(), memory, "s-parse")
    ours = await stream_flow(CreateOSExecutor(), loop_classic_parser_graph(), memory, "s-parse")
    assert_same(reference, ours)
    assert reference.events.count("end_vertex:parser") == 3


async def test_loop_on_the_host_sends_each_iteration_to_a_guest(
    executor_env: Any, memory: HostMemory
) -> None:
    """The canvas path: the graph runs on the host, and only the Loop's per-iteration
    subgraphs reach the coordinator, which hands each one to our executor with its item."""
    from lfx.execution import (
        Coordinator,
        ExecutorRegistry,
        reset_default_coordinator,
        set_default_coordinator,
    )

    async def host_run(graph: Any) -> Run:
        graph.session_id = "s-canvas"
        queue: asyncio.Queue[Any] = asyncio.Queue()
        before = len(memory.messages)
        steps = [step async for step in graph.async_start(event_manager=create_default_event_manager(queue))]
        events = []
        while not queue.empty():
            _, body, _ = queue.get_nowait()
            event = json.loads(body)
            build = event["data"].get("build_data") if isinstance(event["data"], dict) else None
            events.append(f"{event['event']}:{build['id']}" if build else event["event"])
        built = [[str(step.vertex.id) for step in steps if hasattr(step, "vertex")]]
        return _run_of(memory, before, built, events, None)

    reference = await host_run(loop_item_only_graph())
    registry = ExecutorRegistry()
    registry.register(InProcessExecutor())
    registry.register(CreateOSExecutor())
    guests_before = {sb["id"] for sb in executor_env.sandboxes()}
    set_default_coordinator(Coordinator(registry=registry, executor_kind="createos"))
    try:
        ours = await host_run(loop_item_only_graph())
    finally:
        reset_default_coordinator()
    rows_per_guest = 3 if os.environ.get("CREATEOS_EXECUTOR_REUSE") == "true" else 1  # test_parity_reuse
    assert len({sb["id"] for sb in executor_env.sandboxes()} - guests_before) == 3 // rows_per_guest
    assert_same(reference, ours)
    assert len(ours.messages) == 3
