"""Hostile guests: whatever the program does, the host keeps working, its memory stays
bounded, nothing leaks out of the guest (files, links, devices) and nothing of the host's
credentials leaks in.

- 1 GiB of output: the backend completes with the truncation note; client RSS bounded.
- a fork bomb: bounded by createos-local's pids cgroup and the timeout; the host still
  forks; the guest is deleted.
- a program that closes stdout and stderr and keeps running: the timeout path.
- binary output that is not UTF-8: replaced, never an exception.
- Return Files with symlinks to /etc, device files and fifos, 10,000 tiny files, an archive
  with absolute and ../ member paths, and a gzip bomb (the last two smuggled in by a program
  that swaps the run's archive after the wrapper wrote it).
- in every surface: the API key is in no guest process's environment or command line and
  in no file the guest owns.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from langflow_sandbox_createos.component import reuse
from langflow_sandbox_createos.core import budget, connection, settings

from . import harness
from .harness import API_KEY, driver

pytestmark = pytest.mark.timeout(300)

MiB = 1024 * 1024


@pytest.fixture
def env(plane: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setattr(settings, "_lfx_sandbox_settings", lambda: None)
    for name in (
        "CREATEOS_API_KEY",
        "LANGFLOW_SANDBOX_ALLOWED_DOMAINS",
        "CREATEOS_SANDBOX_WARM_POOL",
        "CREATEOS_SANDBOX_MAX_OUTPUT_BYTES",
        "CREATEOS_SANDBOX_SHAPE",
        "CREATEOS_SANDBOX_ROOTFS",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CREATEOS_SANDBOX_API_KEY", plane.api_key)
    monkeypatch.setenv("CREATEOS_SANDBOX_BASE_URL", plane.url)
    monkeypatch.setenv("LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS", "true")
    monkeypatch.setenv("CREATEOS_SANDBOX_ACCEPT_LOCAL_ISOLATION", "true")  # createos-local
    monkeypatch.setenv("LANGFLOW_SANDBOX_TIMEOUT_SECONDS", "30")
    monkeypatch.setenv("CREATEOS_SANDBOX_CONTROL_TIMEOUT_SECONDS", "30")
    monkeypatch.setenv("CREATEOS_EXECUTOR_TIMEOUT_SECONDS", "180")
    for name, value in harness.TEMPLATE_ENV.items():
        monkeypatch.setenv(name, value)
    plane.clear_faults()
    yield plane
    harness.drain_backend_deletes()
    plane.delete_all()
    reuse.guest_ids.clear()
    assert plane.wait_until_no_live(timeout=15) == []


def _rss_mib() -> float:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:")) / 1024


class PeakRss:
    """Samples this process's RSS every 20 ms while a block runs."""

    def __init__(self) -> None:
        self.before = _rss_mib()
        self.peak = self.before
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, _rss_mib())

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def growth(self) -> float:
        return self.peak - self.before


def _guests_gone(plane: Any, before: set[str], timeout: float = 15.0) -> list[dict[str, Any]]:
    harness.drain_backend_deletes()
    deadline = time.monotonic() + timeout
    while True:
        left = [sb for sb in plane.live_sandboxes() if sb["id"] not in before]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


# --- output ------------------------------------------------------------------------------------


def test_backend_1gib_of_output_completes_cut_with_a_note_and_bounded_rss(env: Any, monkeypatch) -> None:
    monkeypatch.setenv("LANGFLOW_SANDBOX_TIMEOUT_SECONDS", "240")
    code = "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(chunk)\nprint('never cut', file=sys.stderr)\n"
    before = {sb["id"] for sb in env.sandboxes()}
    sent_before = env.stats()["bytes_sent"]
    with PeakRss() as rss:
        out = driver.backend(code)
    assert out.exc is None, out.exc
    assert out.exit_code == 0
    assert len(out.stdout) == 16 * MiB and set(out.stdout) == {"x"}
    stderr = out.details["stderr"]
    assert "never cut" in stderr
    assert "[createos: stdout truncated at 16 MiB; set CREATEOS_SANDBOX_MAX_OUTPUT_BYTES]" in stderr
    assert env.stats()["bytes_sent"] - sent_before > 1024 * MiB  # all of it crossed the wire
    # the 16 MiB capture plus the 16 MiB str built from it, never the gigabyte
    assert rss.growth < 96, f"client RSS grew {rss.growth:.0f} MiB for 1 GiB of output"
    assert _guests_gone(env, before) == []


