"""Exec, buffered and streaming: output, stdin, env rules, start errors, heartbeats, disconnects."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from cp_helpers import SandboxFactory, data, failure, make_client, run, sandbox_factory_for, sh

from langflow_sandbox_createos.local.testing import LocalControlPlane


def frames(response: httpx.Response) -> Iterator[dict[str, Any]]:
    for line in response.iter_lines():
        if line:
            yield json.loads(line)


def stream_exec(c: httpx.Client, sandbox_id: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with c.stream("POST", f"/v1/sandboxes/{sandbox_id}/exec?stream=true", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("application/x-ndjson")
        assert r.headers["x-request-id"]
        return list(frames(r))


def test_buffered_exec_result(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    response = client.post(
        f"/v1/sandboxes/{sandbox['id']}/exec",
        json={"cmd": "sh", "args": ["-c", "echo out; echo err >&2; exit 4"]},
    )
    body = data(response)
    assert body["result"] == {"stdout": "out\n", "stderr": "err\n", "exit_code": 4}
    assert isinstance(body["exec_ms"], float)


def test_args_are_not_shell_parsed(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    assert run(client, sandbox["id"], "echo", "a b", "$HOME", ";")["stdout"] == "a b $HOME ;\n"


def test_stdin_is_honoured(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    assert run(client, sandbox["id"], "cat", stdin="line1\nline2")["stdout"] == "line1\nline2"
    assert run(client, sandbox["id"], "wc", "-c", stdin="x" * 300_000)["stdout"].strip() == "300000"


def test_missing_binary_is_an_agent_error_with_exit_zero(
    client: httpx.Client, sandbox: dict[str, Any]
) -> None:
    result = run(client, sandbox["id"], "no-such-binary-here")
    assert result["exit_code"] == 0 and "no-such-binary-here" in result["error"]
    result = run(client, sandbox["id"], "/workspace/missing.sh")
    assert result["exit_code"] == 0 and result["error"]
    streamed = stream_exec(client, sandbox["id"], {"cmd": "no-such-binary-here"})
    assert "error" in streamed[0] and streamed[-1] == {"exit_code": 0}


def test_env_declared_at_create_reaches_every_exec(
    client: httpx.Client, sandbox_factory: SandboxFactory
) -> None:
    sb = sandbox_factory(envs={"GREETING": "hello", "OTHER": "x"})
    sid = sb["id"]
    assert sh(client, sid, "echo $GREETING")["stdout"] == "hello\n"
    assert sh(client, sid, "echo $GREETING", env={"GREETING": "override"})["stdout"] == "override\n"
    refused = client.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "true", "env": {"NEW_KEY": "v"}})
    assert "NEW_KEY" in failure(refused, 400)["message"]


def test_guest_environment_is_clean(
    client: httpx.Client, cp: LocalControlPlane, sandbox: dict[str, Any]
) -> None:
    env = sh(client, sandbox["id"], "env")["stdout"]
    assert cp.api_key not in env
    assert "PYTHONPATH" not in env and "PYTEST" not in env
    assert f"CREATEOS_SANDBOX_ID={sandbox['id']}" in env
    assert "HOME=/root" in env and "PWD=/workspace" in env


def test_devbox_is_a_plain_image_and_the_template_has_lfx(
    client: httpx.Client, sandbox_factory: SandboxFactory
) -> None:
    from importlib.metadata import version

    from langflow_sandbox_createos.local.images import TEMPLATE_ID, TEMPLATE_NAME

    probe = "import sys\ntry:\n import lfx; from importlib.metadata import version; print(version('lfx'))\n"
    probe += "except ImportError: print('no-lfx')\nprint(sys.executable)"
    plain = sandbox_factory()
    out = run(client, plain["id"], "python3", "-c", probe)["stdout"].split()
    assert out == ["no-lfx", "/usr/bin/python3"], out
    templates = data(client.get("/v1/templates"))["data"]
    assert {"id": TEMPLATE_ID, "name": TEMPLATE_NAME, "base": "devbox:1", "status": "ready"} in templates
    for rootfs in (TEMPLATE_NAME, TEMPLATE_ID):  # a template is named by its name or its id
        template = sandbox_factory(rootfs=rootfs)
        out = run(client, template["id"], "python3", "-c", probe)["stdout"].split()
        assert out == [version("lfx"), "/opt/lfx/bin/python3"], out


def test_guest_tools_available(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    script = "mkdir -p d && echo hi > d/f && tar -czf /tmp/x.tgz -C d . && tar -tzf /tmp/x.tgz"
    script += " && timeout 1 true && gzip --version >/dev/null"
    result = sh(client, sandbox["id"], script)
    assert result["exit_code"] == 0 and "./f" in result["stdout"]


def test_non_utf8_output_is_replaced(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    assert sh(client, sandbox["id"], "printf 'a\\377b'")["stdout"] == "a\ufffdb"
    streamed = stream_exec(client, sandbox["id"], {"cmd": "sh", "args": ["-c", "printf 'a\\377b'"]})
    assert "".join(f.get("stdout", "") for f in streamed) == "a\ufffdb"


def test_streaming_frames_arrive_while_the_guest_runs(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    body = {"cmd": "sh", "args": ["-c", "echo a; sleep 2; echo b >&2; exit 5"], "stream": True}
    started = time.monotonic()
    seen: list[tuple[float, dict[str, Any]]] = []
    with client.stream("POST", f"/v1/sandboxes/{sandbox['id']}/exec?stream=true", json=body) as response:
        for frame in frames(response):
            seen.append((time.monotonic() - started, frame))
    first_at, first = seen[0]
    assert first == {"stdout": "a\n"} and first_at < 1.5
    assert [f for _, f in seen if "hb" not in f] == [{"stdout": "a\n"}, {"stderr": "b\n"}, {"exit_code": 5}]
    assert seen[-1][0] >= 2


def test_body_flag_alone_streams(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    response = client.post(
        f"/v1/sandboxes/{sandbox['id']}/exec", json={"cmd": "echo", "args": ["x"], "stream": True}
    )
    assert response.headers["content-type"].startswith("application/x-ndjson")
    assert [json.loads(line) for line in response.text.splitlines()] == [{"stdout": "x\n"}, {"exit_code": 0}]


def test_streaming_can_be_turned_off_at_runtime(
    client: httpx.Client, cp: LocalControlPlane, sandbox: dict[str, Any]
) -> None:
    cp.set_faults({"streaming": False})
    response = client.post(
        f"/v1/sandboxes/{sandbox['id']}/exec?stream=true", json={"cmd": "true", "stream": True}
    )
    failure(response, 404)
    assert run(client, sandbox["id"], "true")["exit_code"] == 0  # buffered still works


def _guest_running(plane: LocalControlPlane, marker: str) -> bool:
    import os

    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if marker.encode() in f.read() and b"bwrap" not in f.read():
                        return True
            except OSError:
                continue
    return False


def _wait(predicate: Any, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_client_disconnect_kills_the_streaming_command(
    cp: LocalControlPlane, sandbox: dict[str, Any]
) -> None:
    marker = "4242.125"
    with (
        make_client(cp) as c,
        c.stream(
            "POST",
            f"/v1/sandboxes/{sandbox['id']}/exec?stream=true",
            json={"cmd": "sleep", "args": [marker], "stream": True},
        ),
    ):
        assert _wait(lambda: _guest_running(cp, marker))
    assert _wait(lambda: not _guest_running(cp, marker))
    assert _wait(lambda: cp.stats()["guest_processes"] == 0)


def test_client_disconnect_kills_the_buffered_command(cp: LocalControlPlane, sandbox: dict[str, Any]) -> None:
    marker = "4243.125"
    with make_client(cp, timeout=1.0) as c, pytest.raises(httpx.ReadTimeout):
        c.post(f"/v1/sandboxes/{sandbox['id']}/exec", json={"cmd": "sleep", "args": [marker]})
    assert _wait(lambda: not _guest_running(cp, marker))


def test_memory_limit_of_the_shape_is_enforced(
    client: httpx.Client, cp: LocalControlPlane, sandbox: dict[str, Any]
) -> None:
    if cp.stats()["memory_enforced"] != "cgroup":
        pytest.skip("memory is enforced by cgroups only on this machine")
    result = run(
        client, sandbox["id"], "python3", "-c", "b = bytearray(600 * 1024 * 1024); print('survived')"
    )
    assert result["exit_code"] != 0 and "survived" not in result["stdout"]


def test_buffered_output_is_capped(tmp_path: Any) -> None:
    with (
        LocalControlPlane(extra_args=["--max-exec-output-bytes", "1048576"]) as plane,
        make_client(plane) as c,
    ):
        for make in sandbox_factory_for(c):
            sb = make()
            result = sh(c, sb["id"], "head -c 3000000 /dev/zero | tr '\\0' a; echo err >&2")
            assert result["stdout"] == "a" * 1048576
            assert result["stderr"].startswith("err\n") and "stdout truncated" in result["stderr"]
            assert result["exit_code"] == 0


# -- heartbeats and big outputs ----------------------------------------------------------
@pytest.fixture(scope="module")
def hb_plane() -> Iterator[LocalControlPlane]:
    with LocalControlPlane(heartbeat_seconds=0.3) as plane:
        yield plane


def test_heartbeats_while_silent(hb_plane: LocalControlPlane) -> None:
    with make_client(hb_plane) as c:
        for make in sandbox_factory_for(c):
            sb = make()
            streamed = stream_exec(c, sb["id"], {"cmd": "sh", "args": ["-c", "sleep 1.2; echo done"]})
    assert sum(1 for f in streamed if f == {"hb": True}) >= 2
    assert streamed[-2:] == [{"stdout": "done\n"}, {"exit_code": 0}]


def _hwm_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM")


def _raw_stream(url: str, path: str, api_key: str, body: dict[str, Any]) -> tuple[int, bytes]:
    """POST over a bare socket and count 'z' bytes as they arrive: the client must not be the
    bottleneck of a 1 GiB stream (chunk-size lines are hex, so they never contain a 'z')."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nX-Api-Key: {api_key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    ).encode()
    count = 0
    tail = b""
    buffer = bytearray(1 << 20)
    with socket.create_connection((parts.hostname, parts.port), timeout=120) as sock:
        sock.sendall(head + payload)
        while n := sock.recv_into(buffer):
            view = bytes(buffer[:n])
            count += view.count(b"z")
            tail = (tail + view)[-128:]
    return count, tail


@pytest.mark.slow  # ~20-45 s on a busy 2-core machine
def test_one_gib_is_streamed_with_flat_server_memory(hb_plane: LocalControlPlane) -> None:
    assert hb_plane.pid is not None
    with make_client(hb_plane, timeout=120) as c:
        for make in sandbox_factory_for(c):
            sb = make()
            stream_exec(c, sb["id"], {"cmd": "head", "args": ["-c", "1000000", "/dev/zero"]})  # warm up
            before = _hwm_kib(hb_plane.pid)
            script = "head -c 1073741824 /dev/zero | tr '\\0' z"
            body = {"cmd": "sh", "args": ["-c", script], "stream": True}
            path = f"/v1/sandboxes/{sb['id']}/exec?stream=true"
            total, tail = _raw_stream(hb_plane.url, path, hb_plane.api_key, body)
            growth_mib = (_hwm_kib(hb_plane.pid) - before) / 1024
    assert b'{"exit_code":0}\n' in tail
    assert total == 1024**3
    assert growth_mib < 64, f"server peak RSS grew by {growth_mib:.0f} MiB"
