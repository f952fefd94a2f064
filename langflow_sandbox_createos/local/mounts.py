"""Thin ctypes wrappers for the Linux calls the guest roots need: mount(2), umount2(2),
unshare(2), openat2(2) and the idmapped mount of a layer (open_tree(2), mount_setattr(2),
move_mount(2)). Linux only; every failure raises ``OSError`` with errno set."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MNT_DETACH = 0x2
CLONE_NEWNS = 0x00020000

# openat2(2): struct open_how and the RESOLVE_* flags (linux/openat2.h)
SYS_OPENAT2 = 437  # the same number on every architecture (asm-generic)
# the mount API (linux/mount.h), numbered alike on every architecture too
SYS_OPEN_TREE = 428
SYS_MOVE_MOUNT = 429
SYS_MOUNT_SETATTR = 442
OPEN_TREE_CLONE = 1
AT_EMPTY_PATH = 0x1000
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOUNT_ATTR_IDMAP = 0x100000
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.syscall.restype = ctypes.c_long


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _b(value: str | Path | None) -> bytes | None:
    return None if value is None else os.fsencode(value)


def mount(
    source: str | Path | None, target: str | Path, fstype: str | None, flags: int, data: str = ""
) -> None:
    _check(_libc.mount(_b(source), _b(target), _b(fstype), flags, data.encode() or None), f"mount {target}")


def umount(target: str | Path) -> None:
    """Detach ``target`` (lazily: open files keep the old tree alive until closed)."""
    _check(_libc.umount2(_b(target), MNT_DETACH), f"umount {target}")


def private_mount_namespace() -> None:
    """Move this process into its own mount namespace whose mounts never propagate to the
    host: every mount made afterwards disappears with the process, even on SIGKILL."""
    _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    mount(None, "/", None, MS_REC | MS_PRIVATE)


def openat2(dir_fd: int, path: str, flags: int, resolve: int, mode: int = 0) -> int:
    """openat2(2): open ``path`` relative to ``dir_fd`` with ``resolve`` rules, in one step."""
    how = _OpenHow(flags | os.O_CLOEXEC, mode, resolve)
    fd = _libc.syscall(SYS_OPENAT2, dir_fd, os.fsencode(path), ctypes.byref(how), ctypes.sizeof(how))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return int(fd)


def _syscall(what: str, *args: object) -> int:
    result = int(_libc.syscall(*args))
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def mount_idmapped(source: str | Path, target: str | Path, userns_fd: int) -> None:
    """Mount a copy of ``source`` (not recursive) on ``target``, its owners shown through the
    user namespace ``userns_fd``: a file ``source`` holds as uid k appears as the host uid that
    namespace maps k to (Linux 5.12; tmpfs 6.3)."""
    tree = _syscall("open_tree", SYS_OPEN_TREE, -100, os.fsencode(source), OPEN_TREE_CLONE | os.O_CLOEXEC)
    try:
        attr = _MountAttr(MOUNT_ATTR_IDMAP, 0, 0, userns_fd)
        _syscall(
            f"idmapping {source}",
            SYS_MOUNT_SETATTR,
            tree,
            b"",
            AT_EMPTY_PATH,
            ctypes.byref(attr),
            ctypes.sizeof(attr),
        )
        _syscall(
            f"mount {target}", SYS_MOVE_MOUNT, tree, b"", -100, os.fsencode(target), MOVE_MOUNT_F_EMPTY_PATH
        )
    finally:
        os.close(tree)
