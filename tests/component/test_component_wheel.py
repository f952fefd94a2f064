"""The built wheel ships the extension: manifest, bundle modules, and a working entry point."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from .conftest import PACKAGE_DIR

REPO = PACKAGE_DIR.parent

PROBE = textwrap.dedent(
    """
    import sys
    from importlib import metadata
    from lfx.extension.discovery import discover_installed_extensions
    from lfx.extension.loader import load_extension_bundles

    site = sys.argv[1]
    dists = [d for d in metadata.distributions(path=[site]) if d.metadata["Name"] == "langflow-sandbox-createos"]
    [ep] = [e for e in dists[0].entry_points if e.group == "langflow.extensions"]
    print("entry point", ep.value)
    found, errors = discover_installed_extensions(dists)
    assert errors == [], errors
    [record] = found
    assert str(record.extension_root).startswith(site), record.extension_root
    import langflow_sandbox_createos
    assert langflow_sandbox_createos.__file__.startswith(site), langflow_sandbox_createos.__file__
    results = load_extension_bundles(record.extension_root)
    assert all(not r.errors for r in results), [r.errors for r in results]
    names = [c.klass.display_name for r in results for c in r.components]
    print("components", names)
    """
)


@pytest.mark.slow
def test_wheel_contains_the_extension_and_its_entry_point_resolves(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    build = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        str(REPO),
        "--no-deps",
        "--no-build-isolation",
        "-q",
        "-w",
        str(wheels),
    ]
    done = subprocess.run(build, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    [wheel] = wheels.glob("langflow_sandbox_createos-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for member in (
        "langflow_sandbox_createos/extension.json",
        "langflow_sandbox_createos/components/createos/createos_sandbox.py",
        "langflow_sandbox_createos/component/engine.py",
        "langflow_sandbox_createos/component/artifacts.py",
    ):
        assert member in names, member
    entry_points = (
        zipfile.ZipFile(wheel)
        .read(next(n for n in names if n.endswith(".dist-info/entry_points.txt")))
        .decode()
    )
    assert "[langflow.extensions]\nlangflow-sandbox-createos = langflow_sandbox_createos" in entry_points

    site = tmp_path / "site"
    install = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)]
    done = subprocess.run(install, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, str(site)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site), "HOME": str(tmp_path)},
    )
    assert probe.returncode == 0, probe.stdout + probe.stderr[-3000:]
    assert "entry point langflow_sandbox_createos" in probe.stdout
    assert "'CreateOS Sandbox'" in probe.stdout
