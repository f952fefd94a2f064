"""A model-provider flow, run by several users of one real Langflow server, the same under the
executor as in-process (issue 41).

Two Langflow servers from PyPI (``make run`` and ``make run EXECUTOR=createos``), an
OpenAI-compatible model server of the test's own in a network namespace (`ModelServer`). On
each server three users: A and B each store a Credential variable of the same name with their
own key, C stores none (Langflow then falls back on the server's environment, which holds a
third key). Each user builds the flow from the server's catalog, as the canvas does:

    Chat Input -> Message History (retrieve) -> OpenAI (system message) -> Chat Output
    Chat Input ------------------------------> OpenAI (input)

with the OpenAI component's base URL the model server and its API key field loading the
variable. Each user runs it through ``/api/v1/run`` twice and ``?stream=true`` once, in one
session. Under the executor, as in-process: each user's requests reach the model server with
that user's own key (C's with the server's), the answers and the stored messages are the same,
each user's history holds only their own messages, and the operator's trace view (Langflow's
native tracer) holds the same component spans. On ac8509d the executor sent no key at all.
"""

from __future__ import annotations

import json
import re
import secrets
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

import pytest

from langflow_sandbox_createos import starter
from langflow_sandbox_createos.starter import LangflowClient

from .conftest import MODEL_KEY_VARIABLE, SERVER_MODEL_KEY, LangflowServer, trace_view
from .model_server import ModelServer

pytestmark = [pytest.mark.langflow, pytest.mark.timeout(1200)]

SESSION = "users-1"


@dataclass
class User:
    name: str
    client: LangflowClient
    api_key: str
    key: str  # the key the model server must see from this user's runs


def new_user(server: LangflowServer, name: str, own_key: str | None) -> User:
    """An active ordinary user, logged in, with an API key and (if `own_key`) their own Credential
    variable named MODEL_KEY_VARIABLE."""
    admin = server.client()
    username, password = f"{name}-{secrets.token_hex(3)}", secrets.token_urlsafe(16)
    created = admin.request("POST", "/api/v1/users/", {"username": username, "password": password})
    admin.request("PATCH", f"/api/v1/users/{created['id']}", {"is_active": True})
    client = LangflowClient(server.url, timeout=300)
    client.login_with_password(username, password)
    api_key = client.request("POST", "/api/v1/api_key/", {"name": "users"})["api_key"]
    if own_key is not None:
        client.request(
            "POST",
            "/api/v1/variables/",
            {"name": MODEL_KEY_VARIABLE, "value": own_key, "type": "Credential", "default_fields": []},
        )
    return User(name=name, client=client, api_key=api_key, key=own_key or SERVER_MODEL_KEY)


def model_flow(client: LangflowClient, base_url: str) -> str:
    """The flow, built from the server's catalog, owned by `client`'s user; its id."""
    recipe = {
        "name": f"model-flow-{secrets.token_hex(3)}",
        "description": "a model provider with the user's own key",
        "nodes": [
            {"id": "ChatInput-mu01", "component": "ChatInput", "values": {}},
            {
                "id": "Memory-mu02",
                "component": "MemoryComponent",
                "values": {"mode": "Retrieve", "template": "{sender}: {text}", "n_messages": 100},
            },
            {
                "id": "OpenAIModel-mu03",
                "component": "OpenAIModelComponent",
                "values": {
                    "openai_api_base": base_url,
                    "api_key": MODEL_KEY_VARIABLE,
                    "model_name": "gpt-4o-mini",
                    "max_retries": 0,
                    "timeout": 60,
                },
            },
            {"id": "ChatOutput-mu04", "component": "ChatOutput", "values": {}},
        ],
        "edges": [
            # the history is read once this run's question is stored (a fixed order)
            {"source": "ChatInput-mu01", "output": "message", "target": "Memory-mu02", "field": "message"},
            {
                "source": "Memory-mu02",
                "output": "messages_text",
                "target": "OpenAIModel-mu03",
                "field": "system_message",
            },
            {
                "source": "ChatInput-mu01",
                "output": "message",
                "target": "OpenAIModel-mu03",
                "field": "input_value",
            },
            {
                "source": "OpenAIModel-mu03",
                "output": "text_output",
                "target": "ChatOutput-mu04",
                "field": "input_value",
            },
        ],
    }
    flow = starter.build_flow(client.catalog(), recipe)
    for node in flow["data"]["nodes"]:  # the key field loads the variable, as the canvas sets it
        if node["id"] == "OpenAIModel-mu03":
            node["data"]["node"]["template"]["api_key"]["load_from_db"] = True
    return str(client.create_flow(flow)["id"])


def run(server: LangflowServer, user: User, flow_id: str, text: str, stream: bool) -> dict[str, Any]:
    body = {"input_value": text, "input_type": "chat", "output_type": "any", "session_id": SESSION}
    request = urllib.request.Request(
        f"{server.url}/api/v1/run/{flow_id}?stream={'true' if stream else 'false'}",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "x-api-key": user.api_key},
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        raw = response.read().decode()
    if stream:
        events = [json.loads(chunk) for chunk in raw.split("\n\n") if chunk.strip()]
        end = next(e for e in events if e["event"] == "end")
        return {"events": [e["event"] for e in events], "answer": _answer(end["data"]["result"])}
    return {"answer": _answer(json.loads(raw))}


