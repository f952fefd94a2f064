"""End to end with the whole-flow executor switched on: ``make run EXECUTOR=createos``
(LANGFLOW_EXECUTOR_KIND=createos) on a real Langflow server from PyPI. Flows are created
through the REST API and run through ``/api/v1/run`` and ``?stream=true``; createos-local's
records show the executor guests (``lf-x-``) that ran them."""

from __future__ import annotations

import json
import re
import time
import urllib.request
import uuid
from typing import Any

import pytest
from executor.parity.test_parity import split_loop_flow  # tests/ is the import root

from .conftest import LangflowServer, trace_view

pytestmark = [pytest.mark.langflow, pytest.mark.timeout(900)]


def loop_flow() -> dict[str, Any]:
    """ChatInput -> Split Text (",") -> Loop.item -> ChatOutput -> back to Loop.item."""
    return split_loop_flow("e2e0")


def chat_flow(input_id: str = "ChatInput-e2e11", output_id: str = "ChatOutput-e2e12") -> dict[str, Any]:
    from lfx.components.input_output import ChatInput, ChatOutput
    from lfx.graph import Graph

    chat_in = ChatInput(_id=input_id)
    chat_out = ChatOutput(_id=output_id)
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
    """The executor guests that ran a flow and are gone (one per run). `make run
    EXECUTOR=createos` keeps a warm pool (lf-xw-): a pooled guest waiting for a run, or just
    made to refill the pool, is running, so only the deleted ones count as runs."""
    return {
        sb["id"]
        for sb in server.sandboxes()
        if (sb.get("name") or "").startswith(("lf-x-", "lf-xw-"))
        and sb["status"] in ("destroyed", "destroying")
    }


def stream_events(text: str) -> list[str]:
    return [json.loads(chunk)["event"] for chunk in text.split("\n\n") if chunk.strip()]


def timing_free_events(text: str) -> list[str]:
    """The stream's event types, with the CreateOS Sandbox component's output-progress logs
    ("[stdout] …", one per PROGRESS_LOG_INTERVAL while output streams) counted once per run:
    how many there are depends on how fast the guest printed, on either server."""
    events: list[str] = []
    for chunk in text.split("\n\n"):
        if not chunk.strip():
            continue
        event = json.loads(chunk)
        if event["event"] == "log" and re.search(r'"\[(stdout|stderr)\] ', json.dumps(event.get("data"))):
            if "log:output" not in events:
                events.append("log:output")
            continue
        events.append(event["event"])
    return events


def machine_texts(client: Any, flow_id: str, session: str) -> list[str]:
    stored = client.request("GET", f"/api/v1/monitor/messages?flow_id={flow_id}&session_id={session}")
    return [m["text"] for m in stored if m["sender"] == "Machine"]


def run_loop_flow(server: LangflowServer) -> dict[str, Any]:
    """The Loop flow through /api/v1/run and ?stream=true: what a user sees of it."""
    client = server.client()
    flow_id = client.create_flow({"name": "executor-loop", "data": loop_flow()})["id"]
    before = executor_guests(server)
    body = {"input_value": "a,b,c", "input_type": "chat", "output_type": "any", "session_id": "loop-1"}
    post(server, client, f"/api/v1/run/{flow_id}?stream=false", body)
    guests_after_run = len(executor_guests(server) - before)
    texts = machine_texts(client, flow_id, "loop-1")
    streamed = post(server, client, f"/api/v1/run/{flow_id}?stream=true", {**body, "session_id": "loop-2"})
    stored = client.request("GET", f"/api/v1/monitor/messages?flow_id={flow_id}")
    return {
        # the operator's trace view: one trace per run, ok, with the run graph's own spans (a
        # loop iteration's are not kept in-process); at f7cbc2a the executor wrote each run's
        # trace four times at once, with an error, and Langflow lost writes to trace.id
        "traces": [
            (t["status"], sorted(s["name"] for s in t.get("spans") or []))
            for t in trace_view(client, flow_id, 2)
        ],
        # a Chat Output that renders a stored message shows the id it has in the database
        "ids_are_stored_ids": [rendered_id(t) in {m["id"] for m in stored} for t in texts],
        "texts": texts,
        "events": stream_events(streamed),
        "streamed_texts": machine_texts(client, flow_id, "loop-2"),
        "guests": (guests_after_run, len(executor_guests(server) - before)),
    }


