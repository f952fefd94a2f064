"""Guest processes: every exec runs ``cmd`` + ``args`` inside bubblewrap namespaces.

Each exec gets fresh user, PID, mount, UTS, IPC and (unless egress is allow-all) network
namespaces. The guest sees the rootfs read-only at ``/``, its sandbox's private
``workspace/`` and ``tmp/`` at ``/workspace`` and ``/tmp``, and an empty tmpfs over the
server's state directory, so it can reach neither other guests nor server state. When the
exec's main process exits, bwrap's PID-1 reaper exits and the kernel kills whatever the
command left running: nothing outlives an exec (documented difference from a microVM).

The launcher is a tiny ``/bin/sh`` script that joins the sandbox's cgroups (or sets
``ulimit -v`` when cgroups are not writable) and then ``exec``s bwrap, so every guest
process is accounted from its first instruction.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .cgroups import SandboxCgroups

CHUNK_BYTES = 64 * 1024
# RLIMIT_AS counts address space, not memory: CPython and its threads reserve far more than
# they touch, so the fallback limit never goes below this floor (documented).
RLIMIT_FLOOR_MIB = 1024
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
GUEST_MOUNTS = ("/workspace", "/tmp")

LAUNCHER = (
    'for f in $CREATEOS_LOCAL_CGROUPS; do echo $$ > "$f" || exit 125; done; '
    'if [ -n "$CREATEOS_LOCAL_AS_KB" ]; then ulimit -v "$CREATEOS_LOCAL_AS_KB" || exit 125; fi; '
    "unset CREATEOS_LOCAL_CGROUPS CREATEOS_LOCAL_AS_KB; "
    'exec "$@"'
)


def egress_allows_all(egress: list[str] | None) -> bool:
    return not egress or egress == ["*"]


def isolation_probe(bwrap: str | None) -> str | None:
    """Return None when bwrap can build the namespaces we need, else the reason it cannot."""
    if bwrap is None:
        return "bubblewrap (bwrap) is not installed; apt-get install bubblewrap"
    argv = [bwrap, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "--proc", "/proc"]
    argv += ["--dev", "/dev", "--", "/bin/true"]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap failed to start: {exc}"
    if done.returncode != 0:
        return f"bwrap cannot create namespaces here: {done.stderr.decode(errors='replace').strip()}"
    return None


@dataclass
class GuestLayout:
    """Where one sandbox lives on the host."""

    root: Path  # <state>/sandboxes/<id>

    @property
    def workspace(self) -> Path:
        return self.root / "workspace"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    def create(self) -> None:
        self.workspace.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(exist_ok=True)
        self.tmp.chmod(0o1777)

    def mount_for(self, guest_path: str) -> tuple[Path, str] | None:
        """Split a normalised absolute guest path into (host mount dir, path relative to it)."""
        for mount in GUEST_MOUNTS:
            if guest_path == mount or guest_path.startswith(mount + "/"):
                host = self.workspace if mount == "/workspace" else self.tmp
                return host, guest_path[len(mount) :].lstrip("/")
        return None


@dataclass
class ExecRequest:
    sandbox_id: str
    hostname: str
    layout: GuestLayout
    rootfs: Path
    egress: list[str] | None
    env: dict[str, str]
    cmd: str
    args: list[str]
    cgroups: SandboxCgroups
    mem_mib: int


class GuestStartError(Exception):
    """The command could not be started; reported as ``result.error`` with exit code 0."""


class GuestRunner:
    def __init__(self, state_dir: Path, isolation: bool, memory_mode: str | bool) -> None:
        self.state_dir = state_dir.resolve()
        self.isolation = isolation
        self.memory_mode = memory_mode
        self.bwrap = shutil.which("bwrap")
        self.python_bin = os.path.dirname(sys.executable)
        self._procs: set[GuestProcess] = set()
        self._root_cache: dict[Path, list[str]] = {}

    @property
    def live_processes(self) -> int:
        return sum(1 for p in self._procs if p.running)

    def guest_path_env(self, rootfs: Path) -> str:
        return f"{self.python_bin}:{SYSTEM_PATH}" if rootfs == Path("/") else SYSTEM_PATH

    # -- command resolution -------------------------------------------------------------
    def _host_view(self, req: ExecRequest, guest_path: str) -> Path:
        mounted = req.layout.mount_for(guest_path)
        if mounted is not None:
            return mounted[0] / mounted[1]
        if not self.isolation:
            return Path(guest_path)
        return req.rootfs / guest_path.lstrip("/")

    def _executable(self, host_path: Path) -> bool:
        if host_path.is_symlink():  # may point inside the rootfs; let execve decide
            return True
        return host_path.is_file() and os.access(host_path, os.X_OK)

    def check_command(self, req: ExecRequest, path_env: str) -> None:
        cmd = req.cmd
        if "/" in cmd:
            guest = posixpath.normpath(cmd if cmd.startswith("/") else posixpath.join("/workspace", cmd))
            if self.isolation and self._hidden(guest):
                raise GuestStartError(f"fork/exec {cmd}: no such file or directory")
            if not self._executable(self._host_view(req, guest)):
                raise GuestStartError(f"fork/exec {cmd}: no such file or directory")
            return
        for directory in path_env.split(":"):
            if directory and self._executable(self._host_view(req, posixpath.join(directory, cmd))):
                return
        raise GuestStartError(f'exec: "{cmd}": executable file not found in $PATH')

    def _hidden(self, guest_path: str) -> bool:
        state = str(self.state_dir)
        return guest_path == state or guest_path.startswith(state + "/")

    # -- argv ---------------------------------------------------------------------------
    def _bwrap_argv(self, req: ExecRequest, env: dict[str, str]) -> list[str]:
        assert self.bwrap is not None
        argv = [self.bwrap, "--unshare-all"]
        if egress_allows_all(req.egress):
            argv.append("--share-net")
        # no --new-session: the launcher already runs in a session without a terminal, and
        # keeping one process group lets SIGSTOP/SIGKILL of the group reach the command
        argv += ["--die-with-parent", "--hostname", req.hostname]
        argv += self._root_binds(req.rootfs)
        if req.rootfs == Path("/"):
            argv += self._host_root_extras()
        argv += ["--proc", "/proc", "--dev", "/dev"]
        argv += ["--bind", str(req.layout.workspace), "/workspace", "--bind", str(req.layout.tmp), "/tmp"]
        if req.rootfs == Path("/"):
            # the interpreter must stay reachable even when it lives under a path we mount over
            for prefix in sorted({sys.prefix, sys.base_prefix}):
                if any(prefix == m or prefix.startswith(m + "/") for m in GUEST_MOUNTS):
                    argv += ["--ro-bind", prefix, prefix]
        argv += ["--chdir", "/workspace", "--clearenv"]
        for key, value in env.items():
            argv += ["--setenv", key, value]
        return [*argv, "--", req.cmd, *req.args]

    def _root_binds(self, rootfs: Path) -> list[str]:
        """The rootfs's top-level entries, read-only, on bwrap's tmpfs root (so that
        /workspace and /tmp can be created as mount points)."""
        cached = self._root_cache.get(rootfs)
        if cached is not None:
            return cached
        argv: list[str] = []
        for entry in sorted(os.scandir(rootfs), key=lambda e: e.name):
            guest = "/" + entry.name
            if guest in (*GUEST_MOUNTS, "/proc", "/dev"):
                continue
            if entry.is_symlink():
                argv += ["--symlink", os.readlink(entry.path), guest]
            else:
                argv += ["--ro-bind", entry.path, guest]
        self._root_cache[rootfs] = argv
        return argv

    def _host_root_extras(self) -> list[str]:
        """Hide the server's state dir (and so every other guest) from a guest that sees the host /."""
        state = str(self.state_dir)
        if any(state == m or state.startswith(m + "/") for m in GUEST_MOUNTS):
            return []  # already shadowed by the guest's own /workspace or /tmp
        return ["--tmpfs", state]

    async def start(self, req: ExecRequest, stdin: bytes | None) -> GuestProcess:
        path_env = req.env.get("PATH") or self.guest_path_env(req.rootfs)
        env = {"PATH": path_env, **req.env}
        self.check_command(req, path_env)
        launcher_env = {
            "PATH": SYSTEM_PATH,
            "CREATEOS_LOCAL_CGROUPS": " ".join(req.cgroups.procs_files()),
        }
        if self.memory_mode == "rlimit":
            launcher_env["CREATEOS_LOCAL_AS_KB"] = str(max(req.mem_mib, RLIMIT_FLOOR_MIB) * 1024)
        if self.isolation:
            argv = self._bwrap_argv(req, env)
            cwd = "/"
        else:
            argv = [req.cmd, *req.args]
            launcher_env = {**env, "HOME": str(req.layout.workspace), **launcher_env, "PATH": path_env}
            cwd = str(req.layout.workspace)
        try:
            proc = await asyncio.create_subprocess_exec(
                "/bin/sh",
                "-c",
                LAUNCHER,
                "createos-guest",
                *argv,
                stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=launcher_env,
                cwd=cwd,
                start_new_session=True,
                limit=CHUNK_BYTES,
            )
        except OSError as exc:
            raise GuestStartError(f"fork/exec {req.cmd}: {exc.strerror or exc}") from exc
        guest = GuestProcess(proc, self.isolation, req.cgroups, self._procs)
        guest.begin(stdin)
        return guest

    def kill_all(self) -> None:
        for proc in list(self._procs):
            proc.kill()


