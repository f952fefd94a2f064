"""Load shedding on a real Langflow server (issue 45): ``make run EXECUTOR=createos`` with
CREATEOS_EXECUTOR_MAX_GUESTS=1 and CREATEOS_EXECUTOR_MAX_WAIT_SECONDS=5, no warm pool.

- A caller the executor cannot serve within its wait gets Langflow's prompt refusal: ``/api/v1/run``
  answers 503 with the typed body (retryable, retry_after, a hint naming the settings), not a
  wait until the deadline.
- A streaming caller (``?stream=true``) that goes away while its run waits in line: Langflow
  cancels the run's task (its StreamingResponse's background on disconnect), the run leaves the
  line and no guest is created for it.

Nothing here waits for something not to happen: every wait is for a state or a log line, with a
deadline only as a failure's bound."""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import ARTIFACTS, LangflowServer, model_env, serve
from .model_server import ModelServer

pytestmark = [pytest.mark.langflow, pytest.mark.timeout(900)]

NAPPER = Path(__file__).parent / "flow_components" / "napper.py"
CANCELLED = "CreateOS executor: this run left the line before its turn: cancelled"
GAVE_UP = "CreateOS executor: this run waited"


@pytest.fixture(scope="module")
def shedding_server(model_server: ModelServer) -> Iterator[LangflowServer]:
    yield from serve(
        "shed-",
        EXECUTOR="createos",
        CREATEOS_EXECUTOR_MAX_GUESTS="1",
        CREATEOS_EXECUTOR_MAX_WAIT_SECONDS="5",
        CREATEOS_EXECUTOR_WARM_POOL="0",
        **model_env(model_server),
    )


def nap_flow(server: LangflowServer) -> tuple[str, str]:
    """(API key, flow id) of Chat Input -> Shed Napper -> Chat Output."""
    from langflow_sandbox_createos.starter import build_flow

    client = server.client()
    api_key = client.create_api_key("shed-e2e")
    built = client.request("POST", "/api/v1/custom_component", {"code": NAPPER.read_text()})
    catalog = {**client.catalog(), "shed": {"ShedNapper": built["data"]}}
    recipe = {
        "name": "shed napper",
        "nodes": [
            {"id": "ChatInput-shd01", "component": "ChatInput", "values": {}},
            {"id": "ShedNapper-shd02", "component": "ShedNapper", "values": {}},
            {"id": "ChatOutput-shd03", "component": "ChatOutput", "values": {}},
        ],
        "edges": [
            {
                "source": "ChatInput-shd01",
                "output": "message",
                "target": "ShedNapper-shd02",
                "field": "input_value",
            },
            {
                "source": "ShedNapper-shd02",
                "output": "message",
                "target": "ChatOutput-shd03",
                "field": "input_value",
            },
        ],
    }
    return api_key, client.create_flow(build_flow(catalog, recipe))["id"]


def run(server: LangflowServer, api_key: str, flow_id: str, seconds: float) -> tuple[int, Any]:
    """POST /api/v1/run (not streamed): (status, JSON body)."""
    req = urllib.request.Request(
        f"{server.url}/api/v1/run/{flow_id}?stream=false",
        data=json.dumps({"input_value": str(seconds), "input_type": "chat", "output_type": "chat"}).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "x-api-key": api_key},
    )
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def in_background(
    server: LangflowServer, api_key: str, flow_id: str, seconds: float
) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(run(server, api_key, flow_id, seconds)), daemon=True)
    thread.start()
    return thread, out


def executor_guests(server: LangflowServer) -> list[dict[str, Any]]:
    return [sb for sb in server.sandboxes() if (sb.get("name") or "").startswith("lf-x-")]


def wait_for(what: str, check: Any, timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.1)
    return value


def log(server: LangflowServer) -> str:
    return (server.run_dir / "langflow.log").read_text(errors="replace")


def guest_running(server: LangflowServer, known: int) -> Any:
    """A new executor guest, running (its run holds the only slot)."""
    return lambda: [sb for sb in executor_guests(server)[known:] if sb["status"] == "running"]


def test_a_caller_beyond_capacity_gets_a_prompt_503_and_a_gone_streaming_caller_takes_no_guest(
    shedding_server: LangflowServer,
) -> None:
    server = shedding_server
    api_key, flow_id = nap_flow(server)
    assert not executor_guests(server)

    # 1. Before any run finished the line has no estimate: a streaming caller waits in line.
    #    It goes away; Langflow cancels its run, which leaves the line (not its deadline).
    holder, held = in_background(server, api_key, flow_id, 12)
    wait_for("the first run's guest", guest_running(server, 0))
    waiting_before = log(server).count("this run waits in line")
    url = urllib.parse.urlsplit(server.url)
    stream = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    body = json.dumps({"input_value": "0", "input_type": "chat", "output_type": "chat"})
    stream.request(
        "POST",
        f"/api/v1/run/{flow_id}?stream=true",
        body=body,
        headers={"Content-Type": "application/json", "x-api-key": api_key},
    )
    wait_for(
        "the streaming run waits in line",
        lambda: log(server).count("this run waits in line") > waiting_before,
    )
    stream.sock.shutdown(2)  # the caller goes away
    stream.close()
    left = wait_for(
        "the streaming run leaves the line",
        lambda: [line for line in log(server).splitlines() if CANCELLED in line or GAVE_UP in line],
    )
    assert CANCELLED in left[0], left  # cancelled by Langflow, not given up at its deadline
    holder.join(120)
    assert held and held[0][0] == 200, held
    assert held[0][1]["outputs"][0]["outputs"][0]["results"]["message"]["text"] == "napped 12"

    # 2. One run of ~12 s observed: a run that would wait that long, with 5 s allowed, is refused
    #    at once with Langflow's typed 503, while another run holds the only slot.
    holder, held = in_background(server, api_key, flow_id, 12)
    wait_for("the second run's guest", guest_running(server, 1))
    started = time.monotonic()
    status, answer = run(server, api_key, flow_id, 0)
    refused_in = time.monotonic() - started
    detail = answer["detail"]
    assert status == 503, answer
    assert detail["error_code"] == "provider-unavailable" and detail["retryable"] is True, detail
    assert detail["retry_after"] >= 12, detail
    assert "CREATEOS_EXECUTOR_MAX_GUESTS=1" in detail["hint"], detail
    assert "refused at once" in detail["message"], detail  # the owner's caller sees our text
    holder.join(120)
    assert held and held[0][0] == 200, held

    # No guest for the caller that went away, nor for the refused one: two runs, two guests.
    assert len(executor_guests(server)) == 2, executor_guests(server)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "shed-refusal-seconds.txt").write_text(f"{refused_in:.2f}\n")
