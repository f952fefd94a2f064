"""The jailer: starts guest processes and confines them (namespaces, cgroups, seccomp, bwrap).

Every exec runs ``cmd`` + ``args`` inside bubblewrap namespaces. A guest's root is its own
(``GuestLayout``: an overlay of its image on a tmpfs disk, mounted by the server in its private
mount namespace), and so are its user namespace (``identity``: made at create, mapping its root
to a host uid of its own) and its network (``network.GuestNetwork``: a namespace the server
makes, with a NAT and egress rules of its own). The first exec starts the guest's PID 1 (bwrap's
reaper, whose child sleeps); every exec joins its user, PID and network namespaces, so what it
leaves running in the background lives on until pause freezes it or delete kills PID 1 and with
it the namespace. Each exec gets its own mount, UTS and IPC namespaces. Commands run as root
(uid 0) in the guest's user namespace, as on a VM, with a small set of capabilities that reach
nothing outside it; outside, that root is the guest's unprivileged host uid: ``setpriv`` drops
the server's root before bwrap joins the namespace. Every guest process runs under the seccomp
filter of ``seccomp`` and cannot make user namespaces.

The launcher is a tiny ``/bin/sh`` script that joins the sandbox's cgroups (or sets
``ulimit -v`` when cgroups are not writable) and then ``exec``s nsenter (into the guest's
network), setpriv and bwrap, so every guest process is accounted from its first instruction.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import json
import os
import posixpath
import shutil
import signal
import struct
import subprocess
import termios
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import identity, mounts, network, pids
from .cgroups import SandboxCgroups
from .helpers import SYSTEM_PATH, helper_env, tool
from .images import Image
from .network import GuestNetwork
from .seccomp import SeccompUnavailable, compile_filter

CHUNK_BYTES = 64 * 1024
# RLIMIT_AS counts address space, not memory: CPython and its threads reserve far more than
# they touch, so the fallback limit never goes below this floor (documented).
RLIMIT_FLOOR_MIB = 1024
# What root in the guest may do, inside its own user namespace only (where only uid 0 is
# mapped): own and change its own files, signal its own processes. Docker's default set, less
# what means nothing here (raw sockets and low ports belong to the network namespace, which the
# host owns: low ports are opened to every guest user instead) or what the seccomp filter
# refuses anyway (chroot, mknod).
GUEST_CAPABILITIES = (
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_SETFCAP",
)

LAUNCHER = (
    'for f in $CREATEOS_LOCAL_CGROUPS; do echo $$ > "$f" || exit 125; done; '
    'if [ -n "$CREATEOS_LOCAL_AS_KB" ]; then ulimit -v "$CREATEOS_LOCAL_AS_KB" || exit 125; fi; '
    "unset CREATEOS_LOCAL_CGROUPS CREATEOS_LOCAL_AS_KB PWD OLDPWD; "
    'exec "$@"'
)


def isolation_probe(bwrap: str | None, guest_uid: int) -> str | None:
    """Return None when guests can be built here (root for the per-guest mounts, a user
    namespace made for ``guest_uid`` that bwrap, run as that uid, can join and make every other
    namespace in), else the reason they cannot."""
    if bwrap is None:
        return "bubblewrap (bwrap) is not installed; apt-get install bubblewrap"
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return "setpriv is not installed; apt-get install util-linux"
    if os.geteuid() != 0:
        return "guest roots are overlay and tmpfs mounts, which need root"
    missing = network.missing_tools()
    if missing:
        return f"every guest gets a network of its own, which needs: apt-get install {' '.join(missing)}"
    try:
        compile_filter()
    except SeccompUnavailable as exc:
        return str(exc)
    try:
        userns = identity.make_namespace(guest_uid)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"no user namespace can be made for the guests' host uid {guest_uid}: {exc}"
    argv = [setpriv, f"--reuid={guest_uid}", f"--regid={guest_uid}", "--clear-groups", "--", bwrap]
    argv += ["--userns", str(userns), "--assert-userns-disabled", "--unshare-pid", "--unshare-ipc"]
    argv += ["--unshare-uts", "--unshare-net", "--die-with-parent", "--ro-bind", "/", "/"]
    argv += ["--proc", "/proc", "--dev", "/dev", "--", "/bin/true"]
    try:
        done = subprocess.run(
            argv, capture_output=True, timeout=20, check=False, env=helper_env(), pass_fds=(userns,)
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap failed to start: {exc}"
    finally:
        os.close(userns)
    if done.returncode != 0:
        return f"bwrap cannot create namespaces here: {done.stderr.decode(errors='replace').strip()}"
    return None


def _capability_args() -> list[str]:
    return [arg for cap in GUEST_CAPABILITIES for arg in ("--cap-add", cap)]


def _pipe_with(data: bytes) -> int:
    """A pipe's read end holding ``data`` (bwrap reads its arguments and filter from pipes)."""
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, data)  # far below a pipe's buffer
    finally:
        os.close(write_end)
    return read_end


