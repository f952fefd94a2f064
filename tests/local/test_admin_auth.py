"""The admin routes need the API key (a client without it gets nowhere; a guest cannot even
connect), the key has no default, and a non-loopback --host needs --allow-remote."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from cp_helpers import failure, run

from langflow_sandbox_createos.local import __main__ as cli
from langflow_sandbox_createos.local.testing import LocalControlPlane

# The same calls from a guest (egress open) and from a host process without the key: the guest
# cannot connect at all (a network of its own); the host process gets 401 for every admin call.
PROBE = r"""
import json, sys, urllib.error, urllib.request
port = sys.argv[1]
def call(method, path, body=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method=method)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except urllib.error.URLError as e:
        return type(e.reason).__name__
print(json.dumps({
    "health": call("GET", "/healthz"),
    "stats": call("GET", "/_local/stats"),
    "faults_put": call("PUT", "/_local/faults", b'{"latency_ms": 1500}'),
    "faults_delete": call("DELETE", "/_local/faults"),
    "guessed_key": call("GET", "/v1/whoami"),
}))
"""


def test_the_admin_routes_refuse_a_client_without_the_key_and_a_guest_cannot_connect(
    cp: LocalControlPlane, client: httpx.Client, sandbox_factory: Any
) -> None:
    import json

    cp.set_faults({"rules": [{"route": "fork", "status": 503}]})
    sb = sandbox_factory(egress=["*"])  # open egress: still a network of its own
    result = run(client, sb["id"], "python3", "-c", PROBE, str(cp.port))
    assert result["exit_code"] == 0, result
    refused = "ConnectionRefusedError"
    assert json.loads(result["stdout"]) == dict.fromkeys(
        ("health", "stats", "faults_put", "faults_delete", "guessed_key"), refused
    )
    host = subprocess.run(
        [sys.executable, "-c", PROBE, str(cp.port)], capture_output=True, text=True, timeout=60, check=True
    )
    # e8f911e: 200 for stats (every sandbox) and for the fault change (1.5 s on every request)
    seen = json.loads(host.stdout)
    assert seen == {"health": 200, "stats": 401, "faults_put": 401, "faults_delete": 401, "guessed_key": 401}
    faults = cp.faults()
    assert faults["latency_ms"] == 0 and faults["rules"][0]["route"] == "fork"
    assert cp.stats()["sandboxes"]  # the key still opens them


def test_admin_routes_refuse_a_wrong_key(cp: LocalControlPlane) -> None:
    with httpx.Client(base_url=cp.url, headers={"X-Api-Key": "dev-key"}) as wrong:
        assert failure(wrong.get("/_local/stats"), 401)["message"] == "invalid api key"
        assert failure(wrong.put("/_local/faults", json={"latency_ms": 5}), 401)
    assert cp.faults()["latency_ms"] == 0


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.1", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.4", False),
        ("example.com", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert cli.is_loopback(host) is loopback


def test_api_key_comes_from_the_flag_the_environment_or_is_generated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(cli.API_KEY_ENV, raising=False)
    assert cli.api_key("mine") == ("mine", False)
    key, generated = cli.api_key(None)
    assert generated and len(key) >= 32 and key != cli.api_key(None)[0]
    monkeypatch.setenv(cli.API_KEY_ENV, "from-env")
    assert cli.api_key(None) == ("from-env", False)
    with pytest.raises(ValueError):
        cli.api_key(" ")


def _server(args: list[str], tmp_path: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != cli.API_KEY_ENV}
    argv = [
        sys.executable,
        "-m",
        "langflow_sandbox_createos.local",
        "--state-dir",
        str(tmp_path / "state"),
        *args,
    ]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def test_a_non_loopback_host_needs_allow_remote(tmp_path: Path) -> None:
    proc = _server(["--host", "0.0.0.0", "--port", "0"], tmp_path)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "not a loopback address" in out and "--allow-remote" in out


def test_without_a_key_a_random_one_is_printed_and_required(tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    proc = _server(["--port", "0", "--port-file", str(port_file)], tmp_path)
    try:
        assert proc.stdout is not None
        key = None
        for line in proc.stdout:
            if line.startswith("createos-local: API key (generated for this run): "):
                key = line.rsplit(" ", 1)[1].strip()
                break
        assert key and len(key) >= 32
        while not port_file.exists():
            assert proc.poll() is None
            time.sleep(0.05)
        url = f"http://127.0.0.1:{int(port_file.read_text())}"
        with httpx.Client(base_url=url, timeout=30) as c:
            # e8f911e: --api-key defaulted to dev-key
            assert c.get("/v1/whoami", headers={"X-Api-Key": "dev-key"}).status_code == 401
            assert c.get("/v1/whoami", headers={"X-Api-Key": key}).status_code == 200
    finally:
        proc.terminate()
        proc.wait(30)
