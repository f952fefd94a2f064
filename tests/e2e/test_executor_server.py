"""End to end with the whole-flow executor switched on: ``make run EXECUTOR=createos``
(LANGFLOW_EXECUTOR_KIND=createos) on a real Langflow server from PyPI. Flows are created
through the REST API and run through ``/api/v1/run`` and ``?stream=true``; createos-local's
records show the executor guests (``lf-x-``) that ran them."""

from __future__ import annotations

import json
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from executor.parity.test_parity import _feed_back  # tests/ is the import root

from .conftest import LangflowServer, serve

pytestmark = [pytest.mark.langflow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def executor_server() -> Iterator[LangflowServer]:
    yield from serve("executor-", EXECUTOR="createos")


def loop_flow() -> dict[str, Any]:
    """ChatInput -> Split Text (",") -> Loop.item -> ChatOutput -> back to Loop.item."""
    from lfx.components.flow_controls.loop import LoopComponent
    from lfx.components.input_output import ChatInput, ChatOutput
    from lfx.components.processing.split_text import SplitTextComponent
    from lfx.graph import Graph

    chat_in = ChatInput(_id="ChatInput-e2e01")
    split = SplitTextComponent(_id="SplitText-e2e02")
    split.set(data_inputs=chat_in.message_response, separator=",", chunk_size=1, chunk_overlap=0)
    loop = LoopComponent(_id="LoopComponent-e2e03")
    loop.set(data=split.split_text)
    body = ChatOutput(_id="ChatOutput-e2e04")
    body.set(input_value=loop.item_output)
    _feed_back(loop, body, "message")
    return Graph(chat_in, body).dump()["data"]


def chat_flow() -> dict[str, Any]:
    from lfx.components.input_output import ChatInput, ChatOutput
    from lfx.graph import Graph

    chat_in = ChatInput(_id="ChatInput-e2e11")
    chat_out = ChatOutput(_id="ChatOutput-e2e12")
    chat_out.set(input_value=chat_in.message_response)
    return Graph(chat_in, chat_out).dump()["data"]


def post(server: LangflowServer, client: Any, path: str, body: dict[str, Any]) -> str:
    if client.api_key is None:
        client.create_api_key("executor-e2e")
    req = urllib.request.Request(
        f"{server.url}{path}",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "x-api-key": client.api_key},
    )
    with urllib.request.urlopen(req, timeout=300) as resp:
        return resp.read().decode()


def executor_guests(server: LangflowServer) -> set[str]:
    return {sb["id"] for sb in server.sandboxes() if (sb.get("name") or "").startswith("lf-x-")}


def stream_events(text: str) -> list[str]:
    return [json.loads(chunk)["event"] for chunk in text.split("\n\n") if chunk.strip()]


def machine_texts(client: Any, flow_id: str, session: str) -> list[str]:
    stored = client.request("GET", f"/api/v1/monitor/messages?flow_id={flow_id}&session_id={session}")
    return [m["text"] for m in stored if m["sender"] == "Machine"]


def test_loop_flow_runs_in_a_guest_with_one_result_per_row(executor_server: LangflowServer) -> None:
    client = executor_server.client()
    flow_id = client.create_flow({"name": "executor-loop", "data": loop_flow()})["id"]
    before = executor_guests(executor_server)
    body = {"input_value": "a,b,c", "input_type": "chat", "output_type": "any", "session_id": "loop-1"}
    post(executor_server, client, f"/api/v1/run/{flow_id}?stream=false", body)
    assert len(executor_guests(executor_server) - before) == 1  # the whole flow, one guest
    # the body's Chat Output ran once per row with that row (not None), stored on the host
    texts = machine_texts(client, flow_id, "loop-1")
    assert len(texts) == 3 and all(f'"{row}"' in text for row, text in zip("abc", texts, strict=True)), texts

    streamed = post(
        executor_server, client, f"/api/v1/run/{flow_id}?stream=true", {**body, "session_id": "loop-2"}
    )
    events = stream_events(streamed)
    assert len(executor_guests(executor_server) - before) == 2
    assert events.count("add_message") >= 4, events  # the user's input and one per row, relayed live
    assert events[-1] == "end", events
    assert len(machine_texts(client, flow_id, "loop-2")) == 3


def test_session_messages_are_stored_on_the_host(executor_server: LangflowServer) -> None:
    client = executor_server.client()
    flow_id = client.create_flow({"name": "executor-chat", "data": chat_flow()})["id"]
    session = f"s-{uuid.uuid4().hex[:8]}"
    for text in ("first", "second"):
        body = {"input_value": text, "input_type": "chat", "output_type": "chat", "session_id": session}
        answer = json.loads(post(executor_server, client, f"/api/v1/run/{flow_id}", body))
        assert answer["session_id"] == session
        message = answer["outputs"][0]["outputs"][0]["results"]["message"]
        assert (message["text"], message["session_id"]) == (text, session)
    stored = client.request("GET", f"/api/v1/monitor/messages?flow_id={flow_id}&session_id={session}")
    assert sorted((m["sender"], m["text"]) for m in stored) == [
        ("Machine", "first"),
        ("Machine", "second"),
        ("User", "first"),
        ("User", "second"),
    ]
    assert {m["session_id"] for m in stored} == {session}
