"""Guests are isolated from the host network (whatever their egress), from each other and
from the server's state, and can tell which sandbox they run in. The guest network itself:
tests/local/test_guest_network.py."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cp_helpers import SandboxFactory, data, make_client, sandbox_factory_for, sh
from waiting import wait_status

from langflow_sandbox_createos.local.testing import LocalControlPlane

FETCH = (
    "import sys, urllib.request\n"
    "try:\n"
    "    print(urllib.request.urlopen(sys.argv[1], timeout=3).read().decode())\n"
    "except Exception as exc:\n"
    "    print('unreachable', type(exc).__name__)\n"
    "    sys.exit(3)\n"
)


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"hello-from-host"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def host_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def fetch(c: httpx.Client, sandbox_id: str, url: str) -> dict[str, Any]:
    body = {"cmd": "python3", "args": ["-c", FETCH, url]}
    return data(c.post(f"/v1/sandboxes/{sandbox_id}/exec", json=body))["result"]


@pytest.mark.parametrize("egress", [None, [], ["*"], ["240.0.0.0/4"], ["127.0.0.1"]], ids=repr)
def test_no_egress_reaches_host_loopback(
    client: httpx.Client, sandbox_factory: SandboxFactory, host_server: str, egress: list[str] | None
) -> None:
    """Allow-all once shared the host's network; now no rule set reaches the host's loopback,
    not even one that names it (the guest's 127.0.0.1 is its own)."""
    fields = {} if egress is None else {"egress": egress}
    result = fetch(client, sandbox_factory(**fields)["id"], host_server)
    assert result["exit_code"] == 3 and "unreachable" in result["stdout"], (egress, result)
    assert httpx.get(host_server).text == "hello-from-host"  # while the host reaches it


def _sections(stdout: str) -> dict[str, list[str]]:
    """``== name ==`` headed sections of a probe's output, as lists of lines."""
    out: dict[str, list[str]] = {}
    current: list[str] = []
    for line in stdout.splitlines():
        if line.startswith("== ") and line.endswith(" =="):
            current = out.setdefault(line[3:-3], [])
        else:
            current.append(line)
    return out


def test_guests_cannot_see_each_other_or_server_state(
    client: httpx.Client, cp: LocalControlPlane, sandbox_factory: SandboxFactory
) -> None:
    a, b = sandbox_factory(), sandbox_factory()
    sh(client, a["id"], "echo secret-a > /workspace/secret; echo tmp-a > /tmp/secret")
    # where A's files really are on the host: its root, <state>/sandboxes/<id>/fs (GuestLayout),
    # a mount of the server's own mount namespace
    state = cp.state_dir
    a_root = state / "sandboxes" / a["id"] / "fs"
    assert cp.guest_file(a["id"], "/workspace/secret") == Path(
        f"/proc/{cp.pid}/root{a_root}/workspace/secret"
    )
    assert cp.guest_file(a["id"], "/workspace/secret").read_text() == "secret-a\n"
    assert cp.guest_file(a["id"], "/tmp/secret").read_text() == "tmp-a\n"
    probe = (
        "echo '== workspace =='; ls -A /workspace; echo '== tmp =='; ls -A /tmp; "
        f"echo '== state =='; ls -A {state} {state}/sandboxes {a_root} 2>&1; "
        f"echo '== a-files =='; cat {a_root}/workspace/secret {a_root}/tmp/secret 2>&1; true"
    )
    seen = sh(client, b["id"], probe)
    parts = _sections(seen["stdout"])
    assert set(parts) == {"workspace", "tmp", "state", "a-files"}, seen
    # B's own root is fresh: nothing of A's in it
    assert parts["workspace"] == [] and parts["tmp"] == [], seen
    # the server's state (every guest's root in it) does not exist in B's view
    assert parts["state"] == [
        f"ls: cannot access '{path}': No such file or directory"
        for path in (state, state / "sandboxes", a_root)
    ], seen
    assert parts["a-files"] == [
        f"cat: {a_root}/{name}/secret: No such file or directory" for name in ("workspace", "tmp")
    ], seen
    assert "secret-a" not in seen["stdout"] and "tmp-a" not in seen["stdout"], seen
    assert sh(client, a["id"], "cat /workspace/secret /tmp/secret")["stdout"] == "secret-a\ntmp-a\n"
    # the server's own credentials are nowhere in the guest's process environment
    assert (
        cp.api_key
        not in sh(client, b["id"], "cat /proc/1/environ /proc/self/environ | tr '\\0' '\\n'")["stdout"]
    )


def test_guest_knows_its_identity(client: httpx.Client, sandbox_factory: SandboxFactory) -> None:
    named = sandbox_factory(name="who-am-i")
    out = sh(client, named["id"], "hostname; echo $CREATEOS_SANDBOX_ID $CREATEOS_SANDBOX_NAME")["stdout"]
    assert out == f"who-am-i\n{named['id']} who-am-i\n"


def test_guest_has_its_own_pid_namespace_and_readonly_root(
    client: httpx.Client, sandbox: dict[str, Any]
) -> None:
    result = sh(client, sandbox["id"], "ls /proc | grep -c '^[0-9]'; touch /usr/evil 2>/dev/null || echo ro")
    count, ro = result["stdout"].split()
    assert int(count) < 10
    assert ro == "ro"


def _host_processes_with(marker: bytes) -> list[str]:
    import os

    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker in f.read():
                    found.append(pid)
        except OSError:
            pass
    return found


def test_background_processes_live_until_delete_and_freeze_with_pause(
    client: httpx.Client, cp: LocalControlPlane, sandbox_factory: SandboxFactory
) -> None:
    """As on a microVM: what exec 1 leaves running is there for exec 2, stops while the guest
    is paused, and dies with the guest; the exec itself ends with its main process."""
    sid = sandbox_factory()["id"]
    loop = "while :; do echo x >> /workspace/ticks; sleep 0.02; done"
    started = sh(client, sid, f"sh -c '{loop}' bg-ticker-4343 & echo started")
    assert started == {"stdout": "started\n", "stderr": "", "exit_code": 0}, started
    assert cp.stats()["guest_processes"] == 0  # the exec is over
    seen = sh(client, sid, "ps -eo args | grep -c '[b]g-ticker-4343'")["stdout"].strip()
    assert seen == "1"
    ticks = cp.guest_file(sid, "/workspace/ticks")

    def wait_until(done: Callable[[], bool]) -> bool:
        for _ in range(250):
            if done():
                return True
            time.sleep(0.02)
        return False

    before = ticks.stat().st_size
    assert wait_until(lambda: ticks.stat().st_size > before), "the background process is not running"
    data(client.post(f"/v1/sandboxes/{sid}/pause"))
    wait_status(client, sid, "paused", timeout=5)
    frozen = ticks.stat().st_size
    time.sleep(0.5)
    assert ticks.stat().st_size == frozen, "the background process ran while paused"
    assert _host_processes_with(b"bg-ticker-4343")  # frozen, not gone
    data(client.post(f"/v1/sandboxes/{sid}/resume"))
    assert wait_until(lambda: ticks.stat().st_size > frozen), "the background process did not resume"
    data(client.delete(f"/v1/sandboxes/{sid}"))
    assert wait_until(lambda: not _host_processes_with(b"bg-ticker-4343")), "it outlived its guest"


def _tiny_rootfs(root: Path) -> None:
    """A rootfs with nothing but dash and the libraries it links against."""
    import shutil
    import subprocess

    (root / "bin").mkdir(parents=True)
    (root / "etc").mkdir()
    shutil.copy2("/usr/bin/dash", root / "bin" / "sh")
    libs = subprocess.run(["ldd", "/usr/bin/dash"], capture_output=True, text=True, check=True).stdout
    for token in libs.split():
        if token.startswith("/"):
            target = root / token.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(token, target)
    (root / "etc" / "tiny-release").write_text("tiny 1\n")


def test_custom_rootfs_is_the_guest_root(tmp_path: Path) -> None:
    rootfs = tmp_path / "tiny"
    _tiny_rootfs(rootfs)
    with LocalControlPlane(extra_args=["--rootfs", f"tiny:1={rootfs}"]) as plane, make_client(plane) as c:
        assert "tiny:1" in data(c.get("/v1/rootfs"))["rootfs"]
        for make in sandbox_factory_for(c):
            sb = make(rootfs="tiny:1")
            assert sb["rootfs"] == "tiny:1"
            result = sh(
                c, sb["id"], "read line < /etc/tiny-release; echo $line; echo x > /workspace/w && echo ok"
            )
            assert result["stdout"] == "tiny 1\nok\n", result
            missing = data(c.post(f"/v1/sandboxes/{sb['id']}/exec", json={"cmd": "python3"}))["result"]
            assert missing["exit_code"] == 0 and "python3" in missing["error"]
