"""A guest swapping a directory for a symlink while the files API works on a path under it
(renameat2 RENAME_EXCHANGE in a tight loop) cannot make the server read or write anything
outside the guest's root: every lookup is one openat2(RESOLVE_IN_ROOT) step."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from cp_helpers import SandboxFactory, data, sh

ROUNDS = 150  # with the check-then-open code, about one download in four escaped

FLIPPER = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
RENAME_EXCHANGE = 2
os.chdir("/workspace/race")
os.mkdir("real")
with open("real/passwd", "w") as f:
    f.write("decoy")
os.symlink(sys.argv[1], "link")
print("flipping", flush=True)
while True:
    libc.renameat2(-100, b"real", -100, b"link", RENAME_EXCHANGE)
"""


PATH_BUSY = -503  # the files API's documented 503 "keeps renaming" (any other 503 stays 503)


def _status(response: httpx.Response) -> int:
    if response.status_code == 503 and "keeps renaming" in response.json().get("message", ""):
        return PATH_BUSY
    return response.status_code


def _host_files_named(directory: Path, prefix: str) -> list[str]:
    return [name for name in os.listdir(directory) if name.startswith(prefix)]


def test_symlink_flipper_cannot_reach_outside(client: httpx.Client, sandbox_factory: SandboxFactory) -> None:
    sid = sandbox_factory()["id"]
    url = f"/v1/sandboxes/{sid}/files"
    with open("/etc/passwd", "rb") as f:
        host_passwd = f.read()
    guest_passwd = sh(client, sid, "cat /etc/passwd")["stdout"].encode()
    assert guest_passwd != host_passwd
    followed = 0  # downloads that went through the symlink: the race was live
    # Each target's uploads get names of their own: both targets reach the guest's /etc, so a
    # name the first left there would count for the second (one upload of the second that
    # answered 404 or 503 then seemed to have landed: 150 listed against 149 answered 200).
    for round_, target in enumerate(("/etc", "../../../../../../../../etc")):
        prefix = f"race-up-{round_}-"
        sh(client, sid, "rm -rf /workspace/race /workspace/flip.log; mkdir /workspace/race")
        data(client.put(url, params={"path": "/workspace/flip.py"}, content=FLIPPER.encode()))
        flip = (
            f"python3 /workspace/flip.py {target} > /workspace/flip.log 2>&1 & echo $! > /workspace/flip.pid"
        )
        started = sh(client, sid, f"{flip}; while [ ! -s /workspace/flip.log ]; do sleep 0.05; done")
        assert started["exit_code"] == 0, started
        log = client.get(url, params={"path": "/workspace/flip.log"})
        assert log.content == b"flipping\n", (target, log.content)

        def download(_: int) -> tuple[int, bytes]:
            got = client.get(url, params={"path": "/workspace/race/real/passwd"})
            return _status(got), got.content

        def upload(i: int, prefix: str = prefix) -> int:
            body = f"race-{i}".encode()
            return _status(
                client.put(url, params={"path": f"/workspace/race/real/{prefix}{i}"}, content=body)
            )

        with ThreadPoolExecutor(4) as pool:
            downloads = list(pool.map(download, range(ROUNDS)))
            uploads = list(pool.map(upload, range(ROUNDS)))
        sh(client, sid, "kill $(cat /workspace/flip.pid)")
        statuses = {status for status, _ in downloads} | set(uploads)
        # never a 500; 503 only as the documented "keeps renaming" answer (openat2 kept
        # answering EAGAIN: the guest renamed the path under every one of the server's tries)
        assert statuses <= {200, 400, 404, PATH_BUSY}, statuses
        bodies = {body for status, body in downloads if status == 200}
        assert host_passwd not in bodies
        assert bodies <= {b"decoy", guest_passwd}, bodies
        followed += sum(1 for status, body in downloads if status == 200 and body == guest_passwd)
        assert any(status == 200 for status in uploads)
        assert _host_files_named(Path("/etc"), "race-up-") == []
        assert _host_files_named(Path("/etc"), ".upload-") == []
        # what the uploads wrote landed in the guest: its real dir or its own /etc
        listing = (
            f"ls /workspace/race/real /workspace/race/link /etc 2>/dev/null | grep {prefix} | sort -u | wc -l"
        )
        landed = sh(client, sid, listing)
        assert int(landed["stdout"].strip()) == sum(1 for status in uploads if status == 200)
    assert followed > 0
