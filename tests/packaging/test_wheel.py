"""Packaging proofs: ``python -m build`` makes an sdist and (from that sdist) a cp310-abi3 wheel;
the wheel carries everything Langflow needs; installed into a fresh venv, all three entry points
resolve; the sdist alone builds the extension against the system libcurl and jansson, and a
source build without a compiler or the headers names the packages to install; the
self-contained manylinux_2_28 wheel (scripts/build-wheel.sh, what `make dist` ships) runs
where no libcurl or jansson is installed; scripts/check-wheels.py refuses a wrong tag.

Fresh venvs are made with uv (seconds, packages come from uv's cache that
``make langflow`` filled), never with the checkout on sys.path.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(3600)

ROOT = Path(__file__).resolve().parents[2]
PKG = "langflow_sandbox_createos"
EXT = re.compile(rf"^{PKG}/_createos\.abi3\.so$")
WHEEL_MUST_HAVE = [
    f"{PKG}/_createos.pyi",
    f"{PKG}/py.typed",
    f"{PKG}/extension.json",
    f"{PKG}/components/createos/__init__.py",
    f"{PKG}/components/createos/createos_sandbox.py",
    f"{PKG}/guest/runner.py",
    f"{PKG}/starter/createos_starter_flow.json",
    f"{PKG}/starter/createos_starter_recipe.json",
    "createos_langflow.py",  # the createos-langflow launcher
]
ENTRY_POINTS = {
    "lfx.sandbox_backends": ("createos", f"{PKG}.backend:create_backend"),
    "langflow.extensions": ("langflow-sandbox-createos", PKG),
    "lfx.executors": ("createos", f"{PKG}.executor:CreateOSExecutor"),
}


def uv() -> str:
    for candidate in (Path(sys.executable).parent / "uv", shutil.which("uv")):
        if candidate and Path(candidate).exists():
            return str(candidate)
    pytest.fail("uv is missing: `make test` installs it into .venv (pip install uv)")


def run(argv: list[str | Path], cwd: Path, **kw: object) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(kw.pop("env", {}))  # type: ignore[arg-type]
    timeout = kw.pop("timeout", 600)
    proc = subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, **kw
    )
    assert proc.returncode == 0, (
        f"{argv} exited {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    )
    return proc


def fresh_venv(where: Path) -> Path:
    run([uv(), "venv", "-q", "--python", sys.executable, where], cwd=where.parent)
    return where / "bin" / "python"


def needed_libraries(so: Path) -> list[str]:
    out = run(["readelf", "-d", so], cwd=so.parent).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def ldd(so: Path) -> dict[str, str]:
    out = run(["ldd", so], cwd=so.parent).stdout
    return {m.group(1): m.group(2) for m in re.finditer(r"^\s*(\S+) => (\S+)", out, re.M)}


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``python -m build``: the sdist first, then the wheel built from that sdist."""
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "build", "--installer", "uv", "--outdir", out, ROOT], cwd=ROOT)
    return out


def only(directory: Path, pattern: str) -> Path:
    found = sorted(directory.glob(pattern))
    assert len(found) == 1, (pattern, found)
    return found[0]


def test_build_makes_an_sdist_and_a_wheel(dist: Path) -> None:
    sdist = only(dist, "langflow_sandbox_createos-*.tar.gz")
    wheel = only(dist, "langflow_sandbox_createos-*.whl")
    assert re.search(r"-cp310-abi3-linux_x86_64\.whl$", wheel.name), wheel.name
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    # Everything the extension build needs, headers included (MANIFEST.in), and no binary.
    csrc = {p.relative_to(ROOT).as_posix() for p in (ROOT / "csrc").glob("*.[ch]")}
    assert csrc <= names, sorted(csrc - names)
    assert {"setup.py", "pyproject.toml", f"{PKG}/extension.json", f"{PKG}/_createos.pyi"} <= names
    assert not [n for n in names if n.endswith(".so")]


