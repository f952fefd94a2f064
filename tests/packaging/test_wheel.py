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

import importlib.util
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
    f"{PKG}/executor/framing.py",
    f"{PKG}/executor/guest/main.py",
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


# The static libraries of the self-contained build, as `make dist` leaves them (build/deps),
# and the Debian source versions they were built from.
STATIC_DEPS = ROOT / "build" / "deps" / "x86_64" / ".complete"
STATIC_SOURCES = ROOT / "build" / "deps" / "src" / "VERSIONS"


def upstream(debian_version: str) -> str:
    """8.14.1 of 8.14.1-2+deb13u5: what the library itself reports."""
    return debian_version.rsplit("-", 1)[0].split(":")[-1]


@pytest.fixture(scope="module")
def manylinux(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What ``make dist`` ships for x86_64: scripts/build-wheel.sh on the sdist (zig cc, glibc
    2.28, the static libcurl/nghttp2/OpenSSL/jansson of build/deps; about 1 min).

    Only where ``make dist`` has built those libraries already: from nothing they take several
    minutes per architecture, more than CI's budget has, so a clean checkout (CI) skips the
    tests that use this wheel. What CI runs instead, in seconds: the abi3audit and tag checks
    below (test_abi3audit_and_check_wheels_on_the_source_built_wheel). The release check of
    the real wheels, both architectures, is ``make dist`` (it ends with ``make check-wheels``)."""
    if not STATIC_DEPS.exists() or importlib.util.find_spec("ziglang") is None:
        pytest.skip(
            "the self-contained wheel needs build/deps and ziglang: run `make dist` once "
            "(its own check-wheels is the release check)"
        )
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


SOCKS_PROBE = """
import json, os, socket, sys, threading
from langflow_sandbox_createos import _createos
listener = socket.create_server(("127.0.0.1", 0))
listener.settimeout(0.2)
accepted, stop = [], threading.Event()
def serve():
    while not stop.is_set():
        try:
            conn, _ = listener.accept()
        except OSError:
            continue
        accepted.append(1)
        conn.close()
threading.Thread(target=serve, daemon=True).start()
for var in ("https_proxy", "HTTPS_PROXY", "all_proxy", "no_proxy", "NO_PROXY"):
    os.environ.pop(var, None)
out = {}
for scheme in ("socks5h", "socks5", "socks4a", "socks4"):
    os.environ["ALL_PROXY"] = f"{scheme}://127.0.0.1:{listener.getsockname()[1]}"
    with _createos.Client("https://localhost:9", "sx-probe-0123456789", connect_timeout=2, control_timeout=3) as client:
        try:
            client.whoami()
            out[scheme] = "answered"
        except _createos.CreateOSError as exc:
            out[scheme] = f"{type(exc).__name__}: {exc}"
stop.set()
out["connections"] = len(accepted)
out["module"] = _createos.__file__
print(json.dumps(out))
"""


def test_manylinux_wheel_has_no_socks(manylinux: Path, tmp_path: Path) -> None:
    """The self-contained wheel's libcurl is built without SOCKS (scripts/patches/curl-no-socks.patch,
    docs/operations.md): a SOCKS proxy in ALL_PROXY, of every kind, is refused before any
    connection (UnavailableError, not a retryable TransientError), and the SOCKS handshakes
    (lib/socks.c) are not in the module. With ac8509d's build script, whose libcurl had SOCKS,
    the client connected to the proxy (as the system libcurl of a source build does)."""
    python = fresh_venv(tmp_path / "venv")
    run([uv(), "pip", "install", "-q", "--no-deps", "--python", python, manylinux], cwd=tmp_path)
    out = json.loads(run([python, "-c", SOCKS_PROBE], cwd=tmp_path).stdout.strip().splitlines()[-1])
    assert out["connections"] == 0, out
    for scheme in ("socks5h", "socks5", "socks4a", "socks4"):
        assert out[scheme].startswith("UnavailableError: whoami failed: "), out
        assert "built without SOCKS support" in out[scheme], out
    module = Path(out["module"]).read_bytes()
    assert b"SOCKS4 connection to" not in module  # a message of lib/socks.c only
    assert b"built without SOCKS support" in module  # the patch's refusal


def check_wheels(*wheels: Path) -> subprocess.CompletedProcess[str]:
    """scripts/check-wheels.py (make check-wheels), with .venv's abi3audit and auditwheel."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    argv = [sys.executable, ROOT / "scripts" / "check-wheels.py", *wheels]
    return subprocess.run(list(map(str, argv)), capture_output=True, text=True, env=env, timeout=300)


def renamed(wheel: Path, where: Path, old: str, new: str) -> Path:
    """A copy of wheel whose file name says new where it said old."""
    assert old in wheel.name, (old, wheel.name)
    copy = where / wheel.name.replace(old, new)
    copy.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(wheel, copy)
    return copy


