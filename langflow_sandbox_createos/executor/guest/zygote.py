"""A warm runner that serves many runs of one trust domain (`CREATEOS_EXECUTOR_REUSE`).

Started once per reused guest by an exec whose stdin carries the runner and `zygote` (where
to listen, how long to stay idle): it imports lfx and everything a run imports, listens on a
Unix socket in a directory only it can enter, reports `zygote` (ready, lfx's version) on its
frame channel, and leaves the exec (a daemon of its own session) so the exec returns.

Each run is then one exec of `CONNECTOR`, whose stdin carries that run's boot document (its
frame secret and spec) exactly as a cold run's does: the connector hands the zygote its own
stdin, stdout and stderr (SCM_RIGHTS) and waits; the zygote forks a child, which takes those
descriptors as its own and runs `_cold` as a cold runner would, and reports the child's exit
status back, which the connector exits with. So each run has its own exec stream, frames,
stderr, secret, watchdog and exit status, and pays neither a boot nor lfx's import. A run
whose connector goes away (its exec was closed: the run was cancelled or timed out on the
host) has its process group killed. Nothing of one run's secret or spec passes through the
zygote. A boot document with `wait` instead of a spec forks a standby: the child waits for its
spec file in a directory of its own (`main._pooled`, as a pooled runner does), so the host
starts the next run's process before that run arrives.

A run that ended well tells the zygote, on a pipe of its own, which modules it imported that
the zygote had not (`main._tell_learned`): the imports its components make only on first use
(the OpenAI model's client, 0.8 s of CPU). The zygote imports them (names only, from the
image's own library directories), so the runs forked after it start with them loaded, as an
in-process server's runs after its first do.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import re
import select
import signal
import socket
import struct
import sys
import sysconfig
import time
from typing import Any

from langflow_sandbox_createos.executor.guest.install import _ensure_lfx, _lfx_version
from langflow_sandbox_createos.executor.guest.main import (
    _LEARNING,
    LEARN_MAX_BYTES,
    _cold,
    _pooled,
    _preload,
    _start,
)
from langflow_sandbox_createos.executor.guest.sandbox_bridge import _SANDBOX_SEAMS

ZYGOTE_SOCKET = "/tmp/.createos-zygote/runner.sock"  # in a directory only the warm runner enters
ZYGOTE_MAX_RUNS = 64  # runs of one guest at once (the host bounds them lower)
ZYGOTE_TICK_SECONDS = 0.05  # how often the loop looks for children that ended
LEARN_MAX_MODULES = 4000  # names the zygote takes from one run
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")

# One run: `python3 *CONNECTOR_ARGV` with the run's boot document on stdin. -I -S: no site
# import, no environment, no user paths (the connector needs the standard library only, and
# its interpreter starts in about half the time).
CONNECTOR = (
    "import os,socket,struct,sys\n"
    "s=socket.socket(socket.AF_UNIX,socket.SOCK_STREAM)\n"
    "try:\n s.connect(sys.argv[1])\n"
    "except OSError:\n sys.stderr.write('createos-executor: no warm runner in this guest\\n');os._exit(75)\n"
    "socket.send_fds(s,[b'r'],[0,1,2])\n"
    "d=b''\n"
    "while len(d)<4:\n c=s.recv(4-len(d))\n if not c:\n  os._exit(70)\n d+=c\n"
    "os._exit(struct.unpack('!i',d)[0])\n"
)
# The host ends a run still going in a reused guest: `python3 -c KILL_RUN <pid> <start time>`
# kills that process's group if the process is still the run that said hello (its start time,
# /proc/<pid>/stat's 22nd field), never a later process that got the pid. Exit 0: ended or
# already gone; anything else: not known to be ended (the host then deletes the guest).
KILL_RUN = (
    "import os,signal,sys\n"
    "pid,start=int(sys.argv[1]),sys.argv[2]\n"
    "try:\n f=open('/proc/%d/stat'%pid).read().rsplit(')',1)[1].split()\n"
    "except OSError:\n os._exit(0)\n"
    "if f[19]!=start:\n os._exit(0)\n"
    "try:\n os.killpg(pid,signal.SIGKILL)\n"
    "except ProcessLookupError:\n pass\n"
    "os._exit(0)\n"
)
CONNECTOR_ARGV = ("-I", "-S", "-c", CONNECTOR, ZYGOTE_SOCKET)
EXIT_NO_ZYGOTE = 75  # the connector found no zygote: nothing of the run ran
EXIT_ZYGOTE_LOST = 70  # the zygote went away while the run was in it


def zygote_main(boot: dict[str, Any]) -> None:
    """The start exec: make the warm runner, report it ready, leave it running, exit."""
    key = bytes.fromhex(boot.pop("token"))
    wait = boot.pop("zygote")
    frames = _start(key)
    del key
    _ensure_lfx(frames)
    path = str(wait["socket"])
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    _preload(wait.get("warm_flow"))  # the domain's flow, built once: its imports for every run
    _SANDBOX_SEAMS.point()
    if os.path.exists(path):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(ZYGOTE_MAX_RUNS)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:  # the exec's own process: report and leave
        frames.emit("zygote", lfx=_lfx_version(), pid=pid, socket=path)
        os._exit(0)
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.closerange(3, listener.fileno())
    os.closerange(listener.fileno() + 1, 1 << 16)
    _serve(listener, float(wait.get("idle_seconds", 3600)))


class _Child:
    def __init__(self, pid: int, conn: socket.socket, learned: int) -> None:
        self.pid = pid
        self.conn = conn
        self.learned = learned  # the read end of the pipe the run names its new modules on


def _serve(listener: socket.socket, idle_seconds: float) -> None:
    """Forks one child per connection; reports each child's exit status to its connection;
    kills a child whose connection closed first; exits once idle for `idle_seconds`."""
    children: dict[int, _Child] = {}  # by the connection's descriptor
    last = time.monotonic()
    while True:
        watched = [listener, *(c.conn for c in children.values())]
        ready, _, _ = select.select(watched, [], [], ZYGOTE_TICK_SECONDS)
        _reap(children)  # first: what a run that ended learned is loaded before the next fork
        for sock in ready:
            if sock is listener:
                _accept(listener, children)
            elif sock.fileno() in children:  # (a child reaped just now has closed its own)
                _hung_up(children.pop(sock.fileno()))
        if children:
            last = time.monotonic()
        elif time.monotonic() - last > idle_seconds:
            os._exit(0)


def _accept(listener: socket.socket, children: dict[int, _Child]) -> None:
    conn, _ = listener.accept()
    try:
        _, fds, _, _ = socket.recv_fds(conn, 1, 3)
    except OSError:
        conn.close()
        return
    if len(fds) != 3 or len(children) >= ZYGOTE_MAX_RUNS:
        for fd in fds:
            os.close(fd)
        conn.close()
        return
    learned, tell = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(learned)
        _LEARNING.update(fd=tell, known=frozenset(sys.modules))
        _child(listener, conn, fds, children)
    os.close(tell)
    os.set_blocking(learned, False)
    for fd in fds:
        os.close(fd)
    children[conn.fileno()] = _Child(pid, conn, learned)


def _child(listener: socket.socket, conn: socket.socket, fds: list[int], children: dict[int, _Child]) -> None:
    """The run: the connector's descriptors as its own, then a cold run's path."""
    try:
        os.setpgid(0, 0)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            os.close(fd)
        listener.close()
        conn.close()
        for other in children.values():
            other.conn.close()
            os.close(other.learned)
        sys.stdout = os.fdopen(1, "w", closefd=False)
        sys.stderr = os.fdopen(2, "w", closefd=False)
        with os.fdopen(0, "rb", closefd=False) as stdin:
            boot = json.loads(stdin.read())
        if "wait" in boot:  # a standby: forked ahead of its run, it waits for the run's spec
            _pooled(boot, boot.pop("wait"))
        else:
            _cold(boot)
    except BaseException as exc:  # the run could not start: say so on its own stderr
        os.write(2, f"createos-executor: the warm runner's run failed to start: {exc!r}\n".encode())
    os._exit(1)


def _hung_up(child: _Child) -> None:
    """The run's connector went away first (the host closed its exec): end the run."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(child.pid, 0)
    child.conn.close()
    os.close(child.learned)


