"""The component as an extension: manifest, discovery, validation, and its declared shape."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from lfx.extension.discovery import discover_installed_extensions
from lfx.extension.loader import load_extension_bundles
from lfx.extension.manifest import ExtensionManifest, load_manifest
from lfx.schema.data import Data
from lfx.schema.dataframe import DataFrame

from langflow_sandbox_createos.component import engine

from .conftest import PACKAGE_DIR

LFX = Path(sys.executable).with_name("lfx")


def test_lfx_extension_validate_accepts_the_package() -> None:
    done = subprocess.run(
        [str(LFX), "extension", "validate", str(PACKAGE_DIR)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "validate: ok" in done.stdout


def _editable_distribution(tmp_path: Path) -> metadata.Distribution:
    """A dist-info like an editable install's: no files listed, only the entry point."""
    info = tmp_path / "langflow_sandbox_createos-0.3.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: langflow-sandbox-createos\nVersion: 0.3.0\n")
    (info / "entry_points.txt").write_text(
        "[langflow.extensions]\nlangflow-sandbox-createos = langflow_sandbox_createos\n"
    )
    return metadata.PathDistribution(info)


def test_found_by_display_name_through_lfx_discovery(tmp_path: Path) -> None:
    found, errors = discover_installed_extensions([_editable_distribution(tmp_path)])
    assert errors == []
    [record] = found
    assert record.extension_id == "langflow-sandbox-createos"
    assert record.extension_root.resolve() == PACKAGE_DIR
    results = load_extension_bundles(record.extension_root)
    components = [c for r in results for c in r.components]
    assert [r.errors for r in results] == [[]]
    names = {c.klass.display_name: c for c in components}
    assert "CreateOS Sandbox" in names
    assert names["CreateOS Sandbox"].namespaced_id == "ext:createos:CreateOSSandboxComponent@official"


def test_declared_inputs_outputs_and_metadata(component_cls: type) -> None:
    component = component_cls()
    assert component_cls.display_name == "CreateOS Sandbox"
    assert component_cls.name == "CreateOSSandbox"
    from lfx.components.utilities.python_repl_core import PythonREPLComponent

    assert component_cls.icon == "container" != PythonREPLComponent.icon  # its own icon
    inputs = {i.name: i for i in component.inputs}
    assert "code" not in inputs
    assert list(inputs) == [
        "python_code",
        "command",
        "session_mode",
        "collect_artifacts",
        "allow_network",
        "timeout_seconds",
        "shape",
    ]
    assert inputs["python_code"].value == "print('hello from a microVM')"
    assert inputs["python_code"].display_name == "Python Code"
    assert inputs["command"].value == "" and inputs["command"].display_name == "Command"
    assert (
        inputs["session_mode"].options == ["off", "flow", "session"] and inputs["session_mode"].value == "off"
    )
    assert inputs["session_mode"].display_name == "Guest Reuse"
    assert (
        inputs["collect_artifacts"].value is False
        and inputs["collect_artifacts"].display_name == "Return Files"
    )
    assert inputs["allow_network"].value is False and inputs["allow_network"].display_name == "Allow Network"
    assert (
        inputs["timeout_seconds"].value == 60
        and inputs["timeout_seconds"].display_name == "Timeout (seconds)"
    )
    assert inputs["shape"].display_name == "Shape" and inputs["shape"].placeholder == "s-2vcpu-4gb"
    outputs = {o.name: o for o in component.outputs}
    assert [(o.display_name, o.method) for o in outputs.values()] == [
        ("Results", "run_sandbox"),
        ("Files", "collected_files"),
    ]
    node = component.to_frontend_node()
    template = node["data"]["node"]["template"]
    assert "code" in template and template["python_code"]["value"] == "print('hello from a microVM')"
    assert node["data"]["node"]["outputs"][0]["types"] == [Data.__name__]  # Data is lfx's JSON
    assert node["data"]["node"]["outputs"][1]["types"] == [DataFrame.__name__]  # DataFrame is lfx's Table


def test_check_timeout() -> None:
    assert engine.check_timeout(60) == 60
    assert engine.check_timeout("15") == 15
    assert engine.check_timeout(3600) == 3600
    assert engine.check_timeout(7.0) == 7


def test_bundle_display_name_and_icon_as_lfx_reads_them() -> None:
    """lfx's manifest model carries the bundle's sidebar label and Lucide icon (snake_case keys)."""
    [bundle] = load_manifest(PACKAGE_DIR).manifest.bundles
    assert (bundle.name, bundle.display_name, bundle.icon) == ("createos", "CreateOS", "Server")


def test_documentation_link_is_this_projects_docs(component_cls: type) -> None:
    import tomllib

    from langflow_sandbox_createos import DOCS_URL

    assert component_cls.documentation == f"{DOCS_URL}/component.md"
    assert "createos-plugin" not in component_cls.documentation  # the 0.2.0 plugin's repository
    assert (PACKAGE_DIR.parent / "docs" / "component.md").is_file()
    project = tomllib.loads((PACKAGE_DIR.parent / "pyproject.toml").read_text())["project"]
    assert project["urls"]["Documentation"] == DOCS_URL


def test_lfx_still_refuses_starter_projects_in_the_manifest() -> None:
    """Why the starter flow ships as a file (docs/operations.md): lfx 1.13 reserves the
    manifest's ``starterProjects`` and refuses a value. When this fails, ship it there."""
    manifest = json.loads((PACKAGE_DIR / "extension.json").read_text())
    ExtensionManifest.model_validate(manifest)
    with pytest.raises(ValueError, match=r"starterProjects|starter_projects"):
        ExtensionManifest.model_validate(
            {**manifest, "starterProjects": ["starter/createos_starter_flow.json"]}
        )
