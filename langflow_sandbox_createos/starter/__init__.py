"""The starter flow: a Python Interpreter node and a CreateOS Sandbox component.

It ships twice, kept in step by tests/unit/test_starter.py:

``createos_starter_flow.json``
    A real Langflow flow export, as Langflow's own "Export" writes it: open Langflow, then
    Import (or drag the file onto the projects page). It embeds each component's code and
    template as of the Langflow it was built against (``last_tested_version``); save a copy
    anywhere with ``python -m langflow_sandbox_createos.starter --save FILE``.
``createos_starter_recipe.json``
    The recipe the export is built from (which component, which field values, where on the
    canvas). ``make run`` imports the flow through the REST API by building the nodes from
    the running server's own catalog (``GET /api/v1/all``), so the nodes always match the
    Langflow they go into, even after a patch release changed a component's code.

Stdlib only, so it runs in any environment::

    python -m langflow_sandbox_createos.starter --url http://127.0.0.1:7860

With authentication on (``LANGFLOW_AUTO_LOGIN=false``) it logs in with an API key
(``LANGFLOW_API_KEY``) or the superuser's credentials (``LANGFLOW_SUPERUSER`` and
``LANGFLOW_SUPERUSER_PASSWORD``, the variables Langflow itself reads); secrets are read
from the environment only, never from the command line.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

RECIPE_FILE = "createos_starter_recipe.json"
EXPORT_FILE = "createos_starter_flow.json"


class LangflowError(RuntimeError):
    """The Langflow REST API answered with an error (or not at all)."""


def _shipped(name: str) -> dict[str, Any]:
    return json.loads(resources.files(__name__).joinpath(name).read_text(encoding="utf-8"))


def load_recipe() -> dict[str, Any]:
    return _shipped(RECIPE_FILE)


def load_export() -> dict[str, Any]:
    """The shipped Langflow flow export (what Langflow's Import takes)."""
    return _shipped(EXPORT_FILE)


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


def export_document(flow: dict[str, Any], langflow_version: str) -> dict[str, Any]:
    """``flow`` (a ``build_flow`` body) in the shape of Langflow's own flow export."""
    return {
        "name": flow["name"],
        "description": flow["description"],
        "data": flow["data"],
        "is_component": False,
        "endpoint_name": None,
        "tags": [],
        "last_tested_version": langflow_version,
    }


# --- a small REST client ---------------------------------------------------------------------


AUTH_HELP = (
    "this Langflow has authentication on (LANGFLOW_AUTO_LOGIN=false): set LANGFLOW_API_KEY, or "
    "LANGFLOW_SUPERUSER and LANGFLOW_SUPERUSER_PASSWORD"
)


class LangflowClient:
    """Just enough of Langflow's REST API: log in, catalog, flows, API keys, run.

    Authenticated by a bearer token (auto-login or the superuser's credentials) or by an API
    key (``x-api-key``), which Langflow accepts on every endpoint used here.
    """

    def __init__(self, base_url: str, timeout: float = 120.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.token: str | None = None
        self.api_key: str | None = None

    def __repr__(self) -> str:  # never the token or the key
        return f"LangflowClient({self.base_url!r}, logged_in={self.logged_in})"

    @property
    def logged_in(self) -> bool:
        return self.token is not None or self.api_key is not None

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
        form: Mapping[str, str] | None = None,
    ) -> Any:
        if form is not None:
            data: bytes | None = urllib.parse.urlencode(form).encode()
            content_type = "application/x-www-form-urlencoded"
        else:
            data = json.dumps(body).encode() if body is not None else None
            content_type = "application/json"
        req = urllib.request.Request(f"{self.base_url}{path}", data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        elif self.api_key:
            req.add_header("x-api-key", self.api_key)
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
        try:
            answer = self.request("GET", "/api/v1/auto_login")
        except LangflowError as exc:
            raise LangflowError(f"auto-login refused: {AUTH_HELP}") from exc
        self.token = answer["access_token"]
        return self.token

    def login_with_password(self, username: str, password: str) -> str:
        """A bearer token for ``username`` (``POST /api/v1/login``, form-encoded as Langflow wants)."""
        try:
            answer = self.request("POST", "/api/v1/login", form={"username": username, "password": password})
        except LangflowError as exc:
            # The server's answer is kept out: the message must never carry the password.
            status = str(exc).split(": ", 1)[0]  # "POST /api/v1/login -> HTTP 401"
            raise LangflowError(f"Langflow refused the credentials of {username!r} ({status})") from None
        self.token = answer["access_token"]
        return self.token

    def use_api_key(self, api_key: str) -> None:
        """Authenticate every request with ``x-api-key`` (checked at once with ``GET /api/v1/users/whoami``)."""
        self.api_key = api_key
        try:
            self.request("GET", "/api/v1/users/whoami")
        except LangflowError:
            self.api_key = None
            raise LangflowError("Langflow refused the API key") from None

    def authenticate(self, environ: Mapping[str, str]) -> None:
        """Log in the way ``environ`` says: an API key, else the superuser's credentials, else auto-login."""
        api_key = environ.get("LANGFLOW_API_KEY", "").strip()
        username = environ.get("LANGFLOW_SUPERUSER", "").strip()
        password = environ.get("LANGFLOW_SUPERUSER_PASSWORD", "")
        if api_key:
            self.use_api_key(api_key)
        elif username and password:
            self.login_with_password(username, password)
        else:
            self.login()

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

    def version(self) -> str:
        return self.request("GET", "/api/v1/version")["version"]

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


def import_starter_flow(
    client: LangflowClient, *, replace: bool = True, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Build the starter flow from the server's catalog and create it; an older copy with the
    same name is deleted first (so ``make run`` twice leaves one flow, not two)."""
    if not client.logged_in:
        client.authenticate(os.environ if environ is None else environ)
    body = build_flow(client.catalog())
    if replace:
        for flow in client.flows():
            if flow.get("name") == body["name"]:
                client.delete_flow(flow["id"])
    return client.create_flow(body)


def build_export(client: LangflowClient, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The export file, built from a running Langflow's catalog (how the shipped one is made)."""
    if not client.logged_in:
        client.authenticate(os.environ if environ is None else environ)
    return export_document(build_flow(client.catalog()), client.version())


def write_json(path: Path, document: dict[str, Any]) -> None:
    path.write_text(
        json.dumps(document, indent=2, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m langflow_sandbox_createos.starter",
        description=(
            "Import the CreateOS starter flow into a running Langflow. Authentication: LANGFLOW_API_KEY, "
            "else LANGFLOW_SUPERUSER and LANGFLOW_SUPERUSER_PASSWORD, else auto-login."
        ),
    )
    p.add_argument("--url", default="http://127.0.0.1:7860", help="Langflow base URL")
    p.add_argument("--wait", type=float, default=0.0, help="seconds to wait for /health_check first")
    p.add_argument("--print-id", action="store_true", help="print only the new flow's id")
    p.add_argument("--save", type=Path, metavar="FILE", help="write the shipped flow export to FILE and exit")
    p.add_argument(
        "--build-export",
        type=Path,
        metavar="FILE",
        help="write a flow export built from the running Langflow's catalog to FILE (regenerates the shipped one)",
    )
    args = p.parse_args(argv)
    if args.save:
        write_json(args.save, load_export())
        print(f"wrote {args.save}: import it with Langflow's Import")
        return 0
    client = LangflowClient(args.url)
    try:
        if args.wait:
            client.wait_healthy(args.wait)
        if args.build_export:
            write_json(args.build_export, build_export(client))
            print(f"wrote {args.build_export}")
            return 0
        flow = import_starter_flow(client)
    except LangflowError as exc:
        print(f"starter flow import failed: {exc}", file=sys.stderr)
        return 1
    if args.print_id:
        print(flow["id"])
    else:
        print(f"imported '{flow['name']}': {client.base_url}/flow/{flow['id']}")
    return 0
