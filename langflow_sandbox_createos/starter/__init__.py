"""The starter flow of ``make run``: a Python Interpreter node and a CreateOS Sandbox component.

The flow is not stored as a full Langflow export. ``createos_starter_flow.json`` is a
recipe (which component, which field values, where on the canvas), and the nodes are built
at import time from the running server's own component catalog (``GET /api/v1/all``). A
saved export embeds each component's source code and template as of one Langflow release;
built from the catalog, the flow always matches the Langflow it is imported into, so a
patch release that changes the Python Interpreter's code does not leave an outdated node.

Stdlib only, so it runs in any environment::

    python -m langflow_sandbox_createos.starter --url http://127.0.0.1:7860
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
import urllib.error
import urllib.request
from importlib import resources
from typing import Any

RECIPE_FILE = "createos_starter_flow.json"


class LangflowError(RuntimeError):
    """The Langflow REST API answered with an error (or not at all)."""


def load_recipe() -> dict[str, Any]:
    text = resources.files(__name__).joinpath(RECIPE_FILE).read_text(encoding="utf-8")
    return json.loads(text)


# --- building the flow from the catalog ---------------------------------------------------


def find_component(catalog: dict[str, Any], class_name: str) -> tuple[str, dict[str, Any]]:
    """The catalog entry ``(type key, template)`` of the component class ``class_name``.

    Built-in components are keyed by their class name (``PythonREPLComponent``); extension
    components by a namespaced id (``ext:createos:CreateOSSandboxComponent@official``), so
    the class name recorded in the template's metadata is matched too.
    """
    matches: list[tuple[str, dict[str, Any]]] = []
    for category, components in catalog.items():
        if not isinstance(components, dict) or category == "component_display_names":
            continue
        for key, template in components.items():
            if not isinstance(template, dict):
                continue
            meta_class = (template.get("metadata") or {}).get("component_class_name")
            if key == class_name or meta_class == class_name:
                matches.append((key, template))
    if not matches:
        raise LangflowError(
            f"component {class_name} is not in this Langflow's catalog (is the plugin installed in the "
            "environment Langflow runs in?)"
        )
    # The same class can be listed twice (a legacy alias); the exact key wins.
    matches.sort(key=lambda m: m[0] != class_name)
    return matches[0]


def build_node(catalog: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    type_key, template = find_component(catalog, spec["component"])
    node = copy.deepcopy(template)
    for field, value in (spec.get("values") or {}).items():
        if field not in node.get("template", {}):
            raise LangflowError(f"{spec['component']} has no field {field!r} in this Langflow")
        node["template"][field]["value"] = value
    if spec.get("display_name"):
        node["display_name"] = spec["display_name"]
    outputs = node.get("outputs") or []
    data: dict[str, Any] = {
        "id": spec["id"],
        "type": type_key,
        "node": node,
        "display_name": node.get("display_name", ""),
        "description": node.get("description", ""),
    }
    if outputs:
        data["selected_output"] = outputs[0]["name"]
    position = spec.get("position", {"x": 0, "y": 0})
    return {
        "id": spec["id"],
        "type": "genericNode",
        "position": position,
        "positionAbsolute": position,
        "data": data,
        "selected": False,
        "dragging": False,
    }


def _handle_string(handle: dict[str, Any]) -> str:
    """The canvas's string form of an edge handle: JSON with ``œ`` in place of quotes."""
    return json.dumps(handle, separators=(", ", ": ")).replace('"', "\u0153")


def build_edge(nodes: dict[str, dict[str, Any]], spec: dict[str, Any]) -> dict[str, Any]:
    source, target = nodes[spec["source"]], nodes[spec["target"]]
    outputs = {o["name"]: o for o in source["data"]["node"].get("outputs", [])}
    if spec["output"] not in outputs:
        raise LangflowError(f"{source['data']['type']} has no output {spec['output']!r} in this Langflow")
    field = target["data"]["node"]["template"].get(spec["field"])
    if not isinstance(field, dict):
        raise LangflowError(f"{target['data']['type']} has no field {spec['field']!r} in this Langflow")
    output_types = list(outputs[spec["output"]].get("types") or [])
    input_types = list(field.get("input_types") or [])
    if input_types and not set(output_types) & set(input_types):
        raise LangflowError(
            f"cannot connect {output_types} to {spec['target']}.{spec['field']} {input_types}"
        )
    source_handle = {
        "dataType": source["data"]["type"],
        "id": source["id"],
        "name": spec["output"],
        "output_types": output_types,
    }
    target_handle = {
        "fieldName": spec["field"],
        "id": target["id"],
        "inputTypes": input_types,
        "type": field.get("type", "str"),
    }
    sh, th = _handle_string(source_handle), _handle_string(target_handle)
    return {
        "id": f"reactflow__edge-{source['id']}{sh}-{target['id']}{th}",
        "source": source["id"],
        "sourceHandle": sh,
        "target": target["id"],
        "targetHandle": th,
        "data": {"sourceHandle": source_handle, "targetHandle": target_handle},
        "animated": False,
        "className": "",
        "selected": False,
    }