def test_binary_output_that_is_not_utf8_is_replaced_not_raised(env: Any) -> None:
    code = (
        "import sys\nsys.stdout.buffer.write(bytes(range(256)) * 64 + b'\\nend\\n')\n"
        "sys.stderr.buffer.write(b'\\xff\\xfe\\x80 bad \\xc3\\x28\\n')\n"
    )
    out = driver.backend(code)
    assert out.exc is None and out.exit_code == 0, out.exc
    assert out.stdout.endswith("end\n") and "\ufffd" in out.stdout
    assert "\ufffd" in out.details["stderr"] and "bad" in out.details["stderr"]
    comp = driver.component(code, component_id="CreateOSSandbox-binary")
    assert comp.exc is None and comp.exit_code == 0, comp.exc
    assert comp.stdout.endswith("end") and "\ufffd" in comp.stdout


def test_closing_stdout_and_running_on_ends_at_the_timeout(env: Any, monkeypatch) -> None:
    monkeypatch.setenv("LANGFLOW_SANDBOX_TIMEOUT_SECONDS", "2")
    monkeypatch.setattr(budget, "BACKEND_GRACE_SECONDS", 3.0)
    code = "import os, time\nprint('before', flush=True)\nos.close(1)\nos.close(2)\ntime.sleep(120)\n"
    before = {sb["id"] for sb in env.sandboxes()}
    out = driver.backend(code)
    assert out.exc is None, out.exc
    assert out.exit_code == -1 and out.stdout == "before\n"
    assert out.elapsed < 2 + 3 + 3
    comp = driver.component(code, component_id="CreateOSSandbox-closed", timeout=2)
    assert comp.exc is None and comp.timed_out and comp.details["error"] == "Timed out after 2 s", comp.value
    assert comp.stdout == "before"
    assert comp.elapsed < 2 + 20 + 5
    assert _guests_gone(env, before) == []


# --- a fork bomb -----------------------------------------------------------------------------------

FORK_BOMB = (
    "import os\nprint('bomb', flush=True)\n"
    "while True:\n"
    "    try:\n"
    "        os.fork()\n"
    "    except OSError:\n"
    "        pass\n"
)


