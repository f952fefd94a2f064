"""Guest Reuse on a Langflow server that serves flows to end users (issue 27).

Langflow runs a served flow under the flow owner's user id and stamps the gateway's end-user
id (a trusted header, ``LANGFLOW_SERVING_END_USER_HEADER``) on the graph; chat history is
kept per end user. Reuse keyed on the owner put every end user on one guest, so code one of
them left running watched the next one's programs. Here two end users of one flow get guests
of their own, and anonymous callers (no header) never reuse one.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from langflow_sandbox_createos import starter

from .conftest import LangflowServer, serve

pytestmark = [pytest.mark.langflow, pytest.mark.timeout(900)]

HEADER = "X-End-User-Id"


@pytest.fixture(scope="module")
def serving_server() -> Iterator[LangflowServer]:
    yield from serve(
        "end-users-",
        LANGFLOW_SERVING_END_USER_HEADER=HEADER,
        LANGFLOW_SERVING_TRUST_PROXY_HEADERS="true",
    )


def reuse_flow(client: Any, name: str) -> str:
    """A CreateOS Sandbox node with Guest Reuse `flow`, its Results into a Chat Output."""
    recipe = {
        "name": name,
        "description": "end-user reuse",
        "nodes": [
            {
                "id": "CreateOSSandbox-eu01",
                "component": "CreateOSSandboxComponent",
                "display_name": "CreateOS Sandbox",
                "position": {"x": 0, "y": 0},
                "values": {"python_code": "print('x')", "session_mode": "flow"},
            },
            {
                "id": "ChatOutput-eu02",
                "component": "ChatOutput",
                "display_name": "Out",
                "position": {"x": 400, "y": 0},
                "values": {},
            },
        ],
        "edges": [
            {
                "source": "CreateOSSandbox-eu01",
                "output": "results",
                "target": "ChatOutput-eu02",
                "field": "input_value",
            }
        ],
    }
    flow = starter.build_flow(client.catalog(), recipe)
    return str(client.create_flow(flow)["id"])


def run_as(server: LangflowServer, client: Any, flow_id: str, end_user: str | None) -> dict[str, Any]:
    """One /api/v1/run as the gateway would send it (the end user in the trusted header)."""
    if client.api_key is None:
        client.create_api_key("end-users")
    headers = {"Content-Type": "application/json", "x-api-key": client.api_key}
    if end_user is not None:
        headers[HEADER] = end_user
    who = end_user or "anonymous"
    body = {"input_value": "hi", "output_type": "any"}
    request = urllib.request.Request(
        f"{server.url}/api/v1/run/{flow_id}", data=json.dumps(body).encode(), method="POST", headers=headers
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        answer = json.loads(response.read())
    text = answer["outputs"][0]["outputs"][0]["results"]["message"]["text"]
    results = json.loads(text.removeprefix("```json").removesuffix("```"))
    return {"who": who, **results}


def test_two_end_users_of_one_served_flow_get_different_guests(serving_server: LangflowServer) -> None:
    client = serving_server.client()
    flow_id = reuse_flow(client, "served-reuse")
    carol = run_as(serving_server, client, flow_id, "carol")
    dave = run_as(serving_server, client, flow_id, "dave")
    assert carol["sandbox_id"] != dave["sandbox_id"], (carol, dave)
    again = run_as(serving_server, client, flow_id, "carol")
    assert again["sandbox_id"] == carol["sandbox_id"] and again["reused_guest"] is True, again
    # anonymous callers (no header): a fresh guest each time, never a reused one
    anonymous = [run_as(serving_server, client, flow_id, None) for _ in range(2)]
    assert all(
        a["reused_guest"] is False and "no Langflow user id" in a.get("reuse_notice", "") for a in anonymous
    )
    assert len({a["sandbox_id"] for a in anonymous} | {carol["sandbox_id"], dave["sandbox_id"]}) == 4
    for sb in serving_server.live_sandboxes():  # the two reused guests, deleted by make run's reap too
        assert sb["id"] in (carol["sandbox_id"], dave["sandbox_id"]) or sb["status"] == "destroying", sb
