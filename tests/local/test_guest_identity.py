"""Who a guest's root is on the host (issue 42): an unprivileged host uid of its own.

At ac8509d every guest's root was the host's ``nobody`` (65534), shared by every guest and by
whatever else on the host runs as ``nobody`` (which therefore owned every guest's user
namespace), and the guest's ``/proc/self/uid_map`` read ``0 0 1`` (bwrap nested a second user
namespace in its own, so the map named the outer namespace's root, not a host uid). Now each
guest's user namespace is a child of the host's, made at create, mapping its root to a host
uid no other guest has; the layers createos-local builds are shown to it idmapped.
"""

from __future__ import annotations

import os
import secrets
from typing import Any

import httpx
from cp_helpers import SandboxFactory, data, make_client, run, sh
from waiting import wait_status

from langflow_sandbox_createos.local.images import TEMPLATE_NAME
from langflow_sandbox_createos.local.testing import LocalControlPlane


def _host_uid(plane: LocalControlPlane, sandbox_id: str) -> int:
    uid: int = next(row["host_uid"] for row in plane.sandboxes() if row["id"] == sandbox_id)
    return uid


def _host_uids_of(command: bytes) -> set[int]:
    """The host uids of the processes whose command line is ``command``."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                if fh.read().rstrip(b"\0").replace(b"\0", b" ") != command:
                    continue
            with open(f"/proc/{entry}/status") as fh:
                uids = next(line for line in fh if line.startswith("Uid:")).split()[1:]
        except (OSError, StopIteration):
            continue
        found.add(int(uids[0]))
    return found


def test_the_guest_maps_its_root_to_a_host_uid_of_its_own(
    cp: LocalControlPlane, client: httpx.Client, sandbox_factory: SandboxFactory
) -> None:
    """Fails on ac8509d: uid_map reads ``0 0 1`` and both guests are 65534 on the host."""
    a, b = sandbox_factory(), sandbox_factory()
    uids, naps = {}, {"a": 6000 + secrets.randbelow(3000), "b": 9000 + secrets.randbelow(3000)}
    for sb, tag in ((a, "a"), (b, "b")):
        out = sh(
            client,
            sb["id"],
            f"cat /proc/self/uid_map /proc/self/gid_map; id -u; echo {tag} > /root/mine; "
            f"sleep {naps[tag]} >/dev/null 2>&1 & echo started",
        )
        assert out["exit_code"] == 0, out
        uid_map, gid_map, inside, started = out["stdout"].splitlines()
        assert uid_map.split()[::2] == ["0", "1"] and int(uid_map.split()[1]) >= 65536, (
            out
        )  # not 0, not nobody
        host_uid = int(uid_map.split()[1])
        assert host_uid == _host_uid(cp, sb["id"])
        assert gid_map.split() == ["0", str(host_uid), "1"], out
        assert (inside, started) == ("0", "started"), out
        uids[tag] = host_uid
    assert uids["a"] != uids["b"], uids
    for sb, tag in ((a, "a"), (b, "b")):
        written = cp.guest_file(sb["id"], "/root/mine").stat()
        assert (written.st_uid, written.st_gid) == (uids[tag], uids[tag])
    # the guests' processes run as those uids on the host
    for tag, nap in naps.items():
        assert _host_uids_of(f"sleep {nap}".encode()) == {uids[tag]}


def test_the_guest_cannot_make_a_user_namespace_in_its_own(
    client: httpx.Client, sandbox: dict[str, Any]
) -> None:
    out = sh(
        client,
        sandbox["id"],
        "cat /proc/sys/user/max_user_namespaces; echo 9 > /proc/sys/user/max_user_namespaces",
    )
    assert out["stdout"] == "0\n" and out["exit_code"] != 0, out


def test_the_guest_root_owns_the_image_and_its_files_come_back_through_the_api(
    cp: LocalControlPlane, client: httpx.Client, sandbox_factory: SandboxFactory
) -> None:
    """The layers createos-local built (idmapped per guest) are its root's, the host's /usr is
    not; what it writes, uploads and forks are its uid's on the host, and the server reads
    them back whatever their mode."""
    sb = sandbox_factory(rootfs=TEMPLATE_NAME)
    sid = sb["id"]
    uid = _host_uid(cp, sid)
    owners = "stat -c '%u %n' / /etc /etc/passwd /root /usr/local/lib /workspace /tmp /opt/lfx /usr/bin/env"
    out = sh(client, sid, f"{owners}; echo 10.1.1.1 extra >> /etc/hosts && echo appended")
    listed = dict(reversed(line.split()) for line in out["stdout"].splitlines()[:-1])
    assert {path: owner for path, owner in listed.items() if path not in ("/", "/usr/bin/env")} == {
        path: "0"
        for path in ("/etc", "/etc/passwd", "/root", "/usr/local/lib", "/workspace", "/tmp", "/opt/lfx")
    }, out
    with open("/proc/sys/kernel/overflowuid") as fh:  # what an unmapped owner shows as
        assert listed["/usr/bin/env"] == fh.read().strip(), out  # the host's root is not mapped
    assert out["stdout"].endswith("appended\n"), out
    assert run(client, sid, "python3", "-c", "import lfx; print('lfx')")["stdout"] == "lfx\n"  # the template

    assert cp.guest_file(sid, "/etc/passwd").stat().st_uid == uid  # the built layer, idmapped
    assert (
        sh(client, sid, "umask 077; echo private > /root/private; stat -c %a /root/private")["stdout"]
        == "600\n"
    )
    answer = client.get(f"/v1/sandboxes/{sid}/files", params={"path": "/root/private"})
    assert (answer.status_code, answer.content) == (200, b"private\n")
    put = client.put(f"/v1/sandboxes/{sid}/files", params={"path": "/root/up/in.txt"}, content=b"in")
    assert put.status_code == 200, put.text
    assert cp.guest_file(sid, "/root/up/in.txt").stat().st_uid == uid

    data(client.post(f"/v1/sandboxes/{sid}/pause"))
    wait_status(client, sid, "paused", timeout=30)
    fork = data(client.post(f"/v1/sandboxes/{sid}/fork", json={}))
    try:
        wait_status(client, fork["id"], "running", timeout=30)
        fork_uid = _host_uid(cp, fork["id"])
        assert fork_uid != uid
        for path in ("/root/private", "/root/up/in.txt", "/root/up"):
            assert cp.guest_file(fork["id"], path).stat().st_uid == fork_uid, path
        out = sh(
            client,
            fork["id"],
            "cat /root/private && echo more >> /root/private && stat -c %u /root/up/in.txt",
        )
        assert out["stdout"] == "private\n0\n", out
    finally:
        client.delete(f"/v1/sandboxes/{fork['id']}")


def test_a_shared_guest_uid_is_one_unprivileged_uid_that_owns_the_image() -> None:
    """``--shared-guest-uid`` (and the fallback where the kernel cannot idmap the layers): every
    guest is the base uid, which owns the layers on disk; still no host root, no 65534."""
    base = 1879048192 + 4242  # a base of the test's own (the default is 1879048192)
    with LocalControlPlane(extra_args=["--shared-guest-uid", "--guest-uid-base", str(base)]) as plane:
        assert plane.stats()["guest_uids"] == "shared"
        with make_client(plane) as client:
            ids = [
                data(client.post("/v1/sandboxes", json={"shape": "s-1vcpu-256mb"}))["id"] for _ in range(2)
            ]
            try:
                for sid in ids:
                    out = sh(
                        client, sid, "cat /proc/self/uid_map; stat -c %u /etc/passwd; echo x >> /etc/hosts"
                    )
                    assert out["stdout"].split() == ["0", str(base), "1", "0"] and out["exit_code"] == 0, out
                    assert _host_uid(plane, sid) == base
            finally:
                for sid in ids:
                    client.delete(f"/v1/sandboxes/{sid}")