def test_fork_bomb_is_contained_and_the_guest_deleted(env: Any, monkeypatch) -> None:
    if env.stats().get("pids_limit") is None:
        pytest.skip("createos-local has no pids cgroup here: a fork bomb would exhaust the host's PID space")
    monkeypatch.setenv("LANGFLOW_SANDBOX_TIMEOUT_SECONDS", "3")
    before = {sb["id"] for sb in env.sandboxes()}
    out = driver.backend(FORK_BOMB)
    assert out.exc is None, out.exc
    assert out.exit_code in (-1, 137), (out.exit_code, out.details.get("stderr", "")[-300:])
    assert out.stdout.startswith("bomb")
    # the host still forks, and every guest process is gone
    assert subprocess.run(["true"], check=False).returncode == 0
    deadline = time.monotonic() + 20
    while env.stats()["guest_processes"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert env.stats()["guest_processes"] == 0
    assert _guests_gone(env, before) == []
    # and the next run is served normally
    assert driver.backend("print('after')").stdout == "after\n"


# --- returned files ------------------------------------------------------------------------------

ART = "import os\nart = '/workspace/artifacts'\nos.makedirs(art, exist_ok=True)\n"


def _files(out: harness.Outcome) -> dict[str, Any]:
    frame = out.details["files"]
    return {row["path"]: row for row in frame.to_dict("records")} if len(frame) else {}


def test_links_to_etc_devices_and_fifos_never_come_back(env: Any) -> None:
    code = ART + (
        "os.symlink('/etc', art + '/etc')\n"
        "os.symlink('/etc/passwd', art + '/passwd')\n"
        "os.symlink('/dev/zero', art + '/zero')\n"
        "os.mkfifo(art + '/fifo')\n"
        "try:\n    os.mknod(art + '/null', 0o666 | 0o020000, os.makedev(1, 3))\n"
        "except OSError as exc:\n    print('mknod refused:', exc.errno)\n"
        "open(art + '/real.txt', 'w').write('real')\n"
        "open('/workspace/secret.txt', 'w').write('s')\n"
        "os.link('/workspace/secret.txt', art + '/hard')\n"
        "print('done')\n"
    )
    out = driver.component(code, component_id="CreateOSSandbox-links", collect=True, timeout=20)
    assert out.exc is None, out.exc
    files = _files(out)
    assert "real.txt" in files and files["real.txt"]["text"] == "real"
    for name in ("etc", "passwd", "zero", "fifo", "null"):
        assert not any(p == name or p.startswith(name + "/") for p in files), files.keys()
    with open("/etc/passwd") as fh:
        host_passwd = fh.read()
    assert all(row["text"] != host_passwd for row in files.values())
    assert set(files) <= {"real.txt", "hard"}  # a hard link is a regular file of the guest's own
    assert out.elapsed < 60


def test_ten_thousand_tiny_files_are_capped(env: Any) -> None:
    code = ART + "for i in range(10000):\n    open(f'{art}/f{i:05d}', 'w').write('x')\nprint('written')\n"
    with PeakRss() as rss:
        out = driver.component(code, component_id="CreateOSSandbox-many", collect=True, timeout=60)
    assert out.exc is None, out.exc
    assert out.details["artifact_count"] == 256 and out.details["artifacts_truncated"] is True
    assert out.details["artifacts_message"]
    assert rss.growth < 64
    assert out.elapsed < 90


# The program leaves a child that swaps the wrapper's archive for ARCHIVE()'s bytes at the one
# moment that counts: it stops the wrapper shell (same uid, same guest) once the archive file
# exists, waits for the archiving subshell to end, replaces the file, and lets the wrapper go on
# to move it out for the host. No timing race: the host always fetches the hostile bytes.
SWAP_ARCHIVE = (
    "import io, os, signal, sys, tarfile, time\n"
    "run = os.path.dirname(os.path.abspath(__file__))\n"
    "target = os.path.join(run, 'files.tar.gz')\n"
    "blob = ARCHIVE()\n"
    "def parent(pid):\n"
    "    with open(f'/proc/{pid}/stat') as fh:\n"
    "        return int(fh.read().rsplit(')', 1)[1].split()[1])\n"
    "def wrapper():\n"  # the outermost ancestor running the wrapper (its subshells share its argv)
    "    pid, found = os.getppid(), None\n"
    "    while pid > 1:\n"
    "        with open(f'/proc/{pid}/cmdline', 'rb') as fh:\n"
    "            if b'outdir=/tmp/.createos-out' in fh.read():\n"
    "                found = pid\n"
    "        pid = parent(pid)\n"
    "    if found is None:\n"
    "        raise SystemExit('the wrapper shell is not among this program\\'s ancestors')\n"
    "    return found\n"
    "def busy_children(pid):\n"
    "    out = []\n"
    "    for name in os.listdir('/proc'):\n"
    "        try:\n"
    "            with open(f'/proc/{name}/stat') as fh:\n"
    "                rest = fh.read().rsplit(')', 1)[1].split()\n"
    "        except (OSError, ValueError):\n"
    "            continue\n"
    "        if int(rest[1]) == pid and rest[0] != 'Z':\n"
    "            out.append(name)\n"
    "    return out\n"
    "shell = wrapper()\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    while not os.path.exists(target):\n"  # the archiving pipeline has opened it
    "        time.sleep(0.001)\n"
    "    os.kill(shell, signal.SIGSTOP)\n"
    "    try:\n"
    "        while busy_children(shell):\n"  # the archive is written once its subshell is gone
    "            time.sleep(0.001)\n"
    "        with open(target + '.swap', 'wb') as fh:\n"
    "            fh.write(blob)\n"
    "        os.replace(target + '.swap', target)\n"
    "    finally:\n"
    "        os.kill(shell, signal.SIGCONT)\n"
    "    os._exit(0)\n"
    "print('armed')\n"
)

TRAVERSAL_ARCHIVE = (
    "def ARCHIVE():\n"
    "    buf = io.BytesIO()\n"
    "    with tarfile.open(fileobj=buf, mode='w:gz') as tar:\n"
    "        for name, data in (('/etc/evil', b'abs'), ('../../escape', b'up'), ('a/../../b', b'x'),\n"
    "                           ('./ok.txt', b'fine'), ('sub/../inner.txt', b'dots')):\n"
    "            info = tarfile.TarInfo(name)\n"
    "            info.size = len(data)\n"
    "            tar.addfile(info, io.BytesIO(data))\n"
    "        link = tarfile.TarInfo('ln')\n"
    "        link.type = tarfile.SYMTYPE\n"
    "        link.linkname = '/etc/passwd'\n"
    "        tar.addfile(link)\n"
    "    return buf.getvalue()\n"
)

GZIP_BOMB = (
    "def ARCHIVE():\n"
    "    import zlib\n"
    "    size = 512 * 1024 * 1024\n"
    "    info = tarfile.TarInfo('bomb.bin')\n"
    "    info.size = size\n"
    "    header = info.tobuf(format=tarfile.GNU_FORMAT)\n"
    "    gz = zlib.compressobj(9, zlib.DEFLATED, 31)\n"
    "    parts = [gz.compress(header)]\n"
    "    zero = bytes(1 << 20)\n"
    "    for _ in range(size >> 20):\n"
    "        parts.append(gz.compress(zero))\n"
    "    parts.append(gz.flush())\n"
    "    return b''.join(parts)\n"
)


def test_archive_with_absolute_and_dotdot_paths_is_sanitised(env: Any) -> None:
    code = "import io, tarfile\n" + TRAVERSAL_ARCHIVE + SWAP_ARCHIVE
    out = driver.component(code, component_id="CreateOSSandbox-tar", collect=True, timeout=20)
    assert out.exc is None, out.exc
    files = _files(out)
    assert "ok.txt" in files, (files.keys(), out.details.get("artifacts_message"))  # the swap took effect
    assert not any(p.startswith("/") or ".." in p.split("/") for p in files), files.keys()
    assert "ln" not in files and "escape" not in files and "b" not in files
    message = out.details["artifacts_message"]  # skipped, and said so (truncated is for limits)
    assert "Skipped 4 entries with an absolute or '..' path" in message, message
    assert "not regular files" in message, message


def test_gzip_bomb_costs_at_most_the_reader_bound(env: Any) -> None:
    code = "import io, tarfile\n" + GZIP_BOMB + SWAP_ARCHIVE
    with PeakRss() as rss:
        out = driver.component(code, component_id="CreateOSSandbox-bomb", collect=True, timeout=60)
    assert out.exc is None, out.exc
    assert out.details["artifacts_truncated"] is True, out.value
    assert "bomb.bin" not in _files(out)
    assert rss.growth < 64, f"RSS grew {rss.growth:.0f} MiB inflating a 512 MiB gzip bomb"
    assert out.elapsed < 90


# --- the key never reaches a guest ---------------------------------------------------------------

WINDOW = API_KEY[14:40]  # a random part of the key: present wherever the key would be
SCAN = (
    "import json, os\n"
    f"needle = {WINDOW[::-1]!r}[::-1].encode()\n"  # the program text never holds the needle
    "hits = []\nprocs = files = 0\n"
    "for pid in os.listdir('/proc'):\n"
    "    if not pid.isdigit():\n        continue\n"
    "    procs += 1\n"
    "    for name in ('environ', 'cmdline'):\n"
    "        try:\n"
    "            with open(f'/proc/{pid}/{name}', 'rb') as fh:\n"
    "                if needle in fh.read():\n                    hits.append(f'/proc/{pid}/{name}')\n"
    "        except OSError:\n            pass\n"
    "for top in ('/workspace', '/tmp', '/dev/shm', '/var/tmp', '/run', '/etc'):\n"
    "    for root, _dirs, names in os.walk(top):\n"
    "        for name in names:\n"
    "            path = os.path.join(root, name)\n"
    "            try:\n"
    "                if os.path.islink(path) or not os.path.isfile(path) or os.path.getsize(path) > 50_000_000:\n"
    "                    continue\n"
    "                files += 1\n"
    "                with open(path, 'rb') as fh:\n"
    "                    if needle in fh.read():\n                        hits.append(path)\n"
    "            except OSError:\n                pass\n"
    "env_names = sorted(k for k in os.environ if 'API_KEY' in k or k.startswith('CREATEOS_SANDBOX_B'))\n"
    "print(json.dumps({'hits': hits, 'procs': procs, 'files': files, 'env_names': env_names}))\n"
)


def _scan_report(text: str) -> dict[str, Any]:
    report = json.loads(text.strip().splitlines()[-1])
    assert report["procs"] >= 1 and report["files"] >= 1, report  # the scan really looked
    return report


@pytest.mark.parametrize("surface", ["backend", "component", "component-reuse"])
def test_api_key_never_reaches_the_guest(surface: str, env: Any) -> None:
    assert WINDOW not in SCAN
    if surface == "backend":
        out = driver.backend(SCAN)
    else:
        out = driver.component(
            SCAN,
            component_id=f"CreateOSSandbox-scan-{surface}",
            reuse=surface == "component-reuse",
            collect=surface == "component-reuse",
            timeout=60,
        )
    assert out.exc is None, out.exc
    report = _scan_report(out.stdout)
    assert report["hits"] == [] and report["env_names"] == [], report


def test_api_key_never_reaches_the_executor_guest(env: Any) -> None:
    from lfx.components.input_output import ChatInput, ChatOutput
    from lfx.graph import Graph

    from .flow_components.key_scanner import KeyScanner

    def graph() -> Any:
        chat_in = ChatInput(_id="chat-in")
        scanner = KeyScanner(_id="scanner")
        scanner.set(input_value=chat_in.message_response)
        chat_out = ChatOutput(_id="chat-out")
        chat_out.set(input_value=scanner.scan)
        return Graph(chat_in, chat_out)

    out = driver.executor(WINDOW[::-1], graph_factory=graph)
    assert out.exc is None, out.exc
    report = _scan_report(out.stdout)
    assert report["hits"] == [] and report["env_names"] == [], report


def test_the_key_is_where_it_must_be_and_nowhere_else(env: Any) -> None:
    """Sanity of the oracle: the needle is a real part of the key the client sends."""
    assert WINDOW in API_KEY and len(WINDOW) >= 20
    assert connection.endpoints.get().key_source == "CREATEOS_SANDBOX_API_KEY"
