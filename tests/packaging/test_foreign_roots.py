"""The self-contained wheels of `make dist` where nothing else helps them, against createos-local
on this host's loopback (`make prove-wheels`; too slow for every CI run: see docs/operations.md):

- the x86_64 wheel pip-installed into a Debian 13 root (CPython 3.13, made by debootstrap from
  Debian's packages: no compiler, no libcurl or jansson headers): `_createos` imports from the
  wheel, a backend run (lfx's Python Interpreter on the `createos` backend) and a component run
  (the CreateOS Sandbox component in an lfx Graph) return the right output;
- the aarch64 wheel pip-installed into a Debian 12 arm64 root run under qemu-user-static:
  `_createos` imports, and tests/native passes, every control plane it starts being a
  createos-local on the host (foreign/plane_spawner.py, foreign/remote_plane.py).

The roots are made once by scripts/make-debian-root.sh and cached in build/proof-roots (a rerun
reuses them; CREATEOS_PROOF_ROOTS elsewhere), entered with bubblewrap (their own /, the host's
network and PIDs). Skipped unless CREATEOS_PROVE_ROOTS=1.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(7200),
    pytest.mark.skipif(
        not os.environ.get("CREATEOS_PROVE_ROOTS"),
        reason="the Debian-root proofs take long: make prove-wheels (CREATEOS_PROVE_ROOTS=1)",
    ),
]

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
DIST = Path(os.environ.get("CREATEOS_DIST", ROOT / "dist"))
ROOTS = Path(os.environ.get("CREATEOS_PROOF_ROOTS", ROOT / "build" / "proof-roots"))
VENV = "/opt/proof-venv"


def wheel(arch: str) -> Path:
    found = sorted(DIST.glob(f"langflow_sandbox_createos-*-cp310-abi3-manylinux_2_28_{arch}.whl"))
    if len(found) != 1:
        pytest.fail(f"no single {arch} wheel in {DIST} ({found}): run make dist")
    return found[0]


def debian_root(suite: str, arch: str, *extra: str) -> Path:
    dest = ROOTS / f"{suite}-{arch}"
    subprocess.run(
        [ROOT / "scripts" / "make-debian-root.sh", suite, arch, dest, *extra], check=True, timeout=3600
    )
    return dest


def inside(
    root: Path, shared: Path, argv: list[str], timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """argv in the root: its own /, fresh /proc and /dev, the host's network (loopback
    included), resolv.conf and hosts (`localhost`: as a container runtime provides them), and
    `shared` at the same path as on the host."""
    bwrap = ["bwrap", "--bind", str(root), "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    bwrap += ["--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf", "--ro-bind", "/etc/hosts", "/etc/hosts"]
    bwrap += ["--bind", str(shared), str(shared)]
    bwrap += ["--die-with-parent", "--chdir", "/"]
    clean = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8", **(env or {})}
    started = time.monotonic()
    proc = subprocess.run([*bwrap, "--", *argv], env=clean, capture_output=True, text=True, timeout=timeout)
    print(
        f"[{root.name}] {' '.join(argv)[:120]}: exit {proc.returncode} in {time.monotonic() - started:.0f}s"
    )
    return proc


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def shared() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="createos-proof-", dir="/var/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def install(root: Path, shared: Path, whl: Path, *extra: str, timeout: float) -> None:
    """A fresh venv in the root and the wheel with its dependencies from PyPI (lfx among
    them), with pip; nothing is ever compiled (--only-binary :all:)."""
    copy = shared / whl.name
    shutil.copy(whl, copy)
    ok(inside(root, shared, ["rm", "-rf", VENV], 60))
    ok(inside(root, shared, ["python3", "-m", "venv", VENV], 600))
    pip = [f"{VENV}/bin/python", "-m", "pip", "install", "-q", "--only-binary", ":all:", "--no-cache-dir"]
    # pip trusts what the host's pip trusts (a network that inspects TLS has its CA there);
    # only pip, only for the download: the proof itself runs on the root's own bundle
    host_ca = Path(os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt")
    if host_ca.is_file():
        shutil.copy(host_ca, shared / "host-ca.pem")
        pip.insert(3, f"--cert={shared / 'host-ca.pem'}")
    ok(inside(root, shared, [*pip, str(copy), *extra], timeout))


def no_build_tools(root: Path) -> None:
    for tool in ("gcc", "cc", "clang", "x86_64-linux-gnu-gcc", "aarch64-linux-gnu-gcc"):
        assert not (root / "usr/bin" / tool).exists(), f"{tool} in {root}"
    headers = [p for p in (root / "usr/include").rglob("*") if p.name in ("curl.h", "jansson.h")]
    assert headers == [], headers
    libs = [p for p in root.rglob("libcurl*.so*")] + [p for p in root.rglob("libjansson*.so*")]
    assert libs == [], libs  # not even the runtime libraries: the wheel brings its own


def test_x86_64_wheel_in_debian_13(shared: Path, control_plane) -> None:
    root = debian_root("trixie", "amd64")
    no_build_tools(root)
    assert ok(inside(root, shared, ["python3", "--version"], 60)).startswith("Python 3.13")
    started = time.monotonic()
    install(root, shared, wheel("x86_64"), timeout=1800)
    print(f"pip install of the wheel and its dependencies: {time.monotonic() - started:.0f}s")
    script = shared / "proof_run.py"
    shutil.copy(HERE / "foreign" / "proof_run.py", script)
    key = {"CREATEOS_SANDBOX_API_KEY": control_plane.api_key}  # not in argv (it is printed)
    out = ok(inside(root, shared, [f"{VENV}/bin/python", str(script), control_plane.url], 600, env=key))
    report = json.loads(out.strip().splitlines()[-1])
    print(json.dumps(report, indent=1))
    assert report["python"].startswith("3.13")
    assert report["native"].startswith(f"{VENV}/lib/python3.13/site-packages/langflow_sandbox_createos/")
    assert report["native"].endswith("_createos.abi3.so")
    assert report["backend_class"] == "langflow_sandbox_createos.backend.engine.CreateOSBackend"
    word, guest_id, floor = report["backend_result"]["result"].split()
    assert (word, floor) == ("guest", "2")
    assert guest_id in {row["id"] for row in control_plane.sandboxes()}
    assert report["extension_errors"] == []
    component = report["component_result"]
    assert (component["result"], component["exit_code"]) == ("42 linux", 0), component
    assert component["sandbox_id"] in {row["id"] for row in control_plane.sandboxes()}
    assert control_plane.wait_until_no_live(timeout=30.0) == []


# tests/native needs these besides the wheel (the [test] extra, what it uses of it)
NATIVE_TEST_DEPS = ["pytest>=8", "pytest-timeout>=2.3", "hypothesis>=6.100"]
# What of tests/native cannot apply to the self-contained wheel: it loads the system's
# libjansson.so.4 with ctypes to fail jansson's allocations, and the wheel's jansson is linked
# into the module, private (nothing but PyInit__createos is exported). Every other test runs.
NOT_FOR_A_STATIC_JANSSON = "test_small_fixes.py::test_an_allocation_failure_in_jansson_is_memory_error"
# The LD_PRELOAD shims two tests build with gcc (test_deadlines.py, test_cleanup_interrupt.py).
SHIMS = ["stall_getaddrinfo", "stall_delete"]


def cross_built_shims(shared: Path) -> Path:
    """The root has no compiler, by design: the shims are cross-built here with zig cc for
    aarch64 (the ziglang of `make dist`) from the same sources, and a stand-in `gcc` on the
    tests' PATH hands the one asked for over (it copies a file; it compiles nothing)."""
    out = shared / "shims"
    (out / "bin").mkdir(parents=True, exist_ok=True)
    for name in SHIMS:
        subprocess.run(
            [sys.executable, "-m", "ziglang", "cc", "-target", "aarch64-linux-gnu.2.28", "-shared", "-fPIC",
             "-O1", "-o", out / f"{name}.so", ROOT / "tests" / "native" / "shims" / f"{name}.c", "-ldl"],
            check=True, timeout=600,
        )  # fmt: skip
    gcc = out / "bin" / "gcc"
    gcc.write_text(
        "#!/bin/sh\n# stands in for gcc: copies the shim cross-built for SOURCE.c to the -o path\n"
        "out= src=\n"
        "while [ $# -gt 0 ]; do case $1 in -o) out=$2; shift ;; *.c) src=$1 ;; esac; shift; done\n"
        f'exec cp "{out}/$(basename "$src" .c).so" "$out"\n'
    )
    gcc.chmod(0o755)
    return out / "bin"


