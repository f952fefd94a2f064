"""HTTPS through an HTTP proxy (CONNECT): the proxy's own "200 Connection established" is not the
control plane's answer. createos-local serves HTTPS with a throwaway CA; a CONNECT proxy on
loopback (connectproxy.py) tunnels to it; the client finds the proxy in https_proxy. An HTTPS
proxy (TLS to the proxy itself) is verified against the same CA bundle as the control plane."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from langflow_sandbox_createos import _createos as E
from langflow_sandbox_createos.local.testing import LocalControlPlane

from .conftest import SHAPE
from .connectproxy import ConnectProxy


@pytest.fixture(scope="module")
def tls_plane(pki: dict[str, Path]) -> Iterator[LocalControlPlane]:
    with LocalControlPlane(tls=(pki["server.pem"], pki["server.key"], pki["ca.pem"])) as plane:
        yield plane


PROXY_VARIABLES = ("no_proxy", "NO_PROXY", "all_proxy", "ALL_PROXY", "HTTPS_PROXY", "https_proxy")


@pytest.fixture
def proxied(
    tls_plane: LocalControlPlane, pki: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[E.Client, str, ConnectProxy]]:
    """A running guest, and a fresh client whose traffic goes through the CONNECT proxy: its
    first request opens the tunnel (a reused tunnel would not show the CONNECT reply)."""
    for var in (*PROXY_VARIABLES, "CURL_CA_BUNDLE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SSL_CERT_FILE", str(pki["ca.pem"]))
    tls_plane.clear_faults()
    direct = E.Client(tls_plane.url, tls_plane.api_key, connect_timeout=5, control_timeout=10)
    sid = direct.create({"shape": SHAPE})["id"]
    proxy = ConnectProxy()
    monkeypatch.setenv("https_proxy", proxy.url)  # read by libcurl at each new connection
    client = E.Client(tls_plane.url, tls_plane.api_key, connect_timeout=5, control_timeout=10)
    try:
        yield client, sid, proxy
    finally:
        client.close()
        proxy.close()
        monkeypatch.delenv("https_proxy")
        tls_plane.clear_faults()
        with contextlib.suppress(E.CreateOSError):
            direct.delete(sid)
        direct.close()


def set_faults(plane: LocalControlPlane, faults: dict[str, Any]) -> None:
    """The test's admin call goes direct (urllib would honour https_proxy too)."""
    proxy = os.environ.pop("https_proxy")
    try:
        plane.set_faults(faults)
    finally:
        os.environ["https_proxy"] = proxy


def test_a_silent_control_plane_behind_a_connect_proxy_is_a_deadline(
    proxied: tuple[E.Client, str, ConnectProxy], tls_plane: LocalControlPlane
) -> None:
    """The proxy answers CONNECT at once; the control plane never answers the exec. No stream
    ever started: DeadlineError, not ExecResult(timed_out=True, exit_code=-1)."""
    client, sid, proxy = proxied
    set_faults(tls_plane, {"rules": [{"route": "exec_stream", "hang": True}]})
    with pytest.raises(E.DeadlineError):
        client.exec(sid, "echo", ["never"], timeout=2)
    assert proxy.tunnels and all(t.startswith("localhost:") for t in proxy.tunnels), proxy.tunnels


def test_a_control_plane_without_streaming_behind_a_connect_proxy_falls_back(
    proxied: tuple[E.Client, str, ConnectProxy], tls_plane: LocalControlPlane
) -> None:
    """404 on the streaming endpoint after the proxy's 200: buffered exec, not NotFoundError."""
    client, sid, proxy = proxied
    set_faults(tls_plane, {"streaming": False})
    r = client.exec(sid, "echo", ["buffered"], timeout=20)
    assert (r.stdout, r.exit_code, r.streamed) == ("buffered\n", 0, False)
    assert client.stats()["fallbacks"] == 1
    assert proxy.tunnels


@pytest.fixture
def https_proxy_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for var in (*PROXY_VARIABLES, "SSL_CERT_FILE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


@pytest.mark.parametrize("variable", ["SSL_CERT_FILE", "CURL_CA_BUNDLE"])
def test_an_https_proxy_is_verified_against_the_clients_ca_bundle(
    tls_plane: LocalControlPlane,
    pki: dict[str, Path],
    https_proxy_env: pytest.MonkeyPatch,
    variable: str,
) -> None:
    """An HTTPS proxy whose certificate the test CA signed, that CA named by SSL_CERT_FILE (or
    CURL_CA_BUNDLE): the client trusts the proxy as it trusts the control plane. Fails on
    ac8509d: CURLOPT_PROXY_CAINFO was never set, so the proxy was checked against libcurl's
    compiled-in bundle (the system's), which lacks the test CA: UnavailableError. The
    self-contained wheel's CA probe goes the same way (the bundle it finds is ca_file too)."""
    https_proxy_env.setenv(variable, str(pki["ca.pem"]))
    proxy = ConnectProxy(tls=(pki["server.pem"], pki["server.key"]))
    https_proxy_env.setenv("https_proxy", proxy.url)
    try:
        with E.Client(tls_plane.url, tls_plane.api_key, connect_timeout=5, control_timeout=10) as client:
            assert "user_id" in client.whoami()
        assert proxy.handshakes >= 1 and proxy.tunnels, (proxy.handshakes, proxy.tunnels)
    finally:
        proxy.close()


def test_an_https_proxy_nothing_trusts_is_refused(
    tls_plane: LocalControlPlane, pki: dict[str, Path], https_proxy_env: pytest.MonkeyPatch
) -> None:
    """The same with a self-signed proxy certificate outside the bundle: refused before any
    CONNECT, as an UnavailableError (verification stays on for proxies too)."""
    https_proxy_env.setenv("SSL_CERT_FILE", str(pki["ca.pem"]))
    proxy = ConnectProxy(tls=(pki["other.pem"], pki["other.key"]))
    https_proxy_env.setenv("https_proxy", proxy.url)
    try:
        with (
            E.Client(tls_plane.url, tls_plane.api_key, connect_timeout=5, control_timeout=10) as client,
            pytest.raises(E.UnavailableError),
        ):
            client.whoami()
        assert proxy.tunnels == []
    finally:
        proxy.close()