@dataclass
class GuestLayout:
    """Where one sandbox lives on the host: ``disk/`` (a tmpfs of ``disk_mib``, the guest's
    disk) holds the overlay's upper layers, ``fs/`` is the guest's root (the overlay of the
    image's layers and ``disk/``), ``layers/`` the image layers createos-local built, each
    mounted idmapped through the guest's user namespace (so its root owns them). Without
    isolation ``fs/`` is a plain directory."""

    root: Path  # <state>/sandboxes/<id>
    host_uid: int = -1  # the guest's root on the host (identity.GuestIds); -1 without isolation
    userns: int = -1  # the guest's user namespace (identity.make_namespace), open from create on
    mounted: list[Path] = field(default_factory=list)
    init: GuestInit | None = None  # the guest's long-lived PID 1 (started at the first exec)
    init_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    network: GuestNetwork | None = None  # made with PID 1, kept until delete

    @property
    def netns(self) -> Path:
        return self.root / "netns"

    @property
    def disk(self) -> Path:
        return self.root / "disk"

    @property
    def fs(self) -> Path:
        return self.root / "fs"

    @property
    def workspace(self) -> Path:
        return self.fs / "workspace"

    def create(
        self, image: Image, disk_mib: int, isolation: bool, copy_from: GuestLayout | None, idmap: bool = True
    ) -> None:
        """Make the guest's user namespace and mount its disk and root (its upper layers copied
        from ``copy_from``, a paused sandbox, for a fork; the image's built layers idmapped
        unless ``idmap`` is off, when every guest shares one uid that owns them). Blocking: run
        it off the event loop."""
        self.disk.mkdir(parents=True)
        self.fs.mkdir()
        if not isolation:
            if copy_from is not None:
                shutil.copytree(copy_from.fs, self.fs, symlinks=True, dirs_exist_ok=True)
            for name in ("workspace", "tmp"):
                (self.fs / name).mkdir(exist_ok=True)
            (self.fs / "tmp").chmod(0o1777)
            return
        try:
            self.userns = identity.make_namespace(self.host_uid)
            self._mount(image, disk_mib, copy_from, idmap)
        except BaseException:
            self.remove()
            raise

    def _mount(self, image: Image, disk_mib: int, copy_from: GuestLayout | None, idmap: bool) -> None:
        mounts.mount(
            "tmpfs", self.disk, "tmpfs", mounts.MS_NOSUID | mounts.MS_NODEV, f"size={disk_mib}m,mode=0700"
        )
        self.mounted.append(self.disk)
        layers = [("upper", "work", self.fs, image.lowers)]
        if image.usr_lowers:
            layers.append(("usr-upper", "usr-work", self.fs / "usr", image.usr_lowers))
        for upper, work, _, _ in layers:
            if copy_from is not None:
                # cp -a keeps the overlay's whiteouts (0/0 devices) and trusted.* xattrs
                subprocess.run(
                    [
                        tool("cp"),
                        "-a",
                        "--sparse=always",
                        str(copy_from.disk / upper),
                        str(self.disk / upper),
                    ],
                    check=True,
                    capture_output=True,
                    env=helper_env(),
                )
                if copy_from.host_uid != self.host_uid:  # what the source's root made is this root's
                    identity.chown_tree(self.disk / upper, copy_from.host_uid, self.host_uid)
            (self.disk / upper).mkdir(exist_ok=True)
            (self.disk / work).mkdir()
        for upper, work, target, lowers in layers:
            lowerdir = ":".join(str(self._shown(p, image, idmap)) for p in lowers)
            options = f"lowerdir={lowerdir},upperdir={self.disk / upper},workdir={self.disk / work}"
            mounts.mount("overlay", target, "overlay", mounts.MS_NOSUID | mounts.MS_NODEV, options)
            self.mounted.append(target)
        for host, guest in image.binds:
            target = self.fs / guest.lstrip("/")
            mounts.mount(host, target, None, mounts.MS_BIND | mounts.MS_REC)
            self.mounted.append(target)
            flags = mounts.MS_REMOUNT | mounts.MS_BIND | mounts.MS_RDONLY | mounts.MS_NOSUID | mounts.MS_NODEV
            mounts.mount(None, target, None, flags)

    def _shown(self, layer: Path, image: Image, idmap: bool) -> Path:
        """``layer`` as the guest's overlay stacks it: a layer createos-local built (root's on
        disk) through an idmapped mount of the guest's namespace, so its root owns it; any
        other (the host's ``/usr``, a ``--rootfs`` directory) as it is."""
        if not idmap or layer not in image.built:
            return layer
        target = self.root / "layers" / str(len(self.mounted))
        target.mkdir(parents=True)
        mounts.mount_idmapped(layer, target, self.userns)
        self.mounted.append(target)
        return target

    def resize(self, disk_mib: int) -> None:
        if self.disk in self.mounted:
            mounts.mount(
                None,
                self.disk,
                None,
                mounts.MS_REMOUNT | mounts.MS_NOSUID | mounts.MS_NODEV,
                f"size={disk_mib}m",
            )

    def kill_init(self) -> None:
        """End the guest's PID 1 (the kernel then kills every process of its PID namespace)
        and its NAT: the guest is being deleted."""
        if self.init is not None:
            self.init.kill()
            self.init = None
        if self.network is not None:
            self.network.close()

    def remove(self) -> None:
        """Unmount (innermost first, the network namespace's file included) and delete
        everything. Blocking."""
        failed = False
        for target in reversed(self.mounted):
            try:
                mounts.umount(target)
            except OSError:
                failed = True
        self.mounted.clear()
        if self.userns >= 0:
            os.close(self.userns)
            self.userns = -1
        if not failed:  # never walk into a tree that may still show a host directory
            shutil.rmtree(self.root, ignore_errors=True)