def run_session_flow(server: LangflowServer) -> dict[str, Any]:
    """Two runs of a chat flow in one session: answers and the messages stored for it."""
    client = server.client()
    flow_id = client.create_flow({"name": "executor-chat", "data": chat_flow()})["id"]
    session = f"s-{uuid.uuid4().hex[:8]}"
    answers = []
    for text in ("first", "second"):
        body = {"input_value": text, "input_type": "chat", "output_type": "chat", "session_id": session}
        answer = json.loads(post(server, client, f"/api/v1/run/{flow_id}", body))
        message = answer["outputs"][0]["outputs"][0]["results"]["message"]
        answers.append((answer["session_id"] == session, message["text"], message["session_id"] == session))
    stored = client.request("GET", f"/api/v1/monitor/messages?flow_id={flow_id}&session_id={session}")
    return {
        "answers": answers,
        "stored": sorted((m["sender"], m["text"], m["session_id"] == session) for m in stored),
    }


def test_loop_flow_runs_in_a_guest_as_in_process(
    executor_server: LangflowServer, langflow_server: LangflowServer
) -> None:
    remote = run_loop_flow(executor_server)
    local = run_loop_flow(langflow_server)
    assert remote["guests"] == (1, 2)  # the whole flow, one guest per run
    assert local["guests"] == (0, 0)
    # the body's Chat Output ran once per row with that row (not None), stored on the host
    assert remote["ids_are_stored_ids"] == local["ids_are_stored_ids"] == [True, True, True]
    texts = remote["texts"]
    assert len(texts) == 3 and all(f'"{row}"' in text for row, text in zip("abc", texts, strict=True)), texts
    assert remote["events"][-1] == "end" and remote["events"].count("add_message") >= 4, remote["events"]
    # and what the same flow gives without the executor: the same stream of event types, the
    # same stored messages, each the same message once its per-run identity is set aside
    assert remote["events"] == local["events"]
    for key in ("texts", "streamed_texts"):
        assert [rendered(t) for t in remote[key]] == [rendered(t) for t in local[key]]
    assert len(local["traces"]) == 2 and all(status == "ok" for status, _ in local["traces"]), local["traces"]
    assert remote["traces"] == local["traces"]


# What differs from run to run on one server too: ids (each must be the stored row's, see
# ids_are_stored_ids), times, and the run's id as session_metadata.graph_run_id (which must be
# there in both).
PER_RUN = ("id", "run_id", "flow_id", "timestamp")


def rendered_id(text: str) -> Any:
    """The id of the message a Chat Output's text renders as a JSON block."""
    return json.loads(text.removeprefix("```json").removesuffix("```")).get("id")


def rendered(text: str) -> Any:
    """A Chat Output's text that renders a message as a JSON block, minus its per-run values."""
    if not text.startswith("```json"):
        return text
    body = json.loads(text.removeprefix("```json").removesuffix("```"))
    kept = {k: v for k, v in body.items() if k not in PER_RUN}
    if isinstance(kept.get("session_metadata"), dict):
        kept["session_metadata"] = sorted(kept["session_metadata"])
    return kept


def test_session_messages_are_stored_on_the_host_as_in_process(
    executor_server: LangflowServer, langflow_server: LangflowServer
) -> None:
    remote = run_session_flow(executor_server)
    assert remote["answers"] == [(True, "first", True), (True, "second", True)]
    assert remote["stored"] == [
        ("Machine", "first", True),
        ("Machine", "second", True),
        ("User", "first", True),
        ("User", "second", True),
    ]
    assert remote == run_session_flow(langflow_server)


# --- Run Flow: the target flow is looked up on the server, shipped, and run in the guest ------


def component(catalogue: dict[str, Any], name: str) -> dict[str, Any]:
    """A component's node as the canvas gets it from `/api/v1/all`."""
    return next(c[name] for c in catalogue.values() if isinstance(c, dict) and name in c)


def canvas_subflow(catalogue: dict[str, Any]) -> dict[str, Any]:
    """ChatInput -> ChatOutput with the field order the canvas gives a dropped Chat Input,
    which is how Run Flow knows which of the target's fields to offer."""
    flow = chat_flow("ChatInput-sub01", "ChatOutput-sub02")
    for node in flow["nodes"]:
        node["data"]["node"]["field_order"] = component(catalogue, node["data"]["type"])["field_order"]
    return flow