class GuestProcess:
    """A running exec: its output arrives as (stream name, bytes) chunks through a small queue,
    so a guest printing gigabytes is throttled by the reader instead of buffered here."""

    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        isolation: bool,
        cgroups: SandboxCgroups,
        registry: set[GuestProcess],
    ) -> None:
        self.proc = proc
        self.isolation = isolation
        self.cgroups = cgroups
        self._registry = registry
        self._queue: asyncio.Queue[tuple[str, bytes | None]] = asyncio.Queue(maxsize=4)
        self._open_streams = 2
        self._tasks: list[asyncio.Task[None]] = []
        registry.add(self)

    @property
    def running(self) -> bool:
        return self.proc.returncode is None

    def begin(self, stdin: bytes | None) -> None:
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._tasks = [
            asyncio.create_task(self._pump("stdout", self.proc.stdout)),
            asyncio.create_task(self._pump("stderr", self.proc.stderr)),
            asyncio.create_task(self._reap()),
        ]
        if stdin is not None:
            self._tasks.append(asyncio.create_task(self._feed(stdin)))

    async def _pump(self, name: str, stream: asyncio.StreamReader) -> None:
        try:
            while chunk := await stream.read(CHUNK_BYTES):
                await self._queue.put((name, chunk))
        except (OSError, ValueError):
            pass
        finally:
            await self._queue.put((name, None))

    async def _feed(self, data: bytes) -> None:
        stdin = self.proc.stdin
        assert stdin is not None
        with contextlib.suppress(OSError, ConnectionError):
            stdin.write(data)
            await stdin.drain()
        with contextlib.suppress(OSError, ConnectionError):
            stdin.close()

    async def _reap(self) -> None:
        await self.proc.wait()
        if not self.isolation:
            # background children of an unisolated guest would hold the pipes open forever
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    async def next_chunk(self) -> tuple[str, bytes] | None:
        """The next output chunk, or None once both pipes are closed."""
        while self._open_streams:
            name, chunk = await self._queue.get()
            if chunk is None:
                self._open_streams -= 1
                continue
            return name, chunk
        return None

    async def wait(self) -> int:
        code = await self.proc.wait()
        self._registry.discard(self)
        return 128 - code if code < 0 else code

    def kill(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self._registry.discard(self)

    async def close(self) -> None:
        """Kill the command (if still running) and release the pipes."""
        self.kill()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.proc.wait(), 5)
        for task in self._tasks:
            task.cancel()
        self._registry.discard(self)