def test_abi3audit_and_check_wheels_on_the_source_built_wheel(dist: Path, tmp_path: Path) -> None:
    """What every `make test` (CI) checks of the wheel tags, in seconds and without the cross
    build: the cp310-abi3 wheel the sdist builds here passes ``abi3audit --strict`` (nothing
    outside the stable ABI of CPython 3.10: the check that fails first when the C code reaches
    outside the Limited API), and scripts/check-wheels.py, which ``make dist`` runs on the
    release wheels, refuses it and each wrongly tagged copy of it, naming why (``auditwheel
    show`` included)."""
    wheel = only(dist, "*.whl")
    abi3audit = Path(sys.executable).parent / "abi3audit"
    assert abi3audit.exists(), "abi3audit is missing: it is in the [test] extra"
    audit = subprocess.run(
        [abi3audit, "--strict", "--report", wheel], capture_output=True, text=True, timeout=300
    )
    assert audit.returncode == 0, audit.stdout + audit.stderr
    (so,) = json.loads(audit.stdout)["specs"][str(wheel)]["wheel"]
    assert so["name"].endswith("_createos.abi3.so"), so
    assert so["result"]["non_abi3_symbols"] == [], so
    assert so["result"]["is_abi3_baseline_compatible"] is True, so  # nothing newer than 3.10

    # the plain wheel itself: linux_x86_64, not a manylinux tag
    proc = check_wheels(wheel)
    assert proc.returncode == 1 and "not manylinux_2_28 (or older)" in proc.stdout, proc.stdout
    plat = "linux_x86_64"
    wrong = {
        # the file name's Python tag
        "tag cp311-cp311, not cp310-abi3": renamed(wheel, tmp_path / "a", "cp310-abi3", "cp311-cp311"),
        # a glibc baseline newer than 2.28
        "platform manylinux_2_34_x86_64, not manylinux_2_28": renamed(
            wheel, tmp_path / "b", plat, "manylinux_2_34_x86_64"
        ),
        # the architecture: an x86_64 module under an aarch64 name
        "is EM_X86_64, the tag says aarch64": renamed(wheel, tmp_path / "c", plat, "manylinux_2_28_aarch64"),
        # the right name on a module that needs the system libcurl: the ELF check and auditwheel
        "libraries outside the wheel": renamed(wheel, tmp_path / "d", plat, "manylinux_2_28_x86_64"),
    }
    for why, bad in wrong.items():
        proc = check_wheels(bad)
        assert proc.returncode == 1, (why, proc.stdout, proc.stderr)
        assert f"FAIL {bad.name}" in proc.stdout and why in proc.stdout, (why, proc.stdout)
    proc = check_wheels(wrong["libraries outside the wheel"])
    assert "!! auditwheel" in proc.stdout, proc.stdout  # auditwheel show does not allow the tag either


