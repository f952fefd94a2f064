"""The API key at the edges: never through a proxy in clear, redacted at every accepted length,
wiped with the configuration."""

from __future__ import annotations

import contextlib
import socket
import threading

import pytest

from langflow_sandbox_createos import _createos
from langflow_sandbox_createos.local.testing import LocalControlPlane

E = _createos

PROXY_VARS = ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY", "https_proxy", "HTTPS_PROXY")


class ListeningProxy:
    """A socket that counts connections and keeps every byte it receives."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.received = b""
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            with conn:
                conn.settimeout(1.0)
                with contextlib.suppress(OSError):
                    self.received += conn.recv(65536)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


def test_plain_http_never_goes_through_a_proxy(
    cp: LocalControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = ListeningProxy()
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
