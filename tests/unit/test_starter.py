"""The shipped starter flow: a real Langflow export (lfx's own parser takes it as is), in step
with the recipe ``make run`` builds from, and with the component's current code.

If a test here fails after a change to the recipe or to the component, regenerate the export
from a running Langflow (``make run``, then in another shell):

    .venv/bin/python -m langflow_sandbox_createos.starter --url http://127.0.0.1:7860 \\
        --build-export langflow_sandbox_createos/starter/createos_starter_flow.json
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from lfx.graph.graph.base import Graph

from langflow_sandbox_createos import starter

COMPONENT_SOURCE = (
    Path(starter.__file__).resolve().parents[1] / "components" / "createos" / "createos_sandbox.py"
)


@pytest.fixture(scope="module")
def export() -> dict[str, Any]:
    return starter.load_export()


def class_name(node: dict[str, Any]) -> str:
    return node["data"]["node"].get("metadata", {}).get("component_class_name") or node["data"]["type"]


def test_lfx_parses_the_export_as_is(export: dict[str, Any]) -> None:
    """``Graph.from_payload``, what Langflow runs on an imported flow, on the file untouched."""
    graph = Graph.from_payload(copy.deepcopy(export), flow_id="starter", flow_name=export["name"])
    assert sorted(v.id for v in graph.vertices) == sorted(n["id"] for n in starter.load_recipe()["nodes"])
    assert sorted((e.source_id, e.target_id) for e in graph.edges) == sorted(
        (e["source"], e["target"]) for e in starter.load_recipe()["edges"]
    )


def test_export_has_the_fields_of_a_langflow_export(export: dict[str, Any]) -> None:
    assert {"name", "description", "data", "is_component", "endpoint_name", "last_tested_version"} <= set(
        export
    )
    assert export["is_component"] is False
    assert set(export["data"]) == {"nodes", "edges", "viewport"}
    for node in export["data"]["nodes"]:
        assert node["type"] == "genericNode" and "template" in node["data"]["node"]


def test_export_matches_the_recipe(export: dict[str, Any]) -> None:
    recipe = starter.load_recipe()
    assert (export["name"], export["description"]) == (recipe["name"], recipe["description"])
    nodes = {n["id"]: n for n in export["data"]["nodes"]}
    assert sorted(nodes) == sorted(spec["id"] for spec in recipe["nodes"])
    for spec in recipe["nodes"]:
        node = nodes[spec["id"]]
        assert class_name(node) == spec["component"], spec["id"]
        assert node["position"] == spec["position"], spec["id"]
        assert node["data"]["node"]["display_name"] == spec["display_name"], spec["id"]
        for field, value in spec["values"].items():
            assert node["data"]["node"]["template"][field]["value"] == value, (spec["id"], field)
    wired = {
        (e["source"], e["data"]["sourceHandle"]["name"], e["target"], e["data"]["targetHandle"]["fieldName"])
        for e in export["data"]["edges"]
    }
    assert wired == {(e["source"], e["output"], e["target"], e["field"]) for e in recipe["edges"]}


def test_export_is_what_the_importer_builds_from_the_same_catalog(export: dict[str, Any]) -> None:
    """Handles, edge ids and node data are exactly ``build_flow``'s for the catalog the export
    embeds, so the file and ``make run``'s REST import are one flow."""
    catalog: dict[str, Any] = {"starter": {}}
    for node in export["data"]["nodes"]:
        catalog["starter"][node["data"]["type"]] = copy.deepcopy(node["data"]["node"])
    built = starter.build_flow(catalog)
    assert built["data"]["edges"] == export["data"]["edges"]
    assert built["data"]["nodes"] == export["data"]["nodes"]


def test_export_embeds_the_components_current_code(export: dict[str, Any]) -> None:
    [node] = [n for n in export["data"]["nodes"] if class_name(n) == "CreateOSSandboxComponent"]
    assert node["data"]["node"]["template"]["code"]["value"] == COMPONENT_SOURCE.read_text(), (
        "createos_sandbox.py changed: regenerate the export (see this module's docstring)"
    )


def test_save_writes_the_shipped_export(tmp_path: Path, export: dict[str, Any]) -> None:
    target = tmp_path / "flow.json"
    assert starter.main(["--save", str(target)]) == 0
    assert json.loads(target.read_text()) == export