def build_flow(catalog: dict[str, Any], recipe: dict[str, Any] | None = None) -> dict[str, Any]:
    """The body of ``POST /api/v1/flows/`` for the recipe, built from ``catalog``."""
    recipe = recipe or load_recipe()
    nodes = [build_node(catalog, spec) for spec in recipe["nodes"]]
    by_id = {node["id"]: node for node in nodes}
    edges = [build_edge(by_id, spec) for spec in recipe.get("edges", [])]
    return {
        "name": recipe["name"],
        "description": recipe.get("description", ""),
        "data": {"nodes": nodes, "edges": edges, "viewport": {"x": 0, "y": 0, "zoom": 0.8}},
        "is_component": False,
    }


# --- a small REST client ---------------------------------------------------------------------


class LangflowClient:
    """Just enough of Langflow's REST API: auto-login, catalog, flows, API keys, run."""

    def __init__(self, base_url: str, timeout: float = 120.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.token: str | None = None
        self.api_key: str | None = None

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{self.base_url}{path}", data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        for key, value in (headers or {}).items():
            req.add_header(key, value)
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:2000]
            raise LangflowError(f"{method} {path} -> HTTP {exc.code}: {detail}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise LangflowError(f"{method} {path}: {exc}") from exc
        return json.loads(raw) if raw else None

    def healthy(self) -> bool:
        try:
            return (self.request("GET", "/health_check", timeout=5) or {}).get("status") == "ok"
        except LangflowError:
            return False

    def wait_healthy(self, timeout: float, alive: Any = None) -> None:
        """Poll ``/health_check`` until it answers ok; ``alive()`` returning False aborts early."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.healthy():
                return
            if alive is not None and not alive():
                raise LangflowError("Langflow exited while starting")
            time.sleep(1.0)
        raise LangflowError(f"Langflow did not answer /health_check within {timeout:.0f} s")

    def login(self) -> str:
        """A bearer token from auto-login (``LANGFLOW_AUTO_LOGIN=true``, Langflow's default)."""
        answer = self.request("GET", "/api/v1/auto_login")
        self.token = answer["access_token"]
        return self.token

    def catalog(self) -> dict[str, Any]:
        return self.request("GET", "/api/v1/all")

    def flows(self) -> list[dict[str, Any]]:
        answer = self.request("GET", "/api/v1/flows/?get_all=true&header_flows=true")
        return answer if isinstance(answer, list) else answer.get("items", [])

    def create_flow(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", "/api/v1/flows/", body)

    def delete_flow(self, flow_id: str) -> None:
        self.request("DELETE", f"/api/v1/flows/{flow_id}")

    def create_api_key(self, name: str = "createos-starter") -> str:
        """An API key for ``/api/v1/run`` (which takes ``x-api-key``, not the bearer token)."""
        self.api_key = self.request("POST", "/api/v1/api_key/", {"name": name})["api_key"]
        return self.api_key

    def run(self, flow_id: str, input_value: str = "", timeout: float = 300.0) -> dict[str, Any]:
        if self.api_key is None:
            self.create_api_key()
        assert self.api_key is not None
        body = {"input_value": input_value, "input_type": "chat", "output_type": "any"}
        return self.request(
            "POST",
            f"/api/v1/run/{flow_id}?stream=false",
            body,
            headers={"x-api-key": self.api_key},
            timeout=timeout,
        )


def import_starter_flow(client: LangflowClient, *, replace: bool = True) -> dict[str, Any]:
    """Build the starter flow from the server's catalog and create it; an older copy with the
    same name is deleted first (so ``make run`` twice leaves one flow, not two)."""
    if client.token is None:
        client.login()
    body = build_flow(client.catalog())
    if replace:
        for flow in client.flows():
            if flow.get("name") == body["name"]:
                client.delete_flow(flow["id"])
    return client.create_flow(body)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m langflow_sandbox_createos.starter",
        description="Import the CreateOS starter flow into a running Langflow (auto-login).",
    )
    p.add_argument("--url", default="http://127.0.0.1:7860", help="Langflow base URL")
    p.add_argument("--wait", type=float, default=0.0, help="seconds to wait for /health_check first")
    p.add_argument("--print-id", action="store_true", help="print only the new flow's id")
    args = p.parse_args(argv)
    client = LangflowClient(args.url)
    try:
        if args.wait:
            client.wait_healthy(args.wait)
        flow = import_starter_flow(client)
    except LangflowError as exc:
        print(f"starter flow import failed: {exc}", file=sys.stderr)
        return 1
    if args.print_id:
        print(flow["id"])
    else:
        print(f"imported '{flow['name']}': {client.base_url}/flow/{flow['id']}")
    return 0