def _answer(result: dict[str, Any]) -> str:
    return str(result["outputs"][0]["outputs"][0]["results"]["message"]["text"])


def stored(user: User, flow_id: str) -> list[tuple[str, str, str]]:
    query = urllib.parse.urlencode({"flow_id": flow_id, "session_id": SESSION})
    messages = user.client.request("GET", f"/api/v1/monitor/messages?{query}")
    return [(m["sender"], m["text"], m["session_id"]) for m in sorted(messages, key=lambda m: m["timestamp"])]


def component_spans(user: User, flow_id: str, runs: int) -> list[list[tuple[str, str, str, str]]]:
    """Each trace of the flow (oldest first) as its component spans: (name, type, status, what
    the span's output text is). LangChain's own child spans (an LLM call's) are left out: the
    guest does not relay LangChain callbacks (docs/executor.md)."""
    found = []
    for trace in trace_view(user.client, flow_id, runs):
        spans = []
        for span in trace.get("spans") or []:
            outputs = json.dumps(span.get("outputs") or {}, sort_keys=True)
            spans.append((span["name"], span["type"], span["status"], _texts(outputs)))
        found.append(sorted(spans))
    return found


def _texts(outputs: str) -> str:
    """The answer texts a span's outputs hold (ids and timestamps differ between servers)."""
    return " | ".join(sorted({t for t in _walk(json.loads(outputs)) if "answer to" in t or "from" in t}))


def _walk(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [t for v in value.values() for t in _walk(v)]
    if isinstance(value, list):
        return [t for v in value for t in _walk(v)]
    return [value] if isinstance(value, str) else []


def everything(server: LangflowServer, model: ModelServer) -> dict[str, Any]:
    """Three users on `server`, each running their own copy of the flow; what each saw."""
    users = [
        new_user(server, "alice", "sk-user-a-" + secrets.token_hex(6)),
        new_user(server, "bob", "sk-user-b-" + secrets.token_hex(6)),
        new_user(server, "carol", None),
    ]
    seen: dict[str, Any] = {}
    for user in users:
        flow_id = model_flow(user.client, model.base_url)
        before = len(model.seen())
        runs = [
            run(server, user, flow_id, f"first question from {user.name}", stream=False),
            run(server, user, flow_id, f"second question from {user.name}", stream=False),
            run(server, user, flow_id, f"third question from {user.name}", stream=True),
        ]
        requests = model.seen()[before:]
        seen[user.name] = {
            "keys": [r["authorization"] for r in requests],
            "expected_key": f"Bearer {user.key}",
            "answers": [r["answer"] for r in runs],
            "stream_events": runs[2]["events"],
            "stored": stored(user, flow_id),
            "spans": component_spans(user, flow_id, len(runs)),
        }
    return seen


def test_each_user_runs_a_model_flow_with_their_own_key_and_history(
    langflow_server: LangflowServer, executor_server: LangflowServer, model_server: ModelServer
) -> None:
    assert_same_per_user(everything(langflow_server, model_server), everything(executor_server, model_server))


def test_the_same_with_reused_guests_each_users_runs_on_their_own_guest(
    langflow_server: LangflowServer, executor_reuse_server: LangflowServer, model_server: ModelServer
) -> None:
    """CREATEOS_EXECUTOR_REUSE=true (issue 45): the same keys, answers, history, events and
    trace per user as in-process, and the runs of each user's flow share one reused guest of
    their own, never another user's."""
    assert_same_per_user(
        everything(langflow_server, model_server), everything(executor_reuse_server, model_server)
    )
    log = (executor_reuse_server.run_dir / "langflow.log").read_text(errors="replace")
    runs = re.findall(r"CreateOS executor: flow (\S+) ran on guest (sb-\S+) \(reused\)[^\n]*: ok", log)
    by_flow: dict[str, set[str]] = {}
    for flow, guest in runs:
        by_flow.setdefault(flow, set()).add(guest)
    assert len(runs) == 9 and len(by_flow) == 3, runs  # three users, three runs each, all reused
    guests = [next(iter(g)) for g in by_flow.values()]
    assert all(len(g) == 1 for g in by_flow.values()) and len(set(guests)) == 3, by_flow


def assert_same_per_user(local: dict[str, Any], remote: dict[str, Any]) -> None:
    for name in ("alice", "bob", "carol"):
        ours, reference = remote[name], local[name]
        # each of the three runs called the model once, with this user's own key (carol's: the
        # server's, Langflow's fallback), in-process and under the executor alike
        assert reference["keys"] == [reference["expected_key"]] * 3, (name, reference["keys"])
        assert ours["keys"] == [ours["expected_key"]] * 3, (name, ours["keys"])
        assert ours["answers"] == reference["answers"], name
        assert ours["stored"] == reference["stored"], name
        assert ours["stream_events"] == reference["stream_events"], name
        # the history the model was given is this user's own: their earlier questions, no one else's
        last = ours["answers"][2]
        assert f"first question from {name}" in last and f"second question from {name}" in last, last
        others = {"alice", "bob", "carol"} - {name}
        assert not any(f"from {other}" in answer for other in others for answer in ours["answers"]), ours
        # the operator's trace view: one trace per run, with the same component spans
        assert len(reference["spans"]) == 3, (name, reference["spans"])
        assert len(ours["spans"]) == 3 and ours["spans"] == reference["spans"], (name, ours["spans"])
