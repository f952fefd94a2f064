"""The real installed lfx, in a fresh process configured only through the environment:
its registry loads our entry point and its own Python Interpreter component runs the code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

from backend.conftest import lfx_process_env  # tests/ is the import root

# Runs in the child. Prints one JSON line on the last line of stdout.
CHILD = r"""
import json, sys
from lfx.utils.sandbox import known_sandbox_backends, resolve_sandbox_backend, SandboxUnavailableError
from lfx.components.utilities.python_repl_core import PythonREPLComponent

report = {"known": list(known_sandbox_backends())}
backend = resolve_sandbox_backend("createos")
report["backend"] = f"{type(backend).__module__}.{type(backend).__qualname__}"
component = PythonREPLComponent(global_imports="math", python_code=sys.argv[1])
try:
    data = component.run_python_repl()
    report["data"] = data.data
except SandboxUnavailableError as exc:
    report["unavailable"] = str(exc)
finally:
    backend.shutdown()
print(json.dumps(report))
"""

# The marker path exists only on the host (a guest has its own /tmp), so the file appears
# only if the code ran in the Langflow process.
GUEST_CODE = (
    "import os, math\n"
    "try:\n    open({marker!r}, 'w').write('ran')\nexcept OSError:\n    pass\n"
    "print('guest', os.environ['CREATEOS_SANDBOX_ID'], math.floor(2.5))\n"
)


def _entry_point_installed() -> bool:
    return any(
        ep.name == "createos" and ep.value == "langflow_sandbox_createos.backend:create_backend"
        for ep in entry_points(group="lfx.sandbox_backends")
    )


pytestmark = pytest.mark.skipif(
    not _entry_point_installed(),
    reason="the package is not pip-installed (pip install --no-build-isolation -e .), so lfx cannot "
    "discover its entry point",
)


def _child(env: dict[str, str], code: str, tmp_path: Path) -> dict[str, Any]:
    workdir = tmp_path / "cwd"
    workdir.mkdir(exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, code],
        env=env,
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_lfx_discovers_the_backend_and_the_python_interpreter_runs_on_a_guest(
    cp: Any, tmp_path: Path
) -> None:
    marker = str(tmp_path / "ran-in-process")
    report = _child(lfx_process_env(cp, tmp_path), GUEST_CODE.format(marker=marker), tmp_path)
    assert "createos" in report["known"]
    assert report["backend"] == "langflow_sandbox_createos.backend.engine.CreateOSBackend"
    assert "unavailable" not in report, report
    assert "result" in report["data"], report
    word, guest_id, floor = report["data"]["result"].split()
    assert (word, floor) == ("guest", "2")
    assert guest_id in {row["id"] for row in cp.sandboxes()}
    assert not os.path.exists(marker), "the code ran in the Langflow process"


def test_missing_key_fails_closed_and_nothing_runs_in_process(cp: Any, tmp_path: Path) -> None:
    env = lfx_process_env(cp, tmp_path)
    del env["CREATEOS_SANDBOX_API_KEY"]
    marker = str(tmp_path / "ran-in-process")
    before = {row["id"] for row in cp.sandboxes()}
    report = _child(env, GUEST_CODE.format(marker=marker), tmp_path)
    assert "createos" in report["known"]
    assert "data" not in report, report
    assert "CREATEOS_SANDBOX_API_KEY" in report["unavailable"]
    assert not os.path.exists(marker), "the code ran in the Langflow process"
    assert {row["id"] for row in cp.sandboxes()} == before


def test_lfx_refuses_egress_off_when_deny_all_is_not_declared(cp: Any, tmp_path: Path) -> None:
    """lfx's dispatcher refuses egress-off code on a backend that does not declare deny-all.
    Without the acknowledgement ours does not (169.254.0.0/16 stays reachable), so lfx's own
    refusal comes first and no guest is created. (With it, the first test above runs.)"""
    env = lfx_process_env(cp, tmp_path)
    del env["LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS"]
    before = cp.sandboxes()
    report = _child(env, "print('ran')", tmp_path)
    assert "data" not in report, report
    assert "cannot block all egress" in report["unavailable"], report  # lfx's message, not ours
    assert cp.sandboxes() == before
