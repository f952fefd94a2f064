"""One version everywhere a release states it (docs/operations.md, "Release name and version")."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

import tomllib

import langflow_sandbox_createos
from langflow_sandbox_createos import _createos
from langflow_sandbox_createos.core import connection

ROOT = Path(__file__).resolve().parents[2]


def test_every_version_string_agrees_and_follows_0_2_0() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    # written once, in the package's __init__; pyproject and the C extension take it from there
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "langflow_sandbox_createos.__version__"
    }
    version = langflow_sandbox_createos.__version__
    assert version not in (ROOT / "csrc" / "module.c").read_text() + (ROOT / "csrc" / "client.c").read_text()
    manifest = json.loads((ROOT / "langflow_sandbox_createos" / "extension.json").read_text())
    assert {
        "_createos": _createos.__version__,
        "extension.json": manifest["version"],
        "installed metadata": metadata.version("langflow-sandbox-createos"),
        "user agent": connection.USER_AGENT.rpartition("/")[2],
    } == dict.fromkeys(("_createos", "extension.json", "installed metadata", "user agent"), version)
    # Released under the 0.2.0 plugin's name, so it must sort after it for `pip install -U`.
    assert tuple(int(p) for p in version.split(".")[:3]) > (0, 2, 0)
    changelog = (ROOT / "docs" / "changelog.md").read_text()
    assert f"## {version}" in changelog
