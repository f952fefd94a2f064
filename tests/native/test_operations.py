"""Every control-plane operation of the native client against createos-local."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import pytest

from langflow_sandbox_createos import _createos
from langflow_sandbox_createos.local.testing import LocalControlPlane

from .conftest import SHAPE, route_count


def test_module_surface() -> None:
    assert _createos.__version__
    assert _createos.curl_version.count(".") >= 1
    assert _createos.jansson_version
    assert _createos.DEFAULT_MAX_OUTPUT_BYTES == 16 * 1024 * 1024
    assert issubclass(_createos.ConfigError, _createos.UnavailableError)
    assert issubclass(_createos.NotFoundError, _createos.UnavailableError)
    assert issubclass(_createos.ConflictError, _createos.UnavailableError)
    assert issubclass(_createos.UnavailableError, _createos.CreateOSError)
    assert issubclass(_createos.DeadlineError, _createos.TransientError)
    assert issubclass(_createos.TransientError, _createos.CreateOSError)
    assert issubclass(_createos.ProtocolError, _createos.CreateOSError)
    err = _createos.CreateOSError("x")
    assert (err.status, err.request_id, err.transient, err.retry_after, err.code, err.sandbox_id) == (
        None,
        None,
        False,
        None,
        None,
        None,
    )
    assert _createos.TransientError("x").transient is True


def test_identity_and_catalog(client: _createos.Client) -> None:
    me = client.whoami()
    assert isinstance(me["user_id"], str) and isinstance(me["stats"], dict)
    shapes = client.shapes()
    ids = {s["id"] for s in shapes}
    assert {"s-1vcpu-256mb", "s-2vcpu-4gb", "s-4vcpu-8gb"} <= ids
    assert all(isinstance(s["vcpu"], int) for s in shapes)
    rootfs = client.rootfs()
    assert rootfs["default"] in rootfs["rootfs"]


def test_sandbox_lifecycle(client: _createos.Client, cp: LocalControlPlane) -> None:
    view = client.create({"shape": SHAPE, "name": "native-life", "envs": {"A": "1"}}, timeout=30)
    sid = view["id"]
    try:
        assert view["status"] == "running" and view["name"] == "native-life"
        assert client.get(sid)["id"] == sid
        names = [s["name"] for s in client.list(prefix="native-li")]
        assert names == ["native-life"]
        assert client.list(prefix="no-such-prefix-") == []
        assert sid in {s["id"] for s in client.list(status="running")}
        assert client.patch(sid, {"ingress_enabled": True})["ingress_enabled"] is True
        assert client.get_egress(sid) == []
        assert client.put_egress(sid, ["10.1.2.3:443", "192.168.0.0/16"]) == [
            "10.1.2.3:443",
            "192.168.0.0/16",
        ]
        assert client.get_egress(sid) == ["10.1.2.3:443", "192.168.0.0/16"]
        assert client.put_egress(sid, None) == []
        assert client.pause(sid)["status"] in ("pausing", "paused")
        # status filters the server cannot apply are applied client-side
        assert (
            sid in {s["id"] for s in client.list(status="paused")} or client.get(sid)["status"] == "pausing"
        )
        with pytest.raises(_createos.ConflictError) as info:
            client.exec(sid, "true", timeout=5)
        assert info.value.status == 409 and "paused" in str(info.value)
        child = client.fork(sid, {"start_paused": True})
        assert child["id"] != sid
        client.delete(child["id"])
        resumed = client.resume(sid, wait=10)
        assert resumed["status"] == "running"
        assert client.exec(sid, "printenv", ["A"], timeout=10).stdout == "1\n"
    finally:
        assert client.delete(sid)["status"] in ("destroying", "destroyed")
    with pytest.raises(_createos.NotFoundError):
        client.get("sb-does-not-exist")


def test_resume_without_wait_returns_first_answer(client: _createos.Client, sandbox: dict) -> None:
    client.pause(sandbox["id"])
    view = client.resume(sandbox["id"])
    assert view["id"] == sandbox["id"] and view["status"] in ("resuming", "running")


def test_sandbox_id_is_one_escaped_path_segment(client: _createos.Client, cp: LocalControlPlane) -> None:
    before = route_count(cp, "list")
    for hostile in ("..", "../sandboxes", "a/b", "x?y=1", "sb-1#frag"):
        with pytest.raises(_createos.NotFoundError):
            client.get(hostile)
    assert route_count(cp, "list") == before  # never turned into another route
    with pytest.raises(ValueError):
        client.get("")
    with pytest.raises(ValueError):
        client.get("a\x00b")


def test_files_roundtrip(client: _createos.Client, sandbox: dict, tmp_path: Path) -> None:
    sid = sandbox["id"]
    payload = bytes(range(256)) * 1000
    client.upload(sid, "/workspace/dir with space/ä+&=.bin", payload)
    assert client.download(sid, "/workspace/dir with space/ä+&=.bin", max_bytes=len(payload)) == payload
    big = tmp_path / "big.bin"
    big.write_bytes(b"z" * (3 * 1024 * 1024 + 7))
    client.upload(sid, "/workspace/big.bin", file=big)
    assert client.download(sid, "/workspace/big.bin", max_bytes=4 << 20) == big.read_bytes()
    client.upload(sid, "/workspace/empty", b"")
    assert client.download(sid, "/workspace/empty", max_bytes=0) == b""
    with pytest.raises(_createos.NotFoundError):
        client.download(sid, "/workspace/missing", max_bytes=10)
    with pytest.raises(FileNotFoundError):
        client.upload(sid, "/workspace/x", file=tmp_path / "nope")
    with pytest.raises(IsADirectoryError):
        client.upload(sid, "/workspace/x", file=tmp_path)
    with pytest.raises(TypeError):
        client.upload(sid, "/workspace/x")
    with pytest.raises(_createos.UnavailableError) as info:
        client.upload(sid, "relative/path", b"x")
    assert info.value.status == 400


def test_download_cap_declared_length(client: _createos.Client, sandbox: dict, cp: LocalControlPlane) -> None:
    sid = sandbox["id"]
    client.upload(sid, "/workspace/ten-mib", b"a" * (10 << 20))
    before = client.stats()["bytes_received"]
    with pytest.raises(_createos.UnavailableError) as info:
        client.download(sid, "/workspace/ten-mib", max_bytes=1 << 20)
    assert info.value.code == "too_large" and "Content-Length" in str(info.value)
    # refused on the header: at most one network read of the body, far below the file
    assert client.stats()["bytes_received"] - before < (1 << 20)


def test_exec_buffered_and_streamed(client: _createos.Client, sandbox: dict) -> None:
    sid = sandbox["id"]
    for stream in (True, False):
        r = client.exec(
            sid,
            "bash",
            ["-c", 'echo out; echo err >&2; read x; echo "got $x"; exit 4'],
            stdin="hello\n",
            timeout=20,
            stream=stream,
        )
        assert isinstance(r, _createos.ExecResult)
        assert (r.stdout, r.stderr, r.exit_code, r.streamed) == ("out\ngot hello\n", "err\n", 4, stream)
        assert r.error is None and r.timed_out is False and not r.stdout_truncated
    r = client.exec(sid, "python3", ["-c", "print('\\u00e9\\u4e2d\\U0001f600')"], timeout=20)
    assert r.stdout == "\u00e9\u4e2d\U0001f600\n"
    r = client.exec(sid, "/definitely/not/a/program", timeout=20)
    assert r.error  # the service's start error is surfaced, never dropped


def test_exec_stream_404_falls_back_to_buffered(
    client: _createos.Client, sandbox: dict, cp: LocalControlPlane
) -> None:
    cp.set_faults({"streaming": False})
    seen: list[tuple[str, str]] = []
    r = client.exec(
        sandbox["id"], "echo", ["fallback"], timeout=20, on_output=lambda s, t: seen.append((s, t))
    )
    assert r.stdout == "fallback\n" and r.streamed is False
    assert seen == [("stdout", "fallback\n")]
    assert client.stats()["fallbacks"] == 1


def test_many_threads_share_one_client(client: _createos.Client, cp: LocalControlPlane) -> None:
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda _: client.whoami()["user_id"], range(200)))
    assert len(set(results)) == 1
    stats = client.stats()
    assert stats["requests"] >= 200
    assert stats["connections_opened"] <= 20


def test_pagination_reads_every_page(client: _createos.Client, cp: LocalControlPlane) -> None:
    """The list has more rows than one page (500): every row comes back exactly once."""
    rows = len(cp.sandboxes())
    need = max(0, 520 - rows)

    def churn(i: int) -> None:
        view = client.create({"shape": SHAPE, "name": f"pg-{i}"})
        client.delete(view["id"])

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(churn, range(need)))
    before = route_count(cp, "list")
    listed = client.list()
    assert route_count(cp, "list") - before >= 2
    assert len(listed) == len({s["id"] for s in listed}) == len(cp.sandboxes())
    assert len(client.list(prefix="pg-")) >= min(need, 1)


def test_repr_close_and_context_manager(cp: LocalControlPlane) -> None:
    with _createos.Client(cp.url + "/", cp.api_key) as c:
        assert c.base_url == cp.url
        assert cp.api_key not in repr(c) and cp.url in repr(c)
        c.whoami()
    with pytest.raises(_createos.UnavailableError, match="closed"):
        c.whoami()
    c.close()  # idempotent


def test_exec_result_is_constructible_and_immutable() -> None:
    r = _createos.ExecResult(stdout="a", exit_code=3, streamed=True, sandbox_id="sb-1")
    assert (r.stdout, r.stderr, r.exit_code, r.error, r.streamed, r.sandbox_id, r.timed_out) == (
        "a",
        "",
        3,
        None,
        True,
        "sb-1",
        False,
    )
    with pytest.raises(AttributeError):
        r.stdout = "b"  # type: ignore[misc]
    assert "exit_code=3" in repr(r)
