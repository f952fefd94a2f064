"""A createos-local guest is a machine of its own: a private writable root (an overlay of its
image on a disk of ``disk_mib``) kept across execs and pause, copied by fork, gone on delete;
an unprivileged user that sees its image and nothing of the host."""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cp_helpers import SandboxFactory, data, failure, sh
from waiting import wait_status

from langflow_sandbox_createos.local.testing import LocalControlPlane

REPO = Path(__file__).resolve().parents[2]


def files_url(sandbox_id: str) -> str:
    return f"/v1/sandboxes/{sandbox_id}/files"


def test_root_files_survive_pause_and_fork_and_diverge(
    client: httpx.Client, sandbox_factory: SandboxFactory
) -> None:
    parent = sandbox_factory()["id"]
    data(client.put(files_url(parent), params={"path": "/root/x"}, content=b"seed"))
    sh(client, parent, "mkdir -p /home/user/.cache && echo warm > /home/user/.cache/state")
    data(client.post(f"/v1/sandboxes/{parent}/pause"))
    wait_status(client, parent, "paused")
    child = data(client.post(f"/v1/sandboxes/{parent}/fork", json={"start_paused": True}))["id"]
    try:
        assert data(client.get(f"/v1/sandboxes/{child}"))["status"] == "paused"
        data(client.post(f"/v1/sandboxes/{child}/resume"))
        wait_status(client, child, "running")
        assert client.get(files_url(child), params={"path": "/root/x"}).content == b"seed"
        assert sh(client, child, "cat /home/user/.cache/state")["stdout"] == "warm\n"
        data(client.put(files_url(child), params={"path": "/root/fork-only"}, content=b"mine"))
        sh(client, child, "echo child > /home/user/.cache/state")
        data(client.post(f"/v1/sandboxes/{parent}/resume"))
        wait_status(client, parent, "running")
        assert failure(client.get(files_url(parent), params={"path": "/root/fork-only"}), 404)
        assert sh(client, parent, "cat /home/user/.cache/state")["stdout"] == "warm\n"
        # and the other way round: the parent's later writes stay the parent's
        data(client.put(files_url(parent), params={"path": "/root/x"}, content=b"parent-later"))
        assert client.get(files_url(child), params={"path": "/root/x"}).content == b"seed"
    finally:
        client.delete(f"/v1/sandboxes/{child}")


def test_image_files_replaced_in_a_guest_are_its_own(
    client: httpx.Client, sandbox_factory: SandboxFactory
) -> None:
    parent = sandbox_factory()["id"]
    data(client.put(files_url(parent), params={"path": "/etc/motd-x"}, content=b"x"))
    assert sh(client, parent, "ls /usr/bin/env")["exit_code"] == 0
    data(client.put(files_url(parent), params={"path": "/usr/bin/env"}, content=b"replaced"))
    data(client.post(f"/v1/sandboxes/{parent}/pause"))
    wait_status(client, parent, "paused")
    child = data(client.post(f"/v1/sandboxes/{parent}/fork", json={}))["id"]
    try:
        wait_status(client, child, "running")
        assert client.get(files_url(child), params={"path": "/usr/bin/env"}).content == b"replaced"
        assert client.get(files_url(child), params={"path": "/etc/motd-x"}).content == b"x"
        with open("/usr/bin/env", "rb") as host_env:
            assert host_env.read(4) == b"\x7fELF"  # the image itself is untouched
    finally:
        client.delete(f"/v1/sandboxes/{child}")