def run_flow_node(client: Any, catalogue: dict[str, Any], name: str, flow_id: str) -> dict[str, Any]:
    """A Run Flow node with `name` chosen, as the canvas makes it: Langflow's own component
    template, then the server's update call for the chosen flow, which adds the target's
    inputs and outputs (`ChatInput-sub01~input_value`, `ChatOutput-sub02~message`)."""
    node = component(catalogue, "RunFlow")
    template = node["template"]
    template["flow_name_selected"]["value"] = name
    template["flow_id_selected"]["value"] = flow_id
    body = {
        "code": template["code"]["value"],
        "template": template,
        "field": "flow_name_selected",
        "field_value": name,
        "tool_mode": False,
    }
    return client.request("POST", "/api/v1/custom_component/update", body)


def edge(source: str, output: str, target: str, field: str) -> dict[str, Any]:
    return {
        "source": source,
        "target": target,
        "data": {
            "sourceHandle": {
                "dataType": source.split("-")[0],
                "id": source,
                "name": output,
                "output_types": ["Message"],
            },
            "targetHandle": {"fieldName": field, "id": target, "inputTypes": ["Message"], "type": "str"},
        },
    }


def run_flow_parent(node: dict[str, Any]) -> dict[str, Any]:
    """ChatInput -> Run Flow (the subflow's input) -> ChatOutput (the subflow's output)."""
    outer = chat_flow("ChatInput-rf01", "ChatOutput-rf03")
    field = next(name for name in node["template"] if name.endswith("~input_value"))
    output = next(o["name"] for o in node["outputs"] if o["name"].endswith("~message"))
    runner = {
        "id": "RunFlow-rf02",
        "type": "genericNode",
        "data": {"id": "RunFlow-rf02", "type": "RunFlow", "node": node},
    }
    outer["nodes"].append(runner)
    outer["edges"] = [
        edge("ChatInput-rf01", "message", "RunFlow-rf02", field),
        edge("RunFlow-rf02", output, "ChatOutput-rf03", "input_value"),
    ]
    return outer


def run_subflow(server: LangflowServer) -> dict[str, Any]:
    """A flow whose Run Flow node runs a stored flow, through /api/v1/run and ?stream=true:
    answers, event types, and the messages stored for both flows."""
    client = server.client()
    tag = uuid.uuid4().hex[:8]
    catalogue = client.request("GET", "/api/v1/all")
    sub = client.create_flow({"name": f"executor-sub-{tag}", "data": canvas_subflow(catalogue)})
    node = run_flow_node(client, catalogue, sub["name"], sub["id"])
    parent_id = client.create_flow({"name": f"executor-runflow-{tag}", "data": run_flow_parent(node)})["id"]
    before = executor_guests(server)
    body = {
        "input_value": "via subflow",
        "input_type": "chat",
        "output_type": "chat",
        "session_id": f"rf-{tag}",
    }
    answer = json.loads(post(server, client, f"/api/v1/run/{parent_id}", body))
    streamed = post(
        server, client, f"/api/v1/run/{parent_id}?stream=true", {**body, "session_id": f"rf2-{tag}"}
    )
    stored = []
    for which, flow_id in (("parent", parent_id), ("sub", sub["id"])):
        for m in client.request("GET", f"/api/v1/monitor/messages?flow_id={flow_id}"):
            stored.append((which, m["sender"], m["text"], (m["session_id"] or "").split("-")[0]))
    return {
        "texts": [o["outputs"][0]["results"]["message"]["text"] for o in answer["outputs"]],
        "events": stream_events(streamed),
        "stored": sorted(stored),
        "guests": len(executor_guests(server) - before),
    }


def test_run_flow_loads_its_target_on_the_server_and_runs_it_in_the_guest(
    executor_server: LangflowServer, langflow_server: LangflowServer
) -> None:
    remote = run_subflow(executor_server)
    local = run_subflow(langflow_server)
    assert remote["texts"] == ["via subflow"], remote
    assert (remote["guests"], local["guests"]) == (2, 0)  # one guest per run; the subflow ran inside it
    assert remote["events"] == local["events"]
    assert remote["stored"] == local["stored"]
    assert {which for which, *_ in remote["stored"]} == {"parent", "sub"}, remote["stored"]


