"""Langflow's security model, on a real Langflow server (``make run``'s, see conftest.py): the
CreateOS Sandbox node is refused where the Python Interpreter is, before any guest exists; its
program, network, reuse, shape and timeout fields refuse tweaks like the Interpreter's code; a
reused guest idle past its lifetime is gone after the next use or a reap. Checked against
createos-local's own records of every guest it ever created.

The server runs with ``LANGFLOW_CUSTOM_COMPONENT_ADMIN_ONLY=true`` (conftest.py): the
auto-login superuser runs code as usual, and a second, ordinary user is the one whose code
execution Langflow blocks.
"""

from __future__ import annotations

import json
import secrets
import time
import urllib.parse
import urllib.request
from typing import Any

import pytest

from langflow_sandbox_createos._createos import Client
from langflow_sandbox_createos.core import clock
from langflow_sandbox_createos.starter import LangflowClient, LangflowError

from .test_langflow_server import (
    INTERPRETER,
    SANDBOX,
    create_flow,
    json_block,
    run_outputs,
)

pytestmark = [pytest.mark.langflow, pytest.mark.timeout(600)]

PROTECTED = {
    "python_code": "print('tweaked')",
    "command": "id -u",
    "allow_network": True,
    "session_mode": "flow",
    "shape": "s-8vcpu-16gb",
    "timeout_seconds": 5,
}


def run_with(client: LangflowClient, flow_id: str, tweaks: dict[str, Any] | None = None) -> Any:
    if client.api_key is None:
        client.create_api_key()
    body: dict[str, Any] = {"input_value": "", "input_type": "chat", "output_type": "any"}
    if tweaks is not None:
        body["tweaks"] = tweaks
    return client.request(
        "POST", f"/api/v1/run/{flow_id}?stream=false", body, headers={"x-api-key": str(client.api_key)}
    )


def refusal(client: LangflowClient, flow_id: str, tweaks: dict[str, Any] | None = None) -> str:
    with pytest.raises(LangflowError) as info:
        run_with(client, flow_id, tweaks)
    return str(info.value)


def only(node_id: str):
    """A recipe mutation keeping one code node and the Chat Output it feeds."""

    def mutate(recipe: dict[str, Any]) -> None:
        keep = {node_id} | {e["target"] for e in recipe["edges"] if e["source"] == node_id}
        recipe["nodes"] = [n for n in recipe["nodes"] if n["id"] in keep]
        recipe["edges"] = [e for e in recipe["edges"] if e["source"] in keep and e["target"] in keep]

    return mutate


def ordinary_user(server: Any, admin: LangflowClient) -> LangflowClient:
    """A new, active, non-superuser account, logged in."""
    name, password = f"e2e-{secrets.token_hex(4)}", secrets.token_urlsafe(16)
    user = admin.request("POST", "/api/v1/users/", {"username": name, "password": password})
    admin.request("PATCH", f"/api/v1/users/{user['id']}", {"is_active": True})
    form = urllib.parse.urlencode({"username": name, "password": password}).encode()
    req = urllib.request.Request(f"{server.url}/api/v1/login", data=form, method="POST")
    with urllib.request.urlopen(req, timeout=30) as resp:
        token = json.loads(resp.read())["access_token"]
    client = LangflowClient(server.url, timeout=180)
    client.token = token
    return client


def test_code_execution_blocked_refuses_our_node_before_any_guest(langflow_server: Any) -> None:
    admin = langflow_server.client()
    user = ordinary_user(langflow_server, admin)
    ours = create_flow(user, "e2e: sandbox only, ordinary user", only(SANDBOX))
    theirs = create_flow(user, "e2e: interpreter only, ordinary user", only(INTERPRETER))
    before = langflow_server.sandboxes()

    interpreter = refusal(user, theirs)  # Langflow's own gate on its own component
    assert "not allowed" in interpreter and "Python Interpreter" in interpreter, interpreter
    answer = refusal(user, ours)
    assert "Python code execution is restricted to administrators" in answer, answer
    assert "CreateOS Sandbox" in answer, answer
    assert langflow_server.sandboxes() == before, "a refused run created a guest"

    # The same flow runs for the superuser: the refusal is the policy, not a broken node.
    ran = run_with(admin, create_flow(admin, "e2e: sandbox only, admin", only(SANDBOX)))
    assert "CreateOS Sandbox ran on sb-" in json.dumps(ran)


def test_tweaks_of_our_protected_fields_are_refused_like_the_interpreters_code(langflow_server: Any) -> None:
    client = langflow_server.client()
    flow_id = create_flow(client, "e2e: tweaks")
    before = langflow_server.sandboxes()

    reference = refusal(client, flow_id, {INTERPRETER: {"python_code": "print('tweaked')"}})
    assert "HTTP 422" in reference and "python_code" in reference, reference
    reason = "The field is protected and keeps the value set by the flow author."
    assert reason in reference
    for field, value in PROTECTED.items():
        answer = refusal(client, flow_id, {SANDBOX: {field: value}})
        assert "HTTP 422" in answer and field in answer and reason in answer, (field, answer)
    assert langflow_server.sandboxes() == before, "a refused run created a guest"


def _idle_past_lifetime(plane: Client, sandbox_id: str, lifetime: float) -> None:
    """What auto-pause does after its window, then more than the lifetime of waiting."""
    plane.pause(sandbox_id)
    while (clock.paused_seconds(plane.get(sandbox_id), time.time()) or 0.0) <= lifetime:
        time.sleep(0.25)


def test_reused_guest_idle_past_its_lifetime_is_gone_after_next_use_or_reap(langflow_server: Any) -> None:
    def reuse(recipe: dict[str, Any]) -> None:
        only(SANDBOX)(recipe)
        next(n for n in recipe["nodes"] if n["id"] == SANDBOX)["values"]["session_mode"] = "flow"

    admin = langflow_server.client()
    flow_id = create_flow(admin, "e2e: idle lifetime", reuse)
    plane = Client(langflow_server.control_plane_url, langflow_server.control_plane_key)
    lifetime = langflow_server.reuse_idle_seconds

    first = json_block(run_outputs(admin, flow_id)[SANDBOX])
    _idle_past_lifetime(plane, first["sandbox_id"], lifetime)
    second = json_block(run_outputs(admin, flow_id)[SANDBOX])  # the next use
    assert second["sandbox_id"] != first["sandbox_id"] and second["reused_guest"] is False, second
    assert first["sandbox_id"] in second["reuse_notice"], second
    assert plane.get(first["sandbox_id"])["status"] in ("destroying", "destroyed")

    _idle_past_lifetime(plane, second["sandbox_id"], lifetime)
    reap = langflow_server.cli("reap", "--idle", f"{lifetime}s", "--yes")
    assert reap.returncode == 0, reap.stdout + reap.stderr
    assert second["sandbox_id"] in reap.stdout and "Deleted 1 of 1 guest(s)." in reap.stdout, reap.stdout
    assert plane.get(second["sandbox_id"])["status"] in ("destroying", "destroyed")