def test_wheel_contents(dist: Path) -> None:
    wheel = only(dist, "*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    missing = [n for n in WHEEL_MUST_HAVE if n not in names]
    assert not missing, missing
    assert [n for n in names if EXT.match(n)], "no extension module in the wheel"
    entry_points = zipfile.ZipFile(wheel).read(
        next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    )
    for group, (name, value) in ENTRY_POINTS.items():
        assert f"[{group}]" in entry_points.decode() and f"{name} = {value}" in entry_points.decode()
    manifest = json.loads(zipfile.ZipFile(wheel).read(f"{PKG}/extension.json"))
    assert manifest["bundles"] == [
        {"name": "createos", "path": "components/createos", "display_name": "CreateOS", "icon": "Server"}
    ]


@pytest.fixture(scope="module")
def installed(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``pip install`` of the wheel (with its dependencies, lfx among them) into an empty venv."""
    where = tmp_path_factory.mktemp("installed")
    python = fresh_venv(where / "venv")
    run([uv(), "pip", "install", "-q", "--python", python, only(dist, "*.whl")], cwd=where)
    return python


def test_wheel_in_a_fresh_venv_resolves_all_three_entry_points(installed: Path, tmp_path: Path) -> None:
    python = installed
    venv = python.parent.parent
    probe = textwrap.dedent(
        f"""
        import importlib.metadata as md, json, sys
        wanted = {json.dumps({g: list(v) for g, v in ENTRY_POINTS.items()})}
        found = {{}}
        for group, (name, value) in wanted.items():
            eps = [ep for ep in md.entry_points(group=group) if ep.name == name]
            assert len(eps) == 1, (group, eps)
            ep = eps[0]
            obj = ep.load()  # resolvable: the target imports
            found[group] = [ep.value, ep.dist.name, getattr(obj, "__name__", "")]
        import langflow_sandbox_createos, langflow_sandbox_createos._createos as native
        found["package"] = langflow_sandbox_createos.__file__
        found["native"] = native.__file__
        json.dump(found, sys.stdout)
        """
    )
    found = json.loads(run([python, "-c", probe], cwd=tmp_path).stdout)
    for group, (_name, value) in ENTRY_POINTS.items():
        assert found[group][:2] == [value, "langflow-sandbox-createos"], found
    assert found["package"].startswith(str(venv)), found  # not the checkout
    assert found["native"].startswith(str(venv)), found


def doctor(python: Path, tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    scrubbed = {k: v for k, v in os.environ.items() if not k.startswith(("LANGFLOW_", "CREATEOS_", "PYTHON"))}
    proc = subprocess.run(
        [python.parent / "createos-langflow", "doctor", "--json"],
        cwd=tmp_path,
        env={**scrubbed, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = json.loads(proc.stdout)
    return proc, next(c for c in report["checks"] if c["name"] == "implementation")


def test_doctor_names_the_implementation_and_warns_when_0_2_0_shadows_it(
    installed: Path, tmp_path: Path
) -> None:
    """The real shadowing: the pure-Python 0.2.0 from PyPI earlier on sys.path (here a
    ``pip install --target`` directory on PYTHONPATH, as a ``pip install --user`` copy is)."""
    _, ok = doctor(installed, tmp_path)
    assert ok["ok"] is True, ok
    assert re.match(
        r"langflow-sandbox-createos 0\.3\.0, native client 0\.3\.0, libcurl [\d.]+, jansson [\d.]+",
        ok["detail"],
    )

    peer = tmp_path / "peer"
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            peer,
            "langflow-sandbox-createos==0.2.0",
        ],
        cwd=tmp_path,
    )
    shadowed = {"PYTHONPATH": str(peer)}
    # What every module-path entry point does in that environment: 0.2.0 has no CLI.
    plain = subprocess.run(
        [installed, "-c", "import langflow_sandbox_createos.cli"],
        cwd=tmp_path,
        env={**os.environ, **shadowed},
        capture_output=True,
        text=True,
    )
    assert "No module named 'langflow_sandbox_createos.cli'" in plain.stderr, plain.stderr

    proc, shadow = doctor(installed, tmp_path, **shadowed)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert shadow["ok"] is False
    assert f"langflow-sandbox-createos 0.2.0 (pure Python, no native client) at {peer}" in shadow["detail"]
    assert "shadows this installation, langflow-sandbox-createos 0.3.0 (native client)" in shadow["detail"]
    assert str(peer / "langflow_sandbox_createos") in shadow["fix"]


def test_sdist_in_a_fresh_venv_builds_against_system_libraries(dist: Path, tmp_path: Path) -> None:
    python = fresh_venv(tmp_path / "venv")
    run([uv(), "pip", "install", "-q", "--no-deps", "--python", python, only(dist, "*.tar.gz")], cwd=tmp_path)
    native = run(
        [python, "-c", "import langflow_sandbox_createos._createos as m; print(m.__file__)"], cwd=tmp_path
    ).stdout.strip()
    so = Path(native)
    assert so.is_relative_to(tmp_path / "venv")
    needed = needed_libraries(so)
    assert any(n.startswith("libcurl.so") for n in needed), needed
    assert any(n.startswith("libjansson.so") for n in needed), needed
    resolved = ldd(so)
    for lib in ("libcurl", "libjansson"):
        path = next(v for k, v in resolved.items() if k.startswith(lib))
        assert path.startswith(("/lib/", "/usr/lib/")), resolved  # the system's copy


@pytest.fixture(scope="module")
def manylinux(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What ``make dist`` ships for x86_64: scripts/build-wheel.sh on the sdist (zig cc, glibc
    2.28, static libcurl/nghttp2/OpenSSL/jansson from build/deps: about 15 min the first time,
    about 1 min once build/deps is cached)."""
    house = tmp_path_factory.mktemp("wheelhouse")
    run(
        [ROOT / "scripts" / "build-wheel.sh", "x86_64", only(dist, "*.tar.gz"), house],
        cwd=ROOT,
        env={"PYTHON": sys.executable},
        timeout=3600,
    )
    return only(house, "*.whl")


def test_manylinux_wheel_is_self_contained(manylinux: Path, tmp_path: Path) -> None:
    """cp310-abi3, manylinux_2_28, one module that needs nothing but glibc."""
    assert re.search(r"-cp310-abi3-manylinux_2_28_x86_64\.whl$", manylinux.name), manylinux.name
    names = zipfile.ZipFile(manylinux).namelist()
    assert not [n for n in names if ".libs/" in n], names  # linked in, not bundled beside
    python = fresh_venv(tmp_path / "venv")
    run([uv(), "pip", "install", "-q", "--no-deps", "--python", python, manylinux], cwd=tmp_path)
    native = run(
        [python, "-c", "import langflow_sandbox_createos._createos as m; print(m.__file__)"], cwd=tmp_path
    ).stdout.strip()
    assert native.endswith("_createos.abi3.so"), native
    needed = needed_libraries(Path(native))
    assert set(needed) <= {"libc.so.6", "libpthread.so.0", "libdl.so.2", "libm.so.6", "librt.so.1"}, needed


def test_check_wheels_accepts_the_wheel_and_refuses_a_wrong_tag(
    manylinux: Path, dist: Path, tmp_path: Path
) -> None:
    """scripts/check-wheels.py (make check-wheels): abi3audit, auditwheel show, the ELF."""
    check = [sys.executable, ROOT / "scripts" / "check-wheels.py"]
    env = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    good = run([*check, "--expect", "x86_64", manylinux], cwd=tmp_path, env=env).stdout
    assert "ok   " + manylinux.name in good, good
    assert "0 violations" in good, good
    wrong = {
        "cp311-cp311": manylinux.name.replace("cp310-abi3", "cp311-cp311"),
        "aarch64 tag on x86_64": manylinux.name.replace("x86_64", "aarch64"),
        "manylinux2014": manylinux.name.replace("manylinux_2_28", "manylinux_2_17"),
    }
    for why, name in wrong.items():
        bad = tmp_path / why.replace(" ", "-") / name
        bad.parent.mkdir()
        shutil.copy(manylinux, bad)
        proc = subprocess.run([*check, bad], capture_output=True, text=True, env={**os.environ, **env})
        assert proc.returncode == 1, (why, proc.stdout, proc.stderr)
        assert "FAIL" in proc.stdout, (why, proc.stdout)
    plain = subprocess.run(
        [*check, only(dist, "*.whl")], capture_output=True, text=True, env={**os.environ, **env}
    )
    assert plain.returncode == 1 and "not manylinux_2_28" in plain.stdout, plain.stdout


def test_a_source_build_without_compiler_or_headers_names_the_packages(dist: Path, tmp_path: Path) -> None:
    """pip install of the sdist with no C compiler, then with the libcurl headers hidden
    (bubblewrap: an empty directory over them): the error names what to install."""
    sdist = only(dist, "*.tar.gz")
    python = fresh_venv(tmp_path / "venv")
    install = [uv(), "pip", "install", "--no-deps", "--no-cache", "--python", python, sdist]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    no_cc = subprocess.run(
        install,
        cwd=tmp_path,
        env={**env, "CC": "/nonexistent/cc"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert no_cc.returncode != 0
    assert "cannot build the native client: a C compiler missing" in no_cc.stderr, no_cc.stderr[-3000:]
    assert "sudo apt-get install gcc" in no_cc.stderr and "prebuilt wheel" in no_cc.stderr

    curl_dirs = [
        p for p in (Path("/usr/include"), Path("/usr/include/x86_64-linux-gnu")) if (p / "curl").is_dir()
    ]
    assert curl_dirs, "no libcurl headers on this machine"
    bwrap = ["bwrap", "--bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--die-with-parent"]
    for d in curl_dirs:
        bwrap += ["--tmpfs", str(d / "curl")]
    no_headers = subprocess.run(
        [*bwrap, "--", *map(str, install)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert no_headers.returncode != 0
    assert "the libcurl headers (curl/curl.h) missing" in no_headers.stderr, no_headers.stderr[-3000:]
    assert "libcurl4-openssl-dev" in no_headers.stderr


USE_THE_CLIENT = """
import sys
from langflow_sandbox_createos import _createos
client = _createos.Client(sys.argv[1], sys.argv[2])
assert client.whoami()["user_id"]
result = client.run_program({"shape": "s-1vcpu-256mb"}, "echo", ["ran in a guest"], timeout=60)
print(_createos.curl_version, _createos.jansson_version, result.exit_code, result.stdout.strip(), sep="|")
"""


def system_copies(*names: str) -> list[Path]:
    """The real files behind every system libcurl and jansson (symlinks resolved)."""
    found = {
        p.resolve()
        for name in names
        for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib")
        for p in Path(d).glob(f"{name}*.so*")
    }
    return sorted(p for p in found if p.is_file())


def in_bubblewrap_without_system_libraries(
    argv: list[str | Path], cwd: Path
) -> subprocess.CompletedProcess[str]:
    """``argv`` in bubblewrap, every system libcurl and jansson replaced by an empty file."""
    masked = system_copies("libcurl", "libjansson")
    assert masked, "no system libcurl/jansson found to mask"
    bwrap = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--die-with-parent"]
    for lib in masked:
        bwrap += ["--ro-bind", "/dev/null", str(lib)]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(cwd)}
    return subprocess.run(
        [*bwrap, "--", *map(str, argv)], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_manylinux_wheel_runs_where_libcurl_and_jansson_are_not_installed(
    manylinux: Path, dist: Path, tmp_path: Path, control_plane
) -> None:
    """The manylinux wheel in a fresh venv, used inside bubblewrap with the system libcurl and
    jansson masked: it runs on the copies linked into it and talks to createos-local (a real
    guest runs).
    The plain wheel, in the same sandbox, cannot even import: the masking is real."""
    python = fresh_venv(tmp_path / "venv")
    run([uv(), "pip", "install", "-q", "--no-deps", "--python", python, manylinux], cwd=tmp_path)
    probe = [python, "-c", USE_THE_CLIENT, control_plane.url, control_plane.api_key]
    done = in_bubblewrap_without_system_libraries(probe, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    curl, jansson, code, out = done.stdout.strip().split("|")
    assert (code, out) == ("0", "ran in a guest")

    plain = fresh_venv(tmp_path / "plain")
    run([uv(), "pip", "install", "-q", "--no-deps", "--python", plain, only(dist, "*.whl")], cwd=tmp_path)
    assert run(
        [plain, "-c", USE_THE_CLIENT, control_plane.url, control_plane.api_key], cwd=tmp_path
    ).stdout.strip() == (
        f"{curl}|{jansson}|0|ran in a guest"
    )  # outside the sandbox the plain wheel works, with the same library versions
    refused = in_bubblewrap_without_system_libraries([plain, "-c", USE_THE_CLIENT, "x", "y"], tmp_path)
    assert refused.returncode != 0
    assert re.search(r"lib(curl|jansson)\.so\.4", refused.stderr), refused.stderr