def test_check_wheels_accepts_the_self_contained_wheel_and_refuses_a_wrong_tag(
    manylinux: Path, tmp_path: Path
) -> None:
    """scripts/check-wheels.py on the wheel `make dist` ships: abi3audit, auditwheel show, the
    ELF all pass; the same file under a wrong name fails."""
    good = check_wheels(manylinux)
    assert good.returncode == 0 and f"ok   {manylinux.name}" in good.stdout, good.stdout
    assert "0 violations" in good.stdout, good.stdout
    assert 'consistent with the following platform tag: "manylinux_2_28_x86_64"' in good.stdout, good.stdout
    wrong = {
        "tag cp311-cp311, not cp310-abi3": renamed(manylinux, tmp_path / "a", "cp310-abi3", "cp311-cp311"),
        "is EM_X86_64, the tag says aarch64": renamed(manylinux, tmp_path / "b", "x86_64", "aarch64"),
        # the module needs glibc 2.28: a manylinux2014 (2.17) name would lie
        "newer than the tag's": renamed(manylinux, tmp_path / "c", "manylinux_2_28", "manylinux_2_17"),
    }
    for why, bad in wrong.items():
        proc = check_wheels(bad)
        assert proc.returncode == 1 and why in proc.stdout, (why, proc.stdout, proc.stderr)


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
    # uv wraps the build's output to its own width, at places the random temporary paths in it decide
    said = " ".join(no_cc.stderr.split())
    assert "cannot build the native client: a C compiler missing" in said, no_cc.stderr[-3000:]
    assert "sudo apt-get install gcc" in said and "prebuilt wheel" in said

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
    said = " ".join(no_headers.stderr.split())
    assert "the libcurl headers (curl/curl.h) missing" in said, no_headers.stderr[-3000:]
    assert "libcurl4-openssl-dev" in said


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
    jansson masked: it runs on the copies linked into it (the versions build/deps built from
    Debian 13's sources) and talks to createos-local (a real guest runs).
    The plain wheel, in the same sandbox, cannot even import: the masking is real."""
    python = fresh_venv(tmp_path / "venv")
    run([uv(), "pip", "install", "-q", "--no-deps", "--python", python, manylinux], cwd=tmp_path)
    probe = [python, "-c", USE_THE_CLIENT, control_plane.url, control_plane.api_key]
    done = in_bubblewrap_without_system_libraries(probe, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    curl, jansson, code, out = done.stdout.strip().split("|")
    assert (code, out) == ("0", "ran in a guest")
    built = dict(line.split(" ", 1) for line in STATIC_SOURCES.read_text().splitlines())
    assert (curl, jansson) == (upstream(built["curl"]), upstream(built["jansson"])), built

    plain = fresh_venv(tmp_path / "plain")
    run([uv(), "pip", "install", "-q", "--no-deps", "--python", plain, only(dist, "*.whl")], cwd=tmp_path)
    system = run([plain, "-c", USE_THE_CLIENT, control_plane.url, control_plane.api_key], cwd=tmp_path)
    assert system.stdout.strip().endswith("|0|ran in a guest"), system.stdout  # outside it works
    refused = in_bubblewrap_without_system_libraries([plain, "-c", USE_THE_CLIENT, "x", "y"], tmp_path)
    assert refused.returncode != 0
    assert re.search(r"lib(curl|jansson)\.so\.4", refused.stderr), refused.stderr


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


# Where the distributions of the manylinux_2_28 baseline keep the system CA bundle (csrc/client.c,
# ca_probe), and no bundle at all.
CA_LAYOUTS = {
    "debian-ubuntu": "/etc/ssl/certs/ca-certificates.crt",
    "rhel-fedora-amazon": "/etc/pki/tls/certs/ca-bundle.crt",
    "rhel-extracted": "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "suse": "/etc/ssl/ca-bundle.pem",
    "none": None,
}

WHOAMI = """
import sys
from langflow_sandbox_createos import _createos
with _createos.Client(sys.argv[1], sys.argv[2], control_timeout=10) as client:
    try:
        print("ok", "user_id" in client.whoami())
    except _createos.UnavailableError as exc:
        print("refused", exc)
"""


def test_manylinux_wheel_finds_the_ca_bundle_where_each_distribution_keeps_it(
    manylinux: Path, tmp_path: Path
) -> None:
    """The self-contained wheel over HTTPS (createos-local with a private CA), in bubblewrap
    with an /etc of its own that holds the CA bundle at one distribution's path and nowhere
    else, SSL_CERT_FILE and CURL_CA_BUNDLE unset: it verifies the server at each path, and
    refuses it when no bundle is there (the bundle found is what it trusts)."""
    pki = tmp_path / "pki"
    pki.mkdir()
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
            "-keyout", "ca.key", "-out", "ca.pem", cwd=pki)  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
            "-keyout", "server.key", "-out", "server.csr", cwd=pki)  # fmt: skip
    (pki / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-extfile", "san.ext", "-out", "server.pem", cwd=pki)  # fmt: skip
    python = fresh_venv(tmp_path / "venv")
    run([uv(), "pip", "install", "-q", "--no-deps", "--python", python, manylinux], cwd=tmp_path)

    from langflow_sandbox_createos.local.testing import LocalControlPlane

    seen = {}
    with LocalControlPlane(
        boot_delay_ms=0, tls=(pki / "server.pem", pki / "server.key", pki / "ca.pem")
    ) as plane:
        assert plane.url.startswith("https://localhost:"), plane.url
        for layout, path in CA_LAYOUTS.items():
            # an /etc of its own: what the interpreter and the resolver need, and the bundle
            bwrap = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/etc"]
            for keep in ("ld.so.cache", "hosts", "nsswitch.conf", "passwd", "group", "resolv.conf"):
                if Path("/etc", keep).exists():
                    bwrap += ["--ro-bind", f"/etc/{keep}", f"/etc/{keep}"]
            if path:
                bwrap += ["--ro-bind", str(pki / "ca.pem"), path]
            env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
            proc = subprocess.run(
                [*bwrap, "--die-with-parent", "--", str(python), "-c", WHOAMI, plane.url, plane.api_key],
                cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert proc.returncode == 0, (layout, proc.stdout, proc.stderr)
            seen[layout] = proc.stdout.strip()
    for layout, path in CA_LAYOUTS.items():
        if path:
            assert seen[layout] == "ok True", (layout, seen)
        else:
            assert seen[layout].startswith("refused") and "certificate" in seen[layout].lower(), seen
