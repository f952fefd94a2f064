"""The API key at the edges: never through a proxy in clear, redacted at every accepted length,
wiped with the configuration."""

from __future__ import annotations

import pytest

from langflow_sandbox_createos import _createos
from langflow_sandbox_createos.local.testing import LocalControlPlane

from .rawserver import RawServer

E = _createos

PROXY_VARS = ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY", "https_proxy", "HTTPS_PROXY")


def test_plain_http_never_goes_through_a_proxy(
    cp: LocalControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = RawServer()  # a proxy: counts connections, keeps what it receives
    try:
        for var in PROXY_VARS:
            monkeypatch.setenv(var, proxy.url)
        for var in ("no_proxy", "NO_PROXY"):
            monkeypatch.delenv(var, raising=False)
        assert cp.url.startswith("http://127.0.0.1")
        with E.Client(cp.url, cp.api_key, control_timeout=5) as c:
            assert c.whoami()  # straight to the loopback control plane
            c.shapes()
    finally:
        proxy.close()
    assert proxy.connections == 0 and cp.api_key.encode() not in proxy.received


@pytest.mark.parametrize("length", [8, 512])
def test_reflected_key_is_redacted_at_every_accepted_length(length: int) -> None:
    # '/' and '"'-free printable ASCII, with characters JSON escapes ('/' as \/) mixed in
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/+-_"
    key = "".join(alphabet[(i * 7 + 3) % len(alphabet)] for i in range(length))
    with LocalControlPlane(api_key=key) as plane:
        c = E.Client(plane.url, key)
        plane.set_faults({"rules": [{"route": "whoami", "body": "reflect-headers"}]})
        with pytest.raises(E.CreateOSError) as info:
            c.whoami()
        c.close()
    err = info.value
    text = " ".join([str(err), repr(err), repr(err.args), str(err.request_id), str(err.code)])
    assert "[redacted]" in str(err) and "x-api-key" in str(err).lower()
    for start in range(0, length - 8 + 1, 4):  # no run of 8 characters of the key survives
        assert key[start : start + 8] not in text, start


def test_key_longer_than_the_limit_is_refused_without_quoting_it(cp: LocalControlPlane) -> None:
    key = "k" * 513
    with pytest.raises(E.ConfigError, match="longer than 512") as info:
        E.Client(cp.url, key)
    assert "kkkkkkkk" not in str(info.value)
