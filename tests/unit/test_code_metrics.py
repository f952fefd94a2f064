"""scripts/code_metrics.py on a small made-up checkout: every count and its rule."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

FILES = {
    "pyproject.toml": '[project]\nname = "x"\nversion = "9.8.7"\n\n[tool.other]\nversion = "1.0"\n',
    "langflow_sandbox_createos/__init__.py": '__version__ = "9.8.7"\n',
    "langflow_sandbox_createos/_createos.pyi": "def f() -> None: ...\n",
    "langflow_sandbox_createos/extension.json": '{\n  "version": "9.8.7",\n  "meta": {"version": "9.8.7"}\n}\n',
    # a folder whose __init__ imports its submodule: no circle
    "langflow_sandbox_createos/core/__init__.py": "from .runtime import key_digest\n",
    "langflow_sandbox_createos/core/runtime.py": (
        "import hashlib\n"
        "from langflow_sandbox_createos import _createos, settings\n"
        'USER_AGENT = "x/9.8.7"\n'
        "EXEC_GRACE_SECONDS = 15.0\n"
        "def key_digest(key: str) -> str:\n"
        "    return hashlib.blake2s(key.encode()).hexdigest()\n"
        "def unrelated(parts: list[str]) -> str:\n"
        '    return hashlib.sha256(":".join(parts).encode()).hexdigest()\n'
    ),
    "langflow_sandbox_createos/settings.py": (
        "import os\n"
        "def api_key() -> str:\n"
        '    for name in ("CREATEOS_SANDBOX_API_KEY", "CREATEOS_API_KEY"):\n'
        "        if name in os.environ:\n"
        "            return os.environ[name]\n"
        '    return ""\n'
        "def refuse(name: str) -> bool:\n"
        '    return name in ("CREATEOS_SANDBOX_API_KEY", "CREATEOS_API_KEY")\n'
    ),
    # a circle: eager one way, lazy (inside a function) the other
    "langflow_sandbox_createos/backend/run.py": (
        "from langflow_sandbox_createos.backend import pool\n"
        "from langflow_sandbox_createos.core import runtime\n"
        "from .. import settings\n"
        "class Backend:\n"
        "    GRACE = 1\n"
        "    def run(self) -> dict:\n"
        "        key = settings.api_key()\n"
        "        connection.key_digest(key)\n"
        '        return {"shape": "s", "rootfs": "r", "auto_pause_after_seconds": 5, "name": "n"}\n'
    ),
    "langflow_sandbox_createos/backend/pool.py": (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from langflow_sandbox_createos.core.runtime import key_digest\n"
        "class Key:\n"
        "    def create_spec(self) -> dict:\n"
        '        return {"shape": 1, "rootfs": 2, "auto_pause_after_seconds": 3}\n'
        "class ExecKey(Key):\n"
        "    def create_spec(self) -> dict:\n"
        "        spec = super().create_spec()\n"
        '        spec["envs"] = {}\n'
        "        return spec\n"
        "def later() -> None:\n"
        "    from . import run\n"
    ),
    # a guest's life, written by hand: a create, an admission, an error mapping (and the mapping's
    # one place), a run_program that creates, one that adopts
    "langflow_sandbox_createos/executor/run.py": (
        "def run(endpoint, line, client, self):\n"
        "    line.enter(1)\n"
        "    self.backend_line.try_enter_spare(1)\n"
        "    slot.enter()\n"
        "    try:\n"
        "        endpoint.client.create({})\n"
        "    except Exception as exc:\n"
        '        raise to_lfx_error(exc, "create") from None\n'
        '    with native_errors("run"):\n'
        '        client.run_program({}, "sh")\n'
        '        client.run_program({}, "sh", sandbox_id="x")\n'
        '        guest.run_program("sh")\n'
        "    pool.create()\n"
    ),
    "tests/backend/test_keeper.py": "def test_x() -> None: ...\n",
    "tests/core/test_lease.py": "def test_y() -> None: ...\n",
    "tests/keeper_child.py": "WAYS = ()\n",
    # leaves out guest/ and local/ from the concept counts
    "langflow_sandbox_createos/local/store.py": (
        'EXEC_GRACE_SECONDS = 1\ndef view() -> dict:\n    return {"shape": 1, "rootfs": 2, "auto_pause_after_seconds": 3}\n'
    ),
    "csrc/module.c": (
        '#define MODULE_VERSION "9.8.7"\n'
        "#define LONG(x) \\\n    { x }\n"
        "static int table[] = {1, 2};\n"
        "struct s {\n    int a;\n};\n"
        "/* a { in a comment */\n"
        "static int\nsmall(int a)\n{\n    return a;\n}\n"
        "WRAP(small)\n\n"
        'static const char *longer(void)\n{\n    if (1) {\n        return "}";\n    }\n    return 0;\n}\n'
    ),
}


@pytest.fixture
def result(cm: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    for rel, text in FILES.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    monkeypatch.setattr(cm.shutil, "which", lambda name: None)  # no duplicates run here
    return cm.measure(tmp_path, "test")


def test_sizes_per_folder(result: dict[str, Any]) -> None:
    folders = {f["folder"]: (f["modules"], f["lines"]) for f in result["python"]["folders"]}
    assert folders == {
        "(root)": (2, 9),
        "backend/": (2, 22),
        "core/": (2, 9),
        "executor/": (1, 13),
        "local/": (1, 3),
    }
    assert result["python"]["total_modules"] == 8
    assert result["python"]["longest_functions"][:2] == [
        {"name": "executor/run.py:run", "line": 1, "lines": 13},
        {"name": "settings.py:api_key", "line": 2, "lines": 5},
    ]
    assert result["duplicates"]["trees"][0]["pairs"] is None


def test_c_functions_by_brace_scan(result: dict[str, Any]) -> None:
    assert result["c"]["longest_functions"] == [
        {"name": "csrc/module.c:longer", "line": 16, "lines": 7},
        {"name": "csrc/module.c:small", "line": 9, "lines": 5},
    ]


def test_one_circle_with_its_lazy_edge(result: dict[str, Any]) -> None:
    circles = result["import_circles"]
    assert circles["all_edges"] == [
        {
            "modules": ["backend/pool.py", "backend/run.py"],
            "edges": [
                {"from": "backend/pool.py:13", "to": "backend/run.py", "kind": "lazy"},
                {"from": "backend/run.py:1", "to": "backend/pool.py", "kind": "eager"},
            ],
        }
    ]
    assert circles["eager_edges_only"] == []
    assert circles["edges_by_kind"] == {"eager": 5, "lazy": 1, "type-only": 1}


def test_concepts(result: dict[str, Any]) -> None:
    concepts = result["concepts"]
    assert [(p["where"], p["scope"]) for p in concepts["create_spec"]] == [
        ("backend/pool.py:6", "Key.create_spec"),
        ("backend/pool.py:9", "ExecKey.create_spec"),
        ("backend/run.py:9", "Backend.run"),
    ]
    assert concepts["grace_by_name"] == {"EXEC_GRACE_SECONDS": 1, "GRACE": 1}
    assert [p["where"] for p in concepts["api_key"]["reads"]] == ["backend/run.py:7", "settings.py:3"]
    assert [p["where"] for p in concepts["api_key"]["digests"]] == ["core/runtime.py:6"]
    version = concepts["version"]
    assert version["version"] == "9.8.7"
    assert [v["where"] for v in version["defined"]] == [
        "pyproject.toml:3",
        "langflow_sandbox_createos/__init__.py:1",
        "langflow_sandbox_createos/extension.json:2",
        "csrc/module.c:1",
    ]
    assert [v["where"] for v in version["embedded"]] == [
        "langflow_sandbox_createos/core/runtime.py:3",
        "langflow_sandbox_createos/extension.json:3",
    ]


def test_a_guests_life_by_hand(result: dict[str, Any]) -> None:
    concepts = result["concepts"]
    assert [(p["where"], p["how"]) for p in concepts["guest_creates"]] == [
        ("executor/run.py:10", "run_program without sandbox_id"),
        ("executor/run.py:6", "endpoint.client.create"),
    ]
    assert [p["how"] for p in concepts["admission_blocks"]] == [
        "line.enter",
        "self.backend_line.try_enter_spare",
    ]
    assert [p["where"] for p in concepts["error_mappings"]] == ["executor/run.py:7"]
    assert [p["where"] for p in concepts["error_mapping_uses"]] == ["executor/run.py:9"]
    assert concepts["keeper_test_files"] == ["tests/backend/test_keeper.py", "tests/core/test_lease.py"]


def test_markdown_and_cli(cm: ModuleType, result: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    text = cm.markdown(result)
    assert "| import circles, eager edges only | 0 |" in text
    assert "- backend/pool.py:13 -> backend/run.py (lazy)" in text
    assert "| admission blocks (places / modules) | 2 / 1 |" in text
    assert "| keeper test files | 2 |" in text
    with pytest.raises(SystemExit):
        cm.main([str(Path(cm.__file__).parent)])  # scripts/ has no package folder
    assert "has no langflow_sandbox_createos/ folder" in capsys.readouterr().err
