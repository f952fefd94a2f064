"""The files API: raw uploads and downloads, path rules, limits and symlink containment."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import httpx
from cp_helpers import data, failure, make_client, sandbox_factory_for, sh

from langflow_sandbox_createos.local.testing import LocalControlPlane


def files_url(sandbox: dict[str, Any]) -> str:
    return f"/v1/sandboxes/{sandbox['id']}/files"


def test_upload_then_download_round_trip(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    payload = bytes(range(256)) * 1000
    path = "/workspace/deep/new/dir/blob.bin"
    put = client.put(
        files_url(sandbox),
        params={"path": path},
        content=payload,
        headers={"Content-Type": "application/octet-stream"},
    )
    data(put)
    got = client.get(files_url(sandbox), params={"path": path})
    assert got.status_code == 200
    assert got.content == payload
    assert got.headers["content-length"] == str(len(payload))
    assert got.headers["x-request-id"]
    # the guest sees the same bytes, and an overwrite replaces them
    assert sh(client, sandbox["id"], f"wc -c < {path}")["stdout"].strip() == "256000"
    data(client.put(files_url(sandbox), params={"path": path}, content=b"short"))
    assert client.get(files_url(sandbox), params={"path": path}).content == b"short"


def test_tmp_is_served_and_guest_written_files_download(
    client: httpx.Client, sandbox: dict[str, Any]
) -> None:
    sh(client, sandbox["id"], "mkdir -p src && echo hi > src/a && tar -czf /tmp/o.tgz -C src .")
    got = client.get(files_url(sandbox), params={"path": "/tmp/o.tgz"})
    assert got.status_code == 200 and got.content[:2] == b"\x1f\x8b"
    data(client.put(files_url(sandbox), params={"path": "/tmp/in.txt"}, content=b"to-guest"))
    assert sh(client, sandbox["id"], "cat /tmp/in.txt")["stdout"] == "to-guest"


def test_path_rules(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    url = files_url(sandbox)
    assert "path" in failure(client.put(url, params={"path": "relative/x"}, content=b"x"), 400)
    assert "path" in failure(client.get(url, params={"path": "relative/x"}), 400)
    assert failure(client.put(url, content=b"x"), 400)  # no path at all
    assert failure(client.put(url, params={"path": "/workspace"}, content=b"x"), 400)
    assert failure(client.put(url, params={"path": "/"}, content=b"x"), 400)
    assert failure(client.get(url, params={"path": "/workspace/missing.txt"}), 404)
    assert failure(client.get(url, params={"path": "/workspace"}), 400)  # not a regular file
    assert failure(client.get("/v1/sandboxes/sb-missing/files", params={"path": "/workspace/x"}), 404)
    # '..' stops at the guest's root, as it does for the guest
    data(client.put(url, params={"path": "/workspace/../../../../etc/evil"}, content=b"x"))
    assert sh(client, sandbox["id"], "cat /etc/evil")["stdout"] == "x"
    assert not os.path.exists("/etc/evil")


def test_any_absolute_path_a_guest_could_write(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    url = files_url(sandbox)
    for path in ("/root/seed.txt", "/etc/app.conf", "/usr/local/bin/tool", "/opt/a/b/c.txt", "/home/x/y"):
        data(client.put(url, params={"path": path}, content=path.encode()))
        assert client.get(url, params={"path": path}).content == path.encode()
    # uploads belong to the guest's root, who can change them in place
    out = sh(
        client, sandbox["id"], "stat -c %u /opt/a/b/c.txt /opt/a; echo more >> /opt/a/b/c.txt && echo ok"
    )
    assert out["stdout"].split() == ["0", "0", "ok"], out
    assert not os.path.exists("/opt/a/b/c.txt")


def test_symlinks_resolve_inside_the_guest_root(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    sid = sandbox["id"]
    sh(client, sid, "ln -s /etc /workspace/etc-link; ln -s /etc/hostname /workspace/host-file")
    sh(client, sid, "ln -s ../../../../../../etc/passwd /workspace/climb")
    data(client.put(files_url(sandbox), params={"path": "/workspace/etc-link/pwned"}, content=b"x"))
    assert not os.path.exists("/etc/pwned")
    assert sh(client, sid, "cat /etc/pwned")["stdout"] == "x"
    with open("/etc/hostname", "rb") as host_hostname:
        host_bytes = host_hostname.read()
    guest = client.get(files_url(sandbox), params={"path": "/workspace/host-file"})
    assert guest.status_code == 200 and guest.content == b"sandbox\n" != host_bytes
    passwd = client.get(files_url(sandbox), params={"path": "/workspace/climb"}).content
    assert passwd == sh(client, sid, "cat /etc/passwd")["stdout"].encode()
    with open("/etc/passwd", "rb") as host_passwd:
        assert passwd != host_passwd.read()


def test_upload_cap_is_enforced() -> None:
    with LocalControlPlane(extra_args=["--max-file-bytes", "1048576"]) as plane, make_client(plane) as c:
        for make in sandbox_factory_for(c):
            sb = make()
            url = files_url(sb)
            data(c.put(url, params={"path": "/workspace/ok"}, content=b"x" * 1048576))

            def chunks() -> Iterator[bytes]:
                for _ in range(40):
                    yield b"y" * 65536

            streamed = c.put(url, params={"path": "/workspace/big"}, content=chunks())
            assert failure(streamed, 413)["code"] == "file_too_large"
            declared = c.put(url, params={"path": "/workspace/big"}, content=b"z" * 1048577)
            assert failure(declared, 413)["code"] == "file_too_large"
            assert failure(c.get(url, params={"path": "/workspace/big"}), 404)
            assert os.listdir(plane.guest_file(sb["id"], "/workspace")) == ["ok"]
