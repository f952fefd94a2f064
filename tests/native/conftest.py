"""Fixtures for the native client's tests: a Client on the real createos-local (tests/conftest.py),
and a throwaway PKI for the tests that serve it over TLS."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from langflow_sandbox_createos import _createos
from langflow_sandbox_createos.local.testing import LocalControlPlane

from .rawserver import RawServer

SHAPE = "s-1vcpu-256mb"


@pytest.fixture
def client(cp: LocalControlPlane) -> Iterator[_createos.Client]:
    c = _createos.Client(cp.url, cp.api_key, connect_timeout=5.0, control_timeout=20.0)
    yield c
    c.close()


@pytest.fixture
def server() -> Iterator[RawServer]:
    """A scripted control plane on loopback (rawserver.py): set its `response`."""
    s = RawServer()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def sandbox(client: _createos.Client) -> Iterator[dict[str, Any]]:
    """A running guest, deleted afterwards."""
    view = client.create({"shape": SHAPE})
    yield view
    with contextlib.suppress(_createos.NotFoundError):
        client.delete(view["id"])


def route_count(cp: LocalControlPlane, route: str) -> int:
    return int(cp.stats()["requests"].get(route, 0))


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A throwaway CA, a server certificate for localhost signed by it, and an unrelated CA
    (self-signed, with its key: a certificate nothing trusts)."""
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
             "-keyout", "ca.key", "-out", "ca.pem", cwd=d)  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
             "-keyout", "server.key", "-out", "server.csr", cwd=d)  # fmt: skip
    (d / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "2", "-extfile", "san.ext", "-out", "server.pem", cwd=d)  # fmt: skip
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=other-ca",
             "-keyout", "other.key", "-out", "other.pem", cwd=d)  # fmt: skip
    return {name: d / f"{name}" for name in ("ca.pem", "server.pem", "server.key", "other.pem", "other.key")}


SHIMS = Path(__file__).parent / "shims"


def build_shim(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """Compile tests/native/shims/<name>.c into an LD_PRELOAD library (gcc)."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.fail(f"gcc is required to build the {name} shim (scripts/install-system-deps.sh)")
    out = tmp_path_factory.mktemp("shim") / f"{name}.so"
    subprocess.run(
        [gcc, "-shared", "-fPIC", "-O1", "-o", str(out), str(SHIMS / f"{name}.c"), "-ldl"], check=True
    )
    return out


def preloading(shim: Path, **extra: str) -> dict[str, str]:
    """This process's environment with `shim` preloaded, after the sanitizer runtimes of
    `make sanitize`, which must come first."""
    env = dict(os.environ, **extra)
    env["LD_PRELOAD"] = f"{env.get('LD_PRELOAD', '')} {shim}".strip()
    return env
