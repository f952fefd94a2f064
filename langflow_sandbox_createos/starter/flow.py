"""The starter flow as data: the shipped recipe and export, and the nodes and edges built from a
running Langflow's own component catalog."""

from __future__ import annotations

import copy
import json
from importlib import resources
from typing import Any

RECIPE_FILE = "createos_starter_recipe.json"
EXPORT_FILE = "createos_starter_flow.json"


class LangflowError(RuntimeError):
    """The Langflow REST API answered with an error (or not at all)."""


def _shipped(name: str) -> dict[str, Any]:
    return json.loads(
        resources.files("langflow_sandbox_createos.starter").joinpath(name).read_text(encoding="utf-8")
    )


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