@dataclass
class ExecRequest:
    sandbox_id: str
    hostname: str
    layout: GuestLayout
    image: Image
    egress: Callable[[], list[str] | None]  # read when the rules are applied: the latest wins
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
        self.setpriv = shutil.which("setpriv")
        self.seccomp = compile_filter() if isolation else b""
        self._procs: set[GuestProcess] = set()
        self.host_addresses = network.host_addresses()

    @property
    def live_processes(self) -> int:
        return sum(1 for p in self._procs if p.running)

    # -- command resolution -------------------------------------------------------------
    def _host_view(self, req: ExecRequest, guest_path: str) -> Path:
        if not self.isolation and not guest_path.startswith(("/workspace/", "/tmp/")):
            return Path(guest_path)
        return req.layout.fs / guest_path.lstrip("/")

    def _executable(self, host_path: Path) -> bool:
        if host_path.is_symlink():  # may point inside the rootfs; let execve decide
            return True
        return host_path.is_file() and os.access(host_path, os.X_OK)

    def check_command(self, req: ExecRequest, path_env: str) -> None:
        cmd = req.cmd
        if "/" in cmd:
            guest = posixpath.normpath(cmd if cmd.startswith("/") else posixpath.join("/workspace", cmd))
            if not self._executable(self._host_view(req, guest)):
                raise GuestStartError(f"fork/exec {cmd}: no such file or directory")
            return
        for directory in path_env.split(":"):
            if directory and self._executable(self._host_view(req, posixpath.join(directory, cmd))):
                return
        raise GuestStartError(f'exec: "{cmd}": executable file not found in $PATH')

    # -- argv ---------------------------------------------------------------------------
    def _jailed(self, layout: GuestLayout, userns_fd: int) -> list[str]:
        """nsenter (into the guest's network, still as the server's root), then setpriv (the
        guest's own unprivileged host uid), then bwrap joining the guest's user namespace, where
        that uid is root, with no way to make another."""
        assert self.bwrap is not None and self.setpriv is not None and layout.network is not None
        uid = layout.host_uid
        argv = [
            *layout.network.enter_argv(),
            self.setpriv,
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
        ]
        return [*argv, "--", self.bwrap, "--userns", str(userns_fd), "--assert-userns-disabled"]

    def _bwrap_argv(
        self,
        req: ExecRequest,
        env: dict[str, str],
        ns_fds: tuple[int, int | None],
        seccomp_fd: int,
    ) -> list[str]:
        """bwrap as the guest's host uid: the guest's root is its own overlay, its network the
        guest's, it is root in its user namespace with ``GUEST_CAPABILITIES`` there only.
        ``ns_fds``: the guest's user namespace and its PID 1's PID namespace (None when it has
        no PID 1: an image without ``sleep`` gets a PID namespace per exec)."""
        userns_fd, pidns_fd = ns_fds
        argv = self._jailed(req.layout, userns_fd)
        argv += ["--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        if pidns_fd is None:  # no init: a PID namespace of its own, gone with this exec
            argv += ["--unshare-pid", "--die-with-parent"]
        else:  # join the guest's PID namespace: its processes outlive this exec
            argv += ["--pidns", str(pidns_fd)]
            # No --die-with-parent here. With --pidns, bwrap's first child forks the command's
            # process and exits; the command arms PR_SET_PDEATHSIG just before its execve,
            # against whatever its parent is at that moment. When that first child is slow
            # to exit (a loaded host), the parent is still that child, and its exit then
            # SIGKILLs the command: exit 137, no output (seen about once in 2,400 soak runs,
            # traced with signal_generate). The guest's PID 1 already ties every process of
            # the namespace to the server: it dies with the server, and with it the namespace.
        argv += [*_capability_args(), "--seccomp", str(seccomp_fd)]
        # no --new-session: the launcher already runs in a session without a terminal, and
        # keeping one process group lets SIGSTOP/SIGKILL of the group reach the command
        argv += ["--hostname", req.hostname]
        argv += ["--bind", str(req.layout.fs), "/", "--proc", "/proc", "--dev", "/dev"]
        argv += ["--chdir", "/workspace", "--clearenv"]
        for key, value in env.items():
            argv += ["--setenv", key, value]
        return [*argv, "--", req.cmd, *req.args]

    async def start(self, req: ExecRequest, stdin: bytes | None) -> GuestProcess:
        path_env = req.env.get("PATH") or req.image.path
        env = {"PATH": path_env, **req.env}
        self.check_command(req, path_env)
        launcher_env = self._launcher_env(req.cgroups, req.mem_mib)
        pass_fds: tuple[int, ...] = ()
        if self.isolation:
            init = await self.ensure_init(req.layout, req.hostname, req.cgroups, req.mem_mib)
            assert req.layout.network is not None
            try:
                await req.layout.network.apply(req.egress, self.host_addresses)
            except network.NetworkError as exc:
                raise GuestStartError(f"the guest's network could not be set up: {exc}") from exc
            if req.layout.userns < 0:  # removed meanwhile
                raise GuestStartError("the guest is being deleted")
            pidns_fd = init.pid_namespace() if init is not None else None
            userns_fd = os.dup(req.layout.userns)
            seccomp_fd = _pipe_with(self.seccomp)
            pass_fds = (userns_fd, *([pidns_fd] if pidns_fd is not None else []), seccomp_fd)
            argv = self._bwrap_argv(req, env, (userns_fd, pidns_fd), seccomp_fd)
            cwd = "/"
        else:
            argv = [req.cmd, *req.args]
            launcher_env = {**env, "HOME": str(req.layout.workspace), **launcher_env, "PATH": path_env}
            cwd = str(req.layout.workspace)
        try:
            proc, exited = await spawn(
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
                pass_fds=pass_fds,
            )
        except OSError as exc:
            raise GuestStartError(f"fork/exec {req.cmd}: {exc.strerror or exc}") from exc
        finally:
            for fd in pass_fds:
                os.close(fd)
        guest = GuestProcess(proc, exited, self.isolation, self._procs)
        guest.begin(stdin)
        return guest

    def kill_all(self) -> None:
        for proc in list(self._procs):
            proc.kill()

    # -- the guest's PID 1 ----------------------------------------------------------------
    def _launcher_env(self, cgroups: SandboxCgroups, mem_mib: int) -> dict[str, str]:
        env = {"PATH": SYSTEM_PATH, "CREATEOS_LOCAL_CGROUPS": " ".join(cgroups.procs_files())}
        if self.memory_mode == "rlimit":
            env["CREATEOS_LOCAL_AS_KB"] = str(max(mem_mib, RLIMIT_FLOOR_MIB) * 1024)
        return env

    async def ensure_init(
        self, layout: GuestLayout, hostname: str, cgroups: SandboxCgroups, mem_mib: int
    ) -> GuestInit | None:
        """The guest's init, started on first use: a bwrap sandbox running the image's
        ``sleep infinity`` as PID 1's only child. Every exec joins its user and PID
        namespaces, so what an exec leaves running in the background lives on (frozen with
        the guest's cgroup on pause) until delete kills the init and with it the namespace."""
        async with layout.init_lock:
            if layout.init is not None and layout.init.alive:
                return layout.init
            if layout.init is not None:
                layout.init.kill()  # whatever is left of a dead init (its pin, its launcher)
            layout.init = None
            if layout.network is None:
                net = GuestNetwork(layout.netns)
                try:
                    await net.create()
                except network.NetworkError as exc:
                    raise GuestStartError(f"the guest's network could not be set up: {exc}") from exc
                layout.network = net
                layout.mounted.append(layout.netns)
            sleep = next((p for p in ("usr/bin/sleep", "bin/sleep") if (layout.fs / p).exists()), None)
            if sleep is None:
                return None
            if layout.userns < 0:  # removed meanwhile
                raise GuestStartError("the guest is being deleted")
            # bwrap reads its arguments from a pipe (--args), so the guest's PID 1 shows no host path
            bwrap_args = ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
            bwrap_args += ["--die-with-parent", "--hostname", hostname, "--bind", str(layout.fs), "/"]
            bwrap_args += ["--proc", "/proc", "--dev", "/dev", "--chdir", "/", "--clearenv"]
            seccomp_r = _pipe_with(self.seccomp)
            info_r, info_w = os.pipe()
            userns_fd = os.dup(layout.userns)
            bwrap_args += ["--info-fd", str(info_w), "--seccomp", str(seccomp_r)]
            args_r = _pipe_with(b"".join(os.fsencode(a) + b"\0" for a in bwrap_args))
            argv = [*self._jailed(layout, userns_fd), "--args", str(args_r), "--", f"/{sleep}", "infinity"]
            try:
                proc = await asyncio.create_subprocess_exec(
                    "/bin/sh",
                    "-c",
                    LAUNCHER,
                    "createos-init",
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.PIPE,
                    env=self._launcher_env(cgroups, mem_mib),
                    cwd="/",
                    start_new_session=True,
                    pass_fds=(info_w, args_r, seccomp_r, userns_fd),
                )
            finally:
                for fd in (info_w, args_r, seccomp_r, userns_fd):
                    os.close(fd)
            try:
                raw = await asyncio.to_thread(_read_all, info_r)
            finally:
                os.close(info_r)
            init: GuestInit | None = None
            try:
                init = GuestInit.adopt(proc, int(json.loads(raw)["child-pid"]))
                await _until_joined(init, os.fstat(layout.userns).st_ino)
            except (ValueError, KeyError, TypeError, OSError) as exc:
                if init is not None:
                    init.kill()
                pids.signal_own_group(proc, signal.SIGKILL)
                err = await proc.stderr.read() if proc.stderr else b""
                raise GuestStartError(
                    f"guest init failed to start: {err.decode(errors='replace').strip() or exc}"
                ) from exc
            layout.init = init
            return layout.init


async def _until_joined(init: GuestInit, userns: int) -> None:
    """Wait until the guest's PID 1 runs in the guest's user namespace (inode ``userns``):
    bwrap may report the PID before it has joined."""
    child_pid = init.child_pid
    for _ in range(2500):
        if not init.alive:
            raise OSError(errno.ESRCH, f"guest PID 1 ({child_pid}) exited while starting")
        joined = os.stat(f"/proc/{child_pid}/ns/user").st_ino == userns
        if joined and init.alive:  # alive afterwards: the namespace was PID 1's own
            return
        await asyncio.sleep(0.002)
    raise OSError(f"guest PID 1 ({child_pid}) never entered its user namespace")


def _parent_pid(pid: int) -> int:
    """The parent of ``pid`` from ``/proc/<pid>/stat`` (the field after the state letter; the
    command name before it may hold spaces and parentheses, so split after its last ``)``)."""
    with open(f"/proc/{pid}/stat", "rb") as fh:
        return int(fh.read().rsplit(b")", 1)[1].split()[1])


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    return b"".join(chunks)


def _unread_bytes(fd: int) -> int:
    return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]


