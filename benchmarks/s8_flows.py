"""S8's flows, one per surface and kind of flow, and the check of each answer.

chat (the default, S8 since issue 30): Chat Input -> Chat Output for in-process and the
executors, a one-line program (`print(6 * 7)`) in the Python Interpreter (the sandbox backend)
or the CreateOS Sandbox component for the others: what a surface costs when the flow does
almost nothing.

work (issue 45): a flow that does real work, so the executor's point (the flow's work leaves the
server) can show. About 50 ms of CPU and a call to an OpenAI-compatible model server of the
bench's own, on a test host in a network namespace (tests/e2e/model_server.py, `NamespaceHost`):

  in-process, executor, executor-reuse  Chat Input -> S8 Burn -> OpenAI -> Chat Output
                                        (benchmarks/flow_components/burn.py, Langflow's custom
                                        component, and Langflow's own OpenAI component with the
                                        model server as its base URL)
  backend, component, component-reuse  the same work as the program the surface runs in its guest
                                        (Python Interpreter / CreateOS Sandbox with Allow Network):
                                        50 ms of CPU, then one chat completion over urllib
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from s8_common import CHAT_SURFACES, HERE, tests_importable

CODE = "print(6 * 7)"
BURN_SOURCE = HERE / "flow_components" / "burn.py"
WORK_PROMPT = "s8 work"
# the program the backend and the component run in the work flow; %(url)s is the model server
WORK_CODE = """\
import json, time, urllib.request
began = time.thread_time()
while time.thread_time() - began < 0.05:
    sum(i * i for i in range(500))
body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": %(prompt)r}]}
request = urllib.request.Request(
    "%(url)s/chat/completions",
    data=json.dumps(body).encode(),
    headers={"Content-Type": "application/json", "Authorization": "Bearer s8-bench"},
)
with urllib.request.urlopen(request, timeout=60) as answer:
    print(json.loads(answer.read())["choices"][0]["message"]["content"])
"""
OUT = {"id": "ChatOutput-s8o01", "component": "ChatOutput", "values": {}}


def _edge(source: str, output: str, target: str, field: str) -> dict[str, str]:
    return {"source": source, "output": output, "target": target, "field": field}


def _code_node(surface: str, code: str, network: bool) -> dict[str, Any]:
    if surface == "backend":
        return {
            "id": "PythonREPLComponent-s8b01",
            "component": "PythonREPLComponent",
            "values": {"global_imports": "math", "python_code": code},
        }
    return {
        "id": "CreateOSSandbox-s8c01",
        "component": "CreateOSSandboxComponent",
        "values": {
            "python_code": code,
            "session_mode": "flow" if surface == "component-reuse" else "off",
            "allow_network": network,
        },
    }


def recipe(surface: str, flow: str = "chat", model_url: str = "") -> dict[str, Any]:
    """A flow recipe for langflow_sandbox_createos.starter.build_flow (built from the server's
    own catalog, as make run builds the starter flow; the work flow's S8 Burn node comes from
    the server's custom-component endpoint, see `with_burn`)."""
    if surface in CHAT_SURFACES and flow == "chat":
        nodes = [{"id": "ChatInput-s8i01", "component": "ChatInput", "values": {}}, OUT]
        edges = [_edge("ChatInput-s8i01", "message", OUT["id"], "input_value")]
    elif surface in CHAT_SURFACES:
        tests_importable()
        from e2e.conftest import MODEL_KEY_VARIABLE

        model = {
            "id": "OpenAIModel-s8m01",
            "component": "OpenAIModelComponent",
            "values": {
                "openai_api_base": model_url,
                "api_key": MODEL_KEY_VARIABLE,  # a variable name: the server's environment holds it
                "model_name": "gpt-4o-mini",
                "max_retries": 0,
                "timeout": 60,
            },
        }
        nodes = [
            {"id": "ChatInput-s8i01", "component": "ChatInput", "values": {}},
            {"id": "S8Burn-s8w01", "component": "S8Burn", "values": {}},
            model,
            OUT,
        ]
        edges = [
            _edge("ChatInput-s8i01", "message", "S8Burn-s8w01", "input_value"),
            _edge("S8Burn-s8w01", "message", model["id"], "input_value"),
            _edge(model["id"], "text_output", OUT["id"], "input_value"),
        ]
    else:
        code = CODE if flow == "chat" else WORK_CODE % {"url": model_url, "prompt": WORK_PROMPT}
        node = _code_node(surface, code, network=flow == "work")
        nodes = [node, OUT]
        edges = [_edge(node["id"], "results", OUT["id"], "input_value")]
    name = f"s8 {surface}" + ("" if flow == "chat" else f" ({flow})")
    return {"name": name, "description": "S8 benchmark flow", "nodes": nodes, "edges": edges}


def with_burn(client: Any, catalog: dict[str, Any]) -> dict[str, Any]:
    """The catalog with S8 Burn in it, as the canvas adds a custom component: its node from the
    server's `POST /api/v1/custom_component` for the component's source."""
    built = client.request("POST", "/api/v1/custom_component", {"code": BURN_SOURCE.read_text()})
    return {**catalog, "s8": {"S8Burn": built["data"]}}


def prepare_flow(flow: dict[str, Any], surface: str, flow_kind: str) -> dict[str, Any]:
    """The finishing touches the canvas makes: the model key field loads the variable."""
    if flow_kind == "work" and surface in CHAT_SURFACES:
        for node in flow["data"]["nodes"]:
            if node["id"] == "OpenAIModel-s8m01":
                node["data"]["node"]["template"]["api_key"]["load_from_db"] = True
    return flow


# --- the answers ---------------------------------------------------------------------------------


def _text_of(answer: dict[str, Any]) -> str:
    return str(answer["outputs"][0]["outputs"][0]["results"]["message"]["text"])


def code_result(answer: dict[str, Any]) -> dict[str, Any]:
    """What a code surface's program answered: the Chat Output's JSON block of its Results."""
    text = _text_of(answer).strip().removeprefix("```json").removesuffix("```")
    data = json.loads(text)
    return data if isinstance(data, dict) else {"result": data}


def model_reply(prompt: str) -> str:
    """What the model server answers a lone user message (tests/e2e/model_server.py)."""
    return f"answer to {prompt!r} with history []"


def expected(surface: str, flow: str = "chat") -> Callable[[dict[str, Any], str], str | None]:
    """A check of one answer: None when it is right, else what is wrong."""

    def chat(answer: dict[str, Any], sent: str) -> str | None:
        text = _text_of(answer)
        want = sent if flow == "chat" else model_reply(sent)
        return None if text == want else f"answer {text[:120]!r} for input {sent!r}"

    def code(answer: dict[str, Any], _sent: str) -> str | None:
        data = code_result(answer)
        want = "42" if flow == "chat" else model_reply(WORK_PROMPT)
        if str(data.get("result", "")).strip() != want or data.get("error") or data.get("exit_code", 0) != 0:
            return f"unexpected result {json.dumps(data)[:200]}"
        return None

    return chat if surface in CHAT_SURFACES else code