def _reap(children: dict[int, _Child]) -> None:
    """Children that ended: their exit status to their connector (128 + signal if killed)."""
    for key, child in list(children.items()):
        try:
            pid, status = os.waitpid(child.pid, os.WNOHANG)
        except ChildProcessError:
            pid, status = child.pid, 1 << 8
        if pid == 0:
            continue
        code = os.waitstatus_to_exitcode(status)
        code = 128 - code if code < 0 else code
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)  # what the run left running ends with it
        with contextlib.suppress(OSError):
            child.conn.sendall(struct.pack("!i", code))
        child.conn.close()
        del children[key]
        told = b""
        with contextlib.suppress(OSError):
            told = os.read(child.learned, LEARN_MAX_BYTES)
        os.close(child.learned)
        if code == 0 and told:
            _learn(told)


def _learn(told: bytes) -> None:
    """Import the modules a run that ended well imported and this runner lacks, in the order
    the run imported them: names only, each from the image's own library directories (the
    standard library and site-packages this interpreter started with). Failures are ignored."""
    paths = sysconfig.get_paths()
    roots = tuple(
        os.path.realpath(paths[key]) + os.sep
        for key in ("stdlib", "platstdlib", "purelib", "platlib")
        if paths.get(key)
    )
    judged: dict[str, bool] = {}  # by top-level package: a run names many modules of one
    for name in told.decode("ascii", "ignore").split("\n")[:LEARN_MAX_MODULES]:
        if name in sys.modules or not _MODULE_NAME.fullmatch(name):
            continue
        top = name.partition(".")[0]
        if top not in judged:
            judged[top] = _from_the_image(top, roots)
        if judged[top]:
            with contextlib.suppress(BaseException):  # a module that fails to import is not needed here
                importlib.import_module(name)


def _from_the_image(top: str, roots: tuple[str, ...]) -> bool:
    """Whether the top-level package `top` is the image's: a built-in module, or one found
    under one of `roots` (never a file a run left elsewhere, in /tmp or its working directory)."""
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    if spec.origin in ("built-in", "frozen"):
        return True
    places = [spec.origin] if spec.origin else list(spec.submodule_search_locations or [])
    return bool(places) and all(os.path.realpath(place).startswith(roots) for place in places)