# --- the starter flow: our backend and component nodes inside an executor run (issue 31) ------

GUEST_ID = re.compile(r"\bsb-[0-9a-z]{10,}\b")
EXEC_MS = re.compile(r'"exec_ms": [0-9.]+')


def per_run(text: str) -> str:
    """A rendered output minus what differs from run to run on one server too."""
    return EXEC_MS.sub('"exec_ms": <ms>', GUEST_ID.sub("<guest>", text))


def prefix(name: str) -> str:
    return name.rsplit("-", 1)[0]


def run_starter(server: LangflowServer) -> dict[str, Any]:
    """The starter flow make run imported, unchanged, through /api/v1/run and ?stream=true:
    answers (guest ids masked), stream events, stored messages, and the guests it made."""
    client = server.client()
    flow_id = server.starter_flow_id
    before = {sb["id"] for sb in server.sandboxes()}
    used_before = executor_guests(server)
    session = f"st-{uuid.uuid4().hex[:8]}"
    body = {"input_value": "hi", "input_type": "chat", "output_type": "any", "session_id": session}
    answer = json.loads(post(server, client, f"/api/v1/run/{flow_id}", body))
    streamed = post(
        server, client, f"/api/v1/run/{flow_id}?stream=true", {**body, "session_id": f"{session}-s"}
    )
    texts = [o["results"]["message"]["text"] for o in answer["outputs"][0]["outputs"]]
    ran_on = [GUEST_ID.findall(text) for text in texts]
    stored = client.request("GET", f"/api/v1/monitor/messages?flow_id={flow_id}&session_id={session}")
    made = [sb for sb in server.sandboxes() if sb["id"] not in before]
    deadline = time.monotonic() + 30  # the backend deletes in the background
    while any(sb["status"] not in ("destroyed", "destroying") for sb in _ours(server, made)):
        assert time.monotonic() < deadline, _ours(server, made)
        time.sleep(0.5)
    return {
        "texts": sorted(per_run(t) for t in texts),
        "ran_on": ran_on,
        "events": sorted(timing_free_events(streamed)),
        "stored": sorted((m["sender"], m["sender_name"], per_run(m["text"])) for m in stored),
        "made": sorted(p for p in (prefix(sb.get("name") or "") for sb in made) if p in ("lf", "lf-c")),
        "executor_runs": len(executor_guests(server) - used_before),
    }


def _ours(server: LangflowServer, made: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The backend's and the component's guests among `made`, as they are now."""
    ids = {sb["id"] for sb in made if prefix(sb.get("name") or "") in ("lf", "lf-c")}
    return [sb for sb in server.sandboxes() if sb["id"] in ids]


def test_the_starter_flow_runs_the_same_under_the_executor(
    executor_server: LangflowServer, langflow_server: LangflowServer
) -> None:
    """Issue 31: through /api/v1/run the starter failed under the executor (its component had
    no key in the guest, its Python Interpreter fell back to lfx's restricted mode). Now its
    nodes run on the server's backend and component engine, asked for by the flow's guest."""
    remote = run_starter(executor_server)
    local = run_starter(langflow_server)
    assert remote["texts"] == local["texts"], (remote["texts"], local["texts"])
    assert any("Python Interpreter ran on <guest>" in t for t in remote["texts"]), remote["texts"]
    assert any("CreateOS Sandbox ran on <guest>" in t for t in remote["texts"]), remote["texts"]
    assert remote["events"] == local["events"]
    assert remote["stored"] == local["stored"] and len(remote["stored"]) == 2, remote["stored"]
    # each run: one backend guest and one component guest, on both servers; under the executor
    # also the flow's own guest (lf-x-, or lf-xw- from the warm pool make run turns on)
    assert local["made"] == remote["made"] == ["lf", "lf", "lf-c", "lf-c"], (local["made"], remote["made"])
    assert (local["executor_runs"], remote["executor_runs"]) == (0, 2)
    # the guests the nodes printed are the backend's and the component's, which ran them
    for ids in remote["ran_on"]:
        assert len(ids) >= 1
    log = executor_server.log_tail("langflow.log", 4000)
    assert re.search(
        r"CreateOS executor: flow \S+ ran on guest sb-\S+.* in [0-9.]+ s: ok, 2 sandboxed", log
    ), log[-3000:]
