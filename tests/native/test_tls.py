"""TLS against createos-local served over HTTPS with a private CA: verification is always
on, SSL_CERT_FILE / CURL_CA_BUNDLE are honoured, and connections are reused."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from langflow_sandbox_createos import _createos
from langflow_sandbox_createos.local.testing import LocalControlPlane


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A throwaway CA, a server certificate for localhost signed by it, and an unrelated CA."""
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
    return {name: d / f"{name}" for name in ("ca.pem", "server.pem", "server.key", "other.pem")}


@pytest.fixture(scope="module")
def tls_plane(pki: dict[str, Path]) -> Iterator[LocalControlPlane]:
    with LocalControlPlane(tls=(pki["server.pem"], pki["server.key"], pki["ca.pem"])) as plane:
        yield plane


@pytest.fixture
def no_ca_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    return monkeypatch


def test_untrusted_certificate_is_refused(
    tls_plane: LocalControlPlane, no_ca_env: pytest.MonkeyPatch
) -> None:
    assert tls_plane.url.startswith("https://localhost:")
    with (
        _createos.Client(tls_plane.url, tls_plane.api_key, control_timeout=10) as client,
        pytest.raises(_createos.UnavailableError) as info,
    ):
        client.whoami()
    assert info.value.transient is False  # a bad certificate is not worth retrying
    message = str(info.value).lower()
    assert "certificate" in message or "ssl" in message or "tls" in message, message
    assert tls_plane.api_key not in str(info.value)
    # the request never reached the application: the handshake failed first
    assert tls_plane.stats()["requests"].get("whoami", 0) == 0


def test_wrong_ca_is_refused(tls_plane: LocalControlPlane, pki: dict[str, Path], no_ca_env) -> None:
    no_ca_env.setenv("SSL_CERT_FILE", str(pki["other.pem"]))
    with (
        _createos.Client(tls_plane.url, tls_plane.api_key, control_timeout=10) as client,
        pytest.raises(_createos.UnavailableError),
    ):
        client.whoami()


@pytest.mark.parametrize("variable", ["SSL_CERT_FILE", "CURL_CA_BUNDLE"])
def test_ca_bundle_variables_are_honoured(
    tls_plane: LocalControlPlane, pki: dict[str, Path], no_ca_env: pytest.MonkeyPatch, variable: str
) -> None:
    no_ca_env.setenv(variable, str(pki["ca.pem"]))
    with _createos.Client(tls_plane.url, tls_plane.api_key, control_timeout=10) as client:
        assert "user_id" in client.whoami()


def test_connections_are_reused_over_tls(
    tls_plane: LocalControlPlane, pki: dict[str, Path], no_ca_env: pytest.MonkeyPatch
) -> None:
    no_ca_env.setenv("SSL_CERT_FILE", str(pki["ca.pem"]))
    with _createos.Client(tls_plane.url, tls_plane.api_key, control_timeout=10) as client:
        for _ in range(20):
            client.whoami()
        stats = client.stats()
    assert stats["requests"] >= 20
    assert stats["connections_opened"] == 1, stats


def test_full_execution_over_tls(tls_plane: LocalControlPlane, pki: dict[str, Path], no_ca_env) -> None:
    no_ca_env.setenv("SSL_CERT_FILE", str(pki["ca.pem"]))
    with _createos.Client(tls_plane.url, tls_plane.api_key, control_timeout=20) as client:
        result = client.run_program(
            {"shape": "s-1vcpu-256mb", "name": "lf-tls-run"},
            "/bin/sh",
            ["-c", "echo over tls; echo err >&2"],
            timeout=30,
        )
    assert (result.stdout, result.stderr, result.exit_code) == ("over tls\n", "err\n", 0)
    assert tls_plane.wait_until_no_live(timeout=5.0) == []
