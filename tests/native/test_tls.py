"""TLS against createos-local served over HTTPS with a private CA: verification is always
on, SSL_CERT_FILE / CURL_CA_BUNDLE are honoured, and connections are reused."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from langflow_sandbox_createos import _createos
from langflow_sandbox_createos.local.testing import LocalControlPlane


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


# --- HTTP/2: createos-local --http2 (hypercorn, ALPN h2) -----------------------------------


@pytest.fixture(scope="module")
def h2_plane(pki: dict[str, Path]) -> Iterator[LocalControlPlane]:
    tls = (pki["server.pem"], pki["server.key"], pki["ca.pem"])
    with LocalControlPlane(tls=tls, extra_args=["--http2"]) as plane:
        yield plane


def test_concurrent_calls_multiplex_on_one_http2_connection(
    h2_plane: LocalControlPlane, pki: dict[str, Path], no_ca_env: pytest.MonkeyPatch
) -> None:
    """8 threads x 10 calls at once: every request is HTTP/2, all on one connection."""
    no_ca_env.setenv("SSL_CERT_FILE", str(pki["ca.pem"]))
    before = h2_plane.stats()
    errors: list[BaseException] = []
    with _createos.Client(h2_plane.url, h2_plane.api_key, control_timeout=20) as client:
        start = threading.Barrier(8)

        def worker() -> None:
            try:
                start.wait()
                for i in range(10):
                    client.whoami() if i % 2 else client.list(prefix="lf-none-")
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stats = client.stats()
    after = h2_plane.stats()
    assert errors == []
    assert stats["requests"] == 80 and stats["connections_opened"] == 1, stats
    served = {v: n - before["http_versions"].get(v, 0) for v, n in after["http_versions"].items()}
    assert {v: n for v, n in served.items() if n and v != "1.1"} == {"2": 80}, after["http_versions"]


def test_streaming_exec_and_big_output_over_http2(
    h2_plane: LocalControlPlane, pki: dict[str, Path], no_ca_env: pytest.MonkeyPatch
) -> None:
    """A streamed run with 8 MiB of output (many flow-control windows) and live callbacks,
    and two runs in parallel on the same connection."""
    no_ca_env.setenv("SSL_CERT_FILE", str(pki["ca.pem"]))
    seen: list[int] = []
    with _createos.Client(h2_plane.url, h2_plane.api_key, control_timeout=20) as client:

        def run(tag: str) -> Any:
            return client.run_program(
                {"shape": "s-1vcpu-256mb", "name": f"lf-h2-{tag}"},
                "/bin/sh",
                ["-c", "head -c 8388608 /dev/zero | tr '\\0' x; echo; echo done >&2"],
                timeout=60,
                on_output=lambda stream, text: seen.append(len(text)),
            )

        results: dict[str, Any] = {}
        threads = [threading.Thread(target=lambda t=t: results.__setitem__(t, run(t))) for t in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stats = client.stats()
    for result in results.values():
        assert result.exit_code == 0 and result.stderr == "done\n"
        assert result.stdout == "x" * 8388608 + "\n"
    assert len(seen) > 2 and stats["connections_opened"] == 1, stats
    assert h2_plane.wait_until_no_live(timeout=5.0) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--http2"], "--http2 needs --tls-cert and --tls-key"),
        (["--tls-cert", "x.pem"], "--tls-cert and --tls-key go together"),
    ],
)
def test_http2_and_tls_flags_are_checked(args: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "langflow_sandbox_createos.local", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and message in done.stderr, done.stderr