def test_disk_is_bounded_by_disk_mib_and_grows_with_resize(
    client: httpx.Client, cp: LocalControlPlane, sandbox_factory: SandboxFactory
) -> None:
    sid = sandbox_factory(disk_mib=8)["id"]
    write = "head -c 12582912 /dev/zero > /workspace/big && echo wrote"
    full = sh(client, sid, write)
    assert full["exit_code"] != 0 and "No space left" in full["stderr"], full
    assert sh(client, sid, "df -m / | tail -1")["stdout"].split()[1] == "8"
    sh(client, sid, "rm -f /workspace/big")
    too_big = client.put(files_url(sid), params={"path": "/root/big"}, content=b"z" * (12 << 20))
    assert "disk" in failure(too_big, 507)["message"]
    assert os.listdir(cp.guest_file(sid, "/root")) == []  # no half-written upload left behind
    assert failure(client.post(f"/v1/sandboxes/{sid}/resize", json={"disk_mib": 4}), 400)
    grown = data(client.post(f"/v1/sandboxes/{sid}/resize", json={"disk_mib": 32}))
    assert grown == {"id": sid, "disk_mib": 32}
    assert data(client.get(f"/v1/sandboxes/{sid}"))["disk_mib"] == 32
    assert sh(client, sid, write)["stdout"] == "wrote\n"


def test_guest_root_holds_only_its_small_capability_set(
    client: httpx.Client, sandbox: dict[str, Any]
) -> None:
    """Root inside, as on a VM, with Docker's default capabilities less the ones that mean
    nothing here (and only over its own user namespace; the host's side is test_guest_network)."""
    out = sh(client, sandbox["id"], "id -u; id -g; cat /proc/self/status | grep CapEff")["stdout"].split()
    assert out[0] == "0" and out[1] == "0"
    held = int(out[-1], 16)
    names = {0: "CHOWN", 1: "DAC_OVERRIDE", 3: "FOWNER", 4: "FSETID", 5: "KILL", 6: "SETGID", 7: "SETUID"}
    names.update({8: "SETPCAP", 31: "SETFCAP"})
    assert {names.get(bit, str(bit)) for bit in range(64) if held >> bit & 1} == set(names.values())


@pytest.fixture
def canaries(cp: LocalControlPlane, tmp_path: Path) -> Iterator[dict[str, str]]:
    """One secret file in each place a guest must never see: /root, /home, /var, the project
    checkout, the server's state dir and a Langflow config dir (as `make run` keeps one)."""
    token = secrets.token_hex(8)
    lf_config = tmp_path / "lf-config"
    lf_config.mkdir()
    places = {
        "root": Path("/root"),
        "home": Path("/home"),
        "var": Path("/var"),
        "checkout": REPO,
        "state": cp.state_dir,
        "langflow-config": lf_config,
    }
    planted: dict[str, str] = {}
    try:
        for label, directory in places.items():
            path = directory / f"canary-{label}-{token}"
            path.write_text(f"SECRET{token}")
            path.chmod(0o644)
            planted[label] = str(path)
        yield planted
    finally:
        for path in planted.values():
            Path(path).unlink(missing_ok=True)
        shutil.rmtree(lf_config, ignore_errors=True)


def test_hostile_guest_cannot_read_the_host(
    client: httpx.Client, sandbox_factory: SandboxFactory, canaries: dict[str, str]
) -> None:
    token = next(iter(canaries.values())).rsplit("-", 1)[-1]
    reads = "; ".join(f"cat {path} 2>&1" for path in canaries.values())
    hunt = (
        f"{reads}; ls -A /root /home /var /srv /opt 2>&1; "
        f"find / -xdev -name 'canary-*' 2>/dev/null; grep -rs SECRET{token} /etc /root /home /var /opt /tmp; "
        "cat /etc/shadow 2>&1; true"
    )
    for rootfs in ("devbox:1", "langflow-lfx"):
        sid = sandbox_factory(rootfs=rootfs)["id"]
        seen = sh(client, sid, hunt)
        assert f"SECRET{token}" not in seen["stdout"], (rootfs, seen["stdout"])
        found = [line for line in seen["stdout"].splitlines() if line.startswith("/") and "canary-" in line]
        assert found == [], found
        assert "No such file or directory" in seen["stdout"]
        assert "cat: /etc/shadow: No such file or directory" in seen["stdout"]  # no host /etc/shadow
        # the files API resolves inside the guest's root too
        for path in canaries.values():
            assert failure(client.get(files_url(sid), params={"path": path}), 404)
    assert all(os.path.exists(p) for p in canaries.values())
