"""One version everywhere a release states it (docs/operations.md, "Release name and version")."""

from __future__ import annotations

import json
import re
from importlib import metadata
from pathlib import Path

import tomllib

import langflow_sandbox_createos
from langflow_sandbox_createos import _createos

ROOT = Path(__file__).resolve().parents[2]


def test_every_version_string_agrees_and_follows_0_2_0() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    manifest = json.loads((ROOT / "langflow_sandbox_createos" / "extension.json").read_text())
    module_c = re.search(r'#define MODULE_VERSION "([^"]+)"', (ROOT / "csrc" / "module.c").read_text())
    assert module_c is not None
    assert {
        "pyproject": version,
        "__version__": langflow_sandbox_createos.__version__,
        "_createos": _createos.__version__,
        "module.c": module_c.group(1),
        "extension.json": manifest["version"],
        "installed metadata": metadata.version("langflow-sandbox-createos"),
    } == dict.fromkeys(
        ("pyproject", "__version__", "_createos", "module.c", "extension.json", "installed metadata"), version
    )
    # Released under the 0.2.0 plugin's name, so it must sort after it for `pip install -U`.
    assert tuple(int(p) for p in version.split(".")[:3]) > (0, 2, 0)
    changelog = (ROOT / "docs" / "changelog.md").read_text()
    assert f"## {version}" in changelog