def pipe_fd(transport: asyncio.BaseTransport) -> int | None:
    """The file descriptor behind a subprocess pipe transport, on either event loop:
    asyncio's transports name the pipe object ``pipe``, uvloop's (the server's loop under
    uvicorn) name it ``socket`` and have no ``pipe``."""
    for key in ("pipe", "socket"):
        obj = transport.get_extra_info(key)
        if obj is not None:
            fd = int(obj.fileno())
            return fd if fd >= 0 else None
    return None


class _ExitReportingProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """asyncio's stream protocol, plus a future done the moment the process exits."""

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=limit, loop=loop)
        self.exited: asyncio.Future[None] = loop.create_future()

    def process_exited(self) -> None:
        super().process_exited()
        if not self.exited.done():
            self.exited.set_result(None)


async def spawn(
    *argv: str, limit: int = CHUNK_BYTES, **kwargs: Any
) -> tuple[asyncio.subprocess.Process, asyncio.Future[None]]:
    """``asyncio.create_subprocess_exec``, also returning a future done at the process's exit.

    ``Process.wait()`` cannot tell that moment on every loop: on uvloop (uvicorn) it returns at
    the exit, on asyncio's own loop (the HTTP/2 server) only once every pipe is closed too,
    which a background process of the guest may hold open for as long as it likes."""
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.subprocess_exec(
        lambda: _ExitReportingProtocol(limit, loop), *argv, **kwargs
    )
    return asyncio.subprocess.Process(transport, protocol, loop), protocol.exited


