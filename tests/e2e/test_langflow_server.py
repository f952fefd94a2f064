"""End to end on a real Langflow server from PyPI (``make run``'s server, see conftest.py):
flows created through Langflow's REST API, run through ``/api/v1/run``, and checked against
createos-local's own records of the guests it ran."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from typing import Any

import pytest

from langflow_sandbox_createos import starter
from langflow_sandbox_createos.starter import LangflowClient, build_flow, load_recipe

pytestmark = [pytest.mark.langflow, pytest.mark.timeout(600)]

SANDBOX_ID = re.compile(r"\bsb-[0-9a-z]{10,}\b")
INTERPRETER, SANDBOX = "PythonREPLComponent-cos01", "CreateOSSandbox-cos02"


def run_outputs(client: LangflowClient, flow_id: str) -> dict[str, str]:
    """``POST /api/v1/run``: the text each Chat Output got, keyed by the node feeding it."""
    answer = client.run(flow_id)
    texts: dict[str, str] = {}
    for out in answer["outputs"][0]["outputs"]:
        message = out["results"]["message"]
        source = message["properties"]["source"]["id"]
        texts[source] = message["text"]
    return texts


def json_block(text: str) -> dict[str, Any]:
    """Chat Output renders a Data as a fenced JSON block."""
    body = text.strip().removeprefix("```json").removesuffix("```")
    return json.loads(body)


def create_flow(client: LangflowClient, name: str, mutate: Any = None) -> str:
    recipe = copy.deepcopy(load_recipe())
    recipe["name"] = name
    if mutate:
        mutate(recipe)
    body = build_flow(client.catalog(), recipe)
    return client.create_flow(body)["id"]


def wait_no_live(server: Any, keep_prefix: str = "lf-c-", timeout: float = 15.0) -> list[dict[str, Any]]:
    """Backend guests are deleted in the background after the run: give that a moment."""
    deadline = time.monotonic() + timeout
    while True:
        live = [sb for sb in server.live_sandboxes() if not (sb.get("name") or "").startswith(keep_prefix)]
        if not live or time.monotonic() > deadline:
            return live
        time.sleep(0.2)


def test_server_has_the_plugin(langflow_server: Any) -> None:
    """The three surfaces as Langflow itself sees them: backend registered, component in the catalog."""
    client = langflow_server.client()
    catalog = client.catalog()
    assert "createos" in catalog, sorted(catalog)
    names = {c.get("display_name") for c in catalog["createos"].values()}
    assert "CreateOS Sandbox" in names
    log = (langflow_server.run_dir / "langflow.log").read_text(errors="replace")
    assert "Registered out-of-tree sandbox backend 'createos'" in log


def test_starter_flow_imported_by_make_run(langflow_server: Any) -> None:
    client = langflow_server.client()
    flows = {f["id"]: f for f in client.flows()}
    assert langflow_server.starter_flow_id in flows
    flow = client.request("GET", f"/api/v1/flows/{langflow_server.starter_flow_id}")
    types = sorted(n["data"]["type"] for n in flow["data"]["nodes"])
    assert "PythonREPLComponent" in types
    assert "ext:createos:CreateOSSandboxComponent@official" in types
    assert len(flow["data"]["edges"]) == 2


def test_rest_flow_runs_both_nodes_on_guests(langflow_server: Any) -> None:
    client = langflow_server.client()
    before = {sb["id"] for sb in langflow_server.sandboxes()}
    flow_id = create_flow(client, "e2e: interpreter + sandbox")
    texts = run_outputs(client, flow_id)
    assert set(texts) == {INTERPRETER, SANDBOX}, texts

    # The Python Interpreter node: its stdout names the guest (CREATEOS_SANDBOX_ID in the guest).
    interpreter = json_block(texts[INTERPRETER])
    assert "error" not in interpreter, interpreter
    assert interpreter["result"].startswith("Python Interpreter ran on sb-"), interpreter
    interpreter_guest = SANDBOX_ID.search(interpreter["result"]).group(0)

    # The CreateOS Sandbox component: its Results carry the guest id, and the program printed it too.
    sandbox = json_block(texts[SANDBOX])
    assert sandbox["exit_code"] == 0 and sandbox["reused_guest"] is False, sandbox
    assert sandbox["result"].startswith(f"CreateOS Sandbox ran on {sandbox['sandbox_id']}"), sandbox

    records = {sb["id"]: sb for sb in langflow_server.sandboxes()}
    new = set(records) - before
    assert interpreter_guest in new, (interpreter_guest, records)
    assert sandbox["sandbox_id"] in new, (sandbox, records)
    assert interpreter_guest != sandbox["sandbox_id"]
    assert records[interpreter_guest]["name"].startswith("lf-")
    assert wait_no_live(langflow_server, keep_prefix="\0") == []


def test_reused_guest_is_the_only_one_left(langflow_server: Any) -> None:
    """Guest Reuse = flow: two runs land on one guest, which is kept; every other guest is gone."""

    def reuse(recipe: dict[str, Any]) -> None:
        node = next(n for n in recipe["nodes"] if n["id"] == SANDBOX)
        node["values"]["session_mode"] = "flow"

    client = langflow_server.client()
    flow_id = create_flow(client, "e2e: reuse", reuse)
    first = json_block(run_outputs(client, flow_id)[SANDBOX])
    second_texts = run_outputs(client, flow_id)
    second = json_block(second_texts[SANDBOX])
    assert first["sandbox_id"] == second["sandbox_id"], (first, second)
    assert second["reused_guest"] is True
    interpreter = json_block(second_texts[INTERPRETER])
    assert SANDBOX_ID.search(interpreter["result"]).group(0) != second["sandbox_id"]

    live = langflow_server.live_sandboxes()
    deadline = time.monotonic() + 15
    while len(live) > 1 and time.monotonic() < deadline:
        time.sleep(0.2)
        live = langflow_server.live_sandboxes()
    assert [sb["id"] for sb in live] == [second["sandbox_id"]], live
    assert live[0]["name"].startswith("lf-c-")
    # Left for make run's Ctrl-C to reap (the session teardown checks it happens).


def test_shipped_export_is_what_this_langflow_builds(langflow_server: Any) -> None:
    """The shipped export equals the flow built from the catalog of the pinned Langflow (1.13.0)
    with this package installed: same component code and templates, same wiring."""
    built = json.loads(json.dumps(starter.build_export(langflow_server.client())))
    assert built == starter.load_export(), (
        "regenerate: python -m langflow_sandbox_createos.starter --build-export (tests/unit/test_starter.py)"
    )


def import_with(server: Any, **env: str) -> subprocess.CompletedProcess[str]:
    """The importer as ``make run`` starts it, with only ``env`` for authentication."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LANGFLOW_")}
    return subprocess.run(
        [sys.executable, "-m", "langflow_sandbox_createos.starter", "--url", server.url, "--print-id"],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_importer_with_authentication_on(langflow_server: Any) -> None:
    """make run's own import already logged in with the superuser's credentials (the session
    server has auto-login off); here the other ways in, and the refusals."""
    client = langflow_server.client()
    refused = import_with(langflow_server)
    assert refused.returncode == 1
    assert "authentication on (LANGFLOW_AUTO_LOGIN=false)" in refused.stderr

    wrong = import_with(
        langflow_server, LANGFLOW_SUPERUSER=langflow_server.username, LANGFLOW_SUPERUSER_PASSWORD="not-it-0"
    )
    assert wrong.returncode == 1 and "refused the credentials" in wrong.stderr
    assert "not-it-0" not in wrong.stdout + wrong.stderr

    key = client.create_api_key("createos-e2e-importer")
    by_key = import_with(langflow_server, LANGFLOW_API_KEY=key)
    assert by_key.returncode == 0, by_key.stderr
    flow_id = by_key.stdout.strip()
    flows = {f["id"]: f["name"] for f in client.flows()}
    assert flows[flow_id] == "CreateOS starter"
    assert langflow_server.starter_flow_id not in flows  # replaced, not duplicated
    assert key not in by_key.stdout + by_key.stderr
    langflow_server.starter_flow_id = flow_id  # the flow make run would now point at

    bad_key = import_with(langflow_server, LANGFLOW_API_KEY="sk-not-a-key")
    assert bad_key.returncode == 1 and "refused the API key" in bad_key.stderr


def test_make_run_explains_the_egress_acknowledgement(langflow_server: Any) -> None:
    """make run explains why it sets the egress acknowledgement."""
    output = "".join(langflow_server.output)
    assert "LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS=true" in output
    assert "169.254.0.0/16" in output


def test_health_and_control_plane_are_loopback(langflow_server: Any) -> None:
    with urllib.request.urlopen(f"{langflow_server.url}/health_check", timeout=10) as r:
        assert json.loads(r.read())["status"] == "ok"
    assert langflow_server.control_plane_url.startswith("http://127.0.0.1:")
    assert langflow_server.stats()["isolation"] in ("bwrap", "none")
