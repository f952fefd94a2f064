"""Who a guest is on the host: a host uid of its own, and the user namespace that maps it.

A guest's processes run as root (uid 0) in a user namespace the server makes for it at create,
``0 <host uid> 1``: only that root is mapped, to a host uid no host user and no other guest
has (``GuestIds``: one per live guest from a range of ``GUEST_UID_SPAN`` starting at
``--guest-uid-base``). The namespace is a child of the host's, so ``/proc/self/uid_map`` in the
guest names the host uid; user namespaces cannot be made inside it
(``user.max_user_namespaces`` is 0 there, on top of the seccomp filter). The layers
createos-local builds are root's on disk and shown to each guest through an idmapped mount of
its namespace, so they are its own root's: the guest owns ``/etc``, ``/root``, ``/usr/local``...
without a copy. Where the kernel cannot idmap those layers (tmpfs before Linux 6.3), or with
``--shared-guest-uid``, every guest is the range's first uid and the layers are chowned to it.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import select
import shutil
import stat
import subprocess
from pathlib import Path

from . import mounts
from .config import ServerConfig
from .helpers import helper_env, tool

# the default base lies in systemd's unused block (UIDS-GIDS.md: 1879048192-2147352575), which
# no distribution hands out
GUEST_UID_BASE = ServerConfig.guest_uid_base
GUEST_UID_SPAN = 65536
NAMESPACE_SECONDS = 20.0
# run as the guest's host uid, in the new namespace where it is root (unshare writes the map)
_MAKE_NAMESPACE = "echo 0 > /proc/sys/user/max_user_namespaces && echo ready && read _"


class IdentityError(OSError):
    """The guest's user namespace could not be made."""


class GuestIds:
    """The host uid of each live guest: the lowest one free after the last one handed out
    (so a uid is handed on as late as possible), or always the first with ``shared``."""

    def __init__(self, base: int, shared: bool) -> None:
        self.base = base
        self.shared = shared
        self._owners: dict[int, str] = {}
        self._next = 0

    def take(self, owner: str) -> int:
        if self.shared:
            return self.base
        for step in range(GUEST_UID_SPAN):
            uid = self.base + (self._next + step) % GUEST_UID_SPAN
            if uid not in self._owners:
                self._owners[uid] = owner
                self._next = (uid - self.base + 1) % GUEST_UID_SPAN
                return uid
        raise IdentityError(f"all {GUEST_UID_SPAN} guest uids from {self.base} are in use")

    def give_back(self, uid: int, owner: str) -> None:
        """Free ``uid`` if ``owner`` still holds it (a second release cannot free a uid that
        another guest has been given since)."""
        if self._owners.get(uid) == owner:
            del self._owners[uid]


def host_users_in_range(base: int) -> list[str]:
    """The host's users and groups whose ids fall in the guests' range (it must have none)."""
    users = [
        f"user {p.pw_name} ({p.pw_uid})" for p in pwd.getpwall() if base <= p.pw_uid < base + GUEST_UID_SPAN
    ]
    groups = [
        f"group {g.gr_name} ({g.gr_gid})" for g in grp.getgrall() if base <= g.gr_gid < base + GUEST_UID_SPAN
    ]
    return users + groups


def make_namespace(host_uid: int) -> int:
    """A new user namespace owned by ``host_uid``, mapping its root to it and nothing else, in
    which no user namespace can be made; returned as an open descriptor (it lives as long as the
    descriptor, or a process or mount that uses it). Blocking: a few ms of ``unshare`` and
    ``sh``."""
    proc = subprocess.Popen(
        [tool("unshare"), "--user", "--map-root-user", "sh", "-c", _MAKE_NAMESPACE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=helper_env(),
        cwd="/",
        user=host_uid,  # set in the child before its exec (one exec fewer than setpriv)
        group=host_uid,
        extra_groups=[],
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    fd = -1
    try:
        ready, _, _ = select.select([proc.stdout], [], [], NAMESPACE_SECONDS)
        if not ready or proc.stdout.readline() != b"ready\n":
            proc.kill()
            proc.wait(NAMESPACE_SECONDS)
            raise IdentityError(
                f"the guest's user namespace: {proc.stderr.read().decode(errors='replace').strip()}"
            )
        fd = os.open(f"/proc/{proc.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
        with open(f"/proc/{proc.pid}/uid_map") as fh:
            mapped = fh.read().split()
        if os.fstat(fd).st_ino == os.stat("/proc/self/ns/user").st_ino or mapped != ["0", str(host_uid), "1"]:
            raise IdentityError(f"the guest's user namespace maps {mapped}, not 0 -> {host_uid}")
    except BaseException:
        if fd >= 0:
            os.close(fd)
        proc.kill()
        raise
    finally:
        proc.stdin.close()  # ends the shell; the namespace lives on in the descriptor
        proc.wait(NAMESPACE_SECONDS)
        proc.stdout.close()
        proc.stderr.close()
    return fd


def chown_tree(top: Path, old: int, new: int) -> None:
    """Give ``new`` what ``old`` owns under ``top`` (a fork's copy of its source's disk): uid and
    gid each, symlinks themselves, set-id bits kept (chown clears them)."""

    def give(path: str) -> None:
        st = os.lstat(path)
        if old not in (st.st_uid, st.st_gid):
            return
        os.lchown(path, new if st.st_uid == old else st.st_uid, new if st.st_gid == old else st.st_gid)
        if stat.S_ISREG(st.st_mode) and st.st_mode & 0o6000:
            os.chmod(path, stat.S_IMODE(st.st_mode))

    give(str(top))
    for directory, dirs, files in os.walk(top):
        for name in (*dirs, *files):
            give(os.path.join(directory, name))


def idmap_problem(scratch: Path, host_uid: int) -> str | None:
    """None when a tmpfs (what the image layers are on) can be mounted idmapped here, else why
    not. Mounts under ``scratch``, in the server's private mount namespace. Blocking."""
    source, target = scratch / "source", scratch / "target"
    source.mkdir(parents=True, exist_ok=True)
    target.mkdir(exist_ok=True)
    userns = -1
    mounted: list[Path] = []
    try:
        mounts.mount("tmpfs", source, "tmpfs", mounts.MS_NOSUID | mounts.MS_NODEV, "size=64k,mode=0755")
        mounted.append(source)
        userns = make_namespace(host_uid)
        mounts.mount_idmapped(source, target, userns)
        mounted.append(target)
        owner = os.stat(target).st_uid
        return None if owner == host_uid else f"an idmapped tmpfs showed uid {owner}, not {host_uid}"
    except OSError as exc:
        return f"the image layers (tmpfs) cannot be mounted idmapped: {exc}"
    finally:
        for path in reversed(mounted):
            with contextlib.suppress(OSError):
                mounts.umount(path)
        if userns >= 0:
            os.close(userns)
        shutil.rmtree(scratch, ignore_errors=True)