class GuestInit:
    """The guest's PID 1 (bwrap's reaper; its only child sleeps) and the way into its namespaces.

    PID 1 is bwrap's child, not ours, so it is held by a pidfd (see ``pids``): its liveness,
    its namespaces and its kill never go through a number another process may have taken."""

    def __init__(self, proc: asyncio.subprocess.Process, child_pid: int, pidfd: int) -> None:
        self.proc = proc
        self.child_pid = child_pid  # PID 1 of the guest, as the host numbers it
        self._pidfd = pidfd  # -1 once closed

    @classmethod
    def adopt(cls, proc: asyncio.subprocess.Process, child_pid: int) -> GuestInit:
        """Pin the PID 1 that bwrap (``proc``) reported. The pin is checked to be that bwrap's
        child while bwrap is unreaped, so it cannot be a process that took the number."""
        pidfd = pids.open_pidfd(child_pid)
        if pidfd is None:
            raise OSError(errno.ESRCH, f"guest PID 1 ({child_pid}) exited while starting")
        try:
            parent = _parent_pid(child_pid)
            if proc.returncode is not None or pids.has_exited(pidfd) or parent != proc.pid:
                raise OSError(errno.ESRCH, f"guest PID 1 ({child_pid}) exited while starting")
        except BaseException:
            os.close(pidfd)
            raise
        return cls(proc, child_pid, pidfd)

    @property
    def alive(self) -> bool:
        return self._pidfd >= 0 and self.proc.returncode is None and not pids.has_exited(self._pidfd)

    def pid_namespace(self) -> int:
        """PID 1's PID namespace, which an exec joins. Opened by number and then checked
        against the pidfd: if PID 1 is still running afterwards, it was its own."""
        fd = os.open(f"/proc/{self.child_pid}/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        if not self.alive:
            os.close(fd)
            raise OSError(errno.ESRCH, f"guest PID 1 ({self.child_pid}) has exited")
        return fd

    def kill(self) -> None:
        """SIGKILL PID 1 (the kernel then kills its whole PID namespace) and the launcher's
        group, then release the pin. Idempotent."""
        if self._pidfd >= 0:
            pids.send(self._pidfd, signal.SIGKILL)
        pids.signal_own_group(self.proc, signal.SIGKILL)
        self.close()

    def close(self) -> None:
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1


class GuestProcess:
    """A running exec: its output arrives as (stream name, bytes) chunks through a small queue,
    so a guest printing gigabytes is throttled by the reader instead of buffered here."""

    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        exited: asyncio.Future[None],
        isolation: bool,
        registry: set[GuestProcess],
    ) -> None:
        self.proc = proc
        self.exited = exited  # done when the main process has exited (see spawn)
        self.isolation = isolation
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
        await self.exited
        if not self.isolation:
            # Background children of an unisolated guest would hold the pipes open forever.
            # The launcher is reaped by now, but while a member of its group lives the group's
            # number cannot be handed on, and this runs in the loop turn after the reap.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            return
        await self._close_pipes_once_drained()

    async def _close_pipes_once_drained(self) -> None:
        """The exec ends with its main process. A background process it started may still
        hold stdout/stderr open: once what the pipes hold has been read, stop reading them
        (later writes of that process get EPIPE, as after a detached exec on a microVM)."""
        transport = getattr(self.proc, "_transport", None)
        if transport is None:
            return
        pipes = [transport.get_pipe_transport(fd) for fd in (1, 2)]
        while True:
            open_pipes = [p for p in pipes if p is not None and not p.is_closing()]
            if not open_pipes:
                return  # both at end of file: nothing to cut
            fds = [fd for fd in map(pipe_fd, open_pipes) if fd is not None]
            try:
                if len(fds) < len(open_pipes):
                    raise LookupError("a pipe transport does not expose its descriptor")
                pending = sum(_unread_bytes(fd) for fd in fds)
            except (OSError, LookupError):
                # no way to tell what is unread: wait for the end of file instead (a
                # background writer then keeps the exec open; output is never cut)
                return
            if not pending:
                break
            await asyncio.sleep(0.002)
        for pipe in open_pipes:
            pipe.close()

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
        pids.signal_own_group(self.proc, signal.SIGKILL)
        self._registry.discard(self)

    async def close(self) -> None:
        """Kill the command (if still running) and release the pipes."""
        self.kill()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.proc.wait(), 5)
        for task in self._tasks:
            task.cancel()
        self._registry.discard(self)