def test_aarch64_wheel_in_debian_12_under_qemu(shared: Path) -> None:
    root = debian_root("bookworm", "arm64", "openssl", "locales")  # localedef's sources (test_small_fixes)
    no_build_tools(root)
    assert "aarch64" in ok(inside(root, shared, ["uname", "-m"], 60))
    started = time.monotonic()
    install(root, shared, wheel("aarch64"), *NATIVE_TEST_DEPS, timeout=3600)
    print(f"pip install under qemu: {time.monotonic() - started:.0f}s")
    probe = "import langflow_sandbox_createos._createos as m, platform; print(platform.machine(), m.__file__, m.curl_version)"
    machine, native, _curl = ok(inside(root, shared, [f"{VENV}/bin/python", "-c", probe], 300)).split()
    assert machine == "aarch64" and native.endswith("/langflow_sandbox_createos/_createos.abi3.so"), native

    # the suite: tests/conftest.py and tests/native, copied (the checkout itself is never on
    # sys.path there: its x86_64 module must not shadow the wheel's)
    suite = shared / "suite"
    shutil.rmtree(suite, ignore_errors=True)
    (suite / "tests").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "conftest.py", suite / "tests" / "conftest.py")
    shutil.copytree(
        ROOT / "tests" / "native", suite / "tests" / "native", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(HERE / "foreign" / "remote_plane.py", suite / "remote_plane.py")
    (suite / "pytest.ini").write_text(
        "[pytest]\ntimeout = 900\naddopts = -ra -p no:cacheprovider\n"
        "markers =\n  slow: long-running\n  langflow: needs Langflow\n"
    )
    stand_in = cross_built_shims(shared)
    port_file = shared / "spawner.port"
    spawner = subprocess.Popen(
        [sys.executable, HERE / "foreign" / "plane_spawner.py", port_file, shared / "planes"],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        env = {
            "CREATEOS_PLANE_SPAWNER": f"127.0.0.1:{port_file.read_text()}",
            "PYTHONPATH": str(suite),
            "PATH": f"{stand_in}:/usr/local/bin:/usr/bin:/bin",
            # the 64-thread stress test runs 64 x 5 calls under emulation (64 x 10 natively; as
            # make sanitize; fewer would leave too few requests for its connection-reuse check)
            "STRESS_PER_THREAD": os.environ.get("STRESS_PER_THREAD", "5"),
        }
        argv = [f"{VENV}/bin/python", "-m", "pytest", "-p", "remote_plane", "--basetemp", str(shared / "tmp")]
        # --deselect takes a node id, relative to the rootdir: the suite
        argv += ["--rootdir", str(suite), "-q", str(suite / "tests" / "native")]
        argv += ["--deselect", f"tests/native/{NOT_FOR_A_STATIC_JANSSON}"]
        argv += os.environ.get("PROOF_PYTEST_ARGS", "").split()
        started = time.monotonic()
        proc = inside(root, shared, argv, 7000, env={**env})
        print(proc.stdout[-3000:], proc.stderr[-2000:])
        print(f"tests/native under qemu: {time.monotonic() - started:.0f}s")
    finally:
        spawner.terminate()
        spawner.wait(30)
    summary = proc.stdout.strip().splitlines()[-1]
    assert proc.returncode == 0, summary
    assert re.search(r"\d+ passed", summary) and "failed" not in summary, summary
    assert "1 deselected" in summary, summary  # that one test, nothing else
