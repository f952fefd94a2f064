"""No process createos-local starts for a guest sees the server's environment (issue 42).

slirp4netns parses every packet a guest sends; at ac8509d it ran with the control plane's whole
environment, ``CREATEOS_LOCAL_API_KEY`` included, and so did ``unshare``, ``nsenter``, ``nft``
and a fork's ``cp``. Each host tool the server runs is replaced here by a shim (found first on
the server's ``PATH``) that records its own ``/proc/<pid>/environ`` and then becomes the real
tool, so even the helpers that live a few milliseconds are read; the long-lived ones
(slirp4netns, bwrap) are also read live.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from cp_helpers import data, make_client, run, sh
from waiting import wait_status

from langflow_sandbox_createos.local.helpers import HELPER_ENV_KEYS
from langflow_sandbox_createos.local.testing import LocalControlPlane

# every tool the server starts by name, per guest (and setpriv/bwrap in its start-up probe too)
TOOLS = ("unshare", "nsenter", "nft", "ip", "slirp4netns", "setpriv", "bwrap", "cp")
# the ones a guest with open egress that is exec'd, narrowed, read back and forked must start
MUST_SEE = {"unshare", "nsenter", "nft", "slirp4netns", "setpriv", "bwrap", "cp"}


@pytest.fixture
def shims() -> Iterator[tuple[Path, Path]]:
    """(a directory of shims to put first on PATH, where they record each helper's env)."""
    top = Path(tempfile.mkdtemp(prefix="createos-shims-"))
    top.chmod(0o755)
    bin_dir, records = top / "bin", top / "env"
    bin_dir.mkdir()
    records.mkdir()
    records.chmod(0o1777)  # bwrap's shim runs as the guest's unprivileged host user
    for name in TOOLS:
        real = shutil.which(name)
        assert real is not None, name
        shim = bin_dir / name
        # the shell exports a PWD of its own: pass on exactly the environment the shim was given
        shim.write_text(
            f"#!/bin/sh\ncat /proc/$$/environ > {records}/{name}.$$ 2>/dev/null\n"
            f"grep -qz '^PWD=' /proc/$$/environ || unset PWD\n"
            f'exec {real} "$@"\n'
        )
        shim.chmod(0o755)
    try:
        yield bin_dir, records
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _environ(raw: bytes) -> dict[str, str]:
    pairs = (entry.decode(errors="replace").partition("=") for entry in raw.split(b"\0") if entry)
    return {key: value for key, _, value in pairs}


def _descendants(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as fh:
                    parents[int(entry)] = int(fh.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        children = [p for p, parent in parents.items() if parent == pid]
        found += children
        frontier += children
    return found


def _live_environs(server: int) -> dict[int, tuple[str, dict[str, str], bool]]:
    """pid -> (command, environment, in the host's PID namespace) for each process under the server."""
    host_pidns = os.readlink("/proc/self/ns/pid")
    seen = {}
    for pid in _descendants(server):
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                env = _environ(fh.read())
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                command = fh.read().split(b"\0")[0].decode(errors="replace")
            in_host = os.readlink(f"/proc/{pid}/ns/pid") == host_pidns
        except OSError:  # exited meanwhile
            continue
        seen[pid] = (command, env, in_host)
    return seen


def test_no_helper_sees_the_api_key_or_anything_beyond_its_allowlist(
    monkeypatch: pytest.MonkeyPatch, shims: tuple[Path, Path]
) -> None:
    """Fails on ac8509d: the records of unshare, nsenter, nft, slirp4netns and cp hold the
    server's whole environment, the key included."""
    bin_dir, records = shims
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    with LocalControlPlane() as plane, make_client(plane) as client:
        assert plane.pid is not None
        sb = data(client.post("/v1/sandboxes", json={"shape": "s-1vcpu-256mb", "egress": ["*"]}))
        sid = sb["id"]
        started = sh(client, sid, "sleep 600 >/dev/null 2>&1 & echo started")
        assert started["stdout"] == "started\n", started
        data(client.put(f"/v1/sandboxes/{sid}/egress", json={"egress": ["10.99.0.0/16"]}))
        assert run(client, sid, "true")["exit_code"] == 0
        assert plane.network(sid)["rules"]  # nft list, in the guest's namespace

        live = _live_environs(plane.pid)
        commands = {command.rsplit("/", 1)[-1] for command, _, _ in live.values()}
        assert {"slirp4netns", "bwrap", "sleep"} <= commands, live
        holding_key = [command for command, env, _ in live.values() if plane.api_key in env.values()]
        assert holding_key == [], holding_key
        for pid, (command, env, in_host) in live.items():
            if in_host:  # a helper of the server's, not a guest process
                assert set(env) <= HELPER_ENV_KEYS, (pid, command, sorted(env))

        data(client.post(f"/v1/sandboxes/{sid}/pause"))
        wait_status(client, sid, "paused", timeout=30)
        fork = data(client.post(f"/v1/sandboxes/{sid}/fork", json={}))  # cp -a of the disk
        wait_status(client, fork["id"], "running", timeout=30)
        data(client.delete(f"/v1/sandboxes/{fork['id']}"))
        data(client.delete(f"/v1/sandboxes/{sid}"))

    recorded = {record.name: _environ(record.read_bytes()) for record in records.iterdir()}
    assert {name.split(".")[0] for name in recorded} >= MUST_SEE, sorted(recorded)
    assert sorted(name for name, env in recorded.items() if plane.api_key in env.values()) == []
    beyond = {name: sorted(env) for name, env in recorded.items() if not set(env) <= HELPER_ENV_KEYS}
    assert beyond == {}, beyond
