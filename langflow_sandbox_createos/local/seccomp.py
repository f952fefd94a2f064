"""The seccomp filter every guest process runs under, in the spirit of Docker's default profile.

A guest is root in a user namespace of its own, so the kernel lets it try calls that an
unprivileged process never reaches: new namespaces, mounts, keyrings, BPF programs. Each of
those is a piece of the shared kernel's attack surface that a microVM's guest would only reach
in its own kernel. The filter refuses them with ``EPERM`` (``ENOSYS`` for ``clone3``, so the C
library falls back to ``clone``, whose flags the filter can read); every other call is allowed.
Calls of another architecture's ABI (32-bit ``int 0x80`` on x86_64) kill the process, since the
filter is written for the native table only.

The filter is compiled once at start with libseccomp (``libseccomp2``, through ctypes) into the
classic BPF program that ``bwrap --seccomp FD`` installs. ``BLOCKED`` is the documented list
(docs/local-control-plane.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import tempfile

# The calls refused outright, grouped as docs/local-control-plane.md lists them.
BLOCKED: dict[str, tuple[str, ...]] = {
    "namespaces and mounts": (
        "unshare",
        "setns",
        "mount",
        "umount2",
        "pivot_root",
        "chroot",
        "open_tree",
        "move_mount",
        "fsopen",
        "fsconfig",
        "fsmount",
        "fspick",
        "mount_setattr",
    ),
    "kernel keyring": ("add_key", "keyctl", "request_key"),
    "BPF and perf events": ("bpf", "perf_event_open"),
    "userfaultfd and io_uring": ("userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register"),
    "kernel modules and kexec": (
        "init_module",
        "finit_module",
        "delete_module",
        "create_module",
        "query_module",
        "get_kernel_syms",
        "kexec_load",
        "kexec_file_load",
    ),
    "host administration": (
        "reboot",
        "swapon",
        "swapoff",
        "acct",
        "quotactl",
        "quotactl_fd",
        "syslog",
        "vhangup",
        "settimeofday",
        "clock_settime",
        "clock_adjtime",
        "adjtimex",
        "stime",
        "sethostname",
        "setdomainname",
        "iopl",
        "ioperm",
        "nfsservctl",
        "lookup_dcookie",
        "uselib",
        "ustat",
        "sysfs",
        "_sysctl",
        "vm86",
        "vm86old",
    ),
    "file handles": ("name_to_handle_at", "open_by_handle_at"),
}

# clone(2) with any of these flags is refused: a guest cannot make namespaces of its own
CLONE_NAMESPACE_FLAGS = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}

SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_CMP_MASKED_EQ = 7


def _act_errno(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


class _ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


class SeccompUnavailable(RuntimeError):
    """libseccomp is missing or refused the filter."""


def _library() -> ctypes.CDLL:
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError as exc:
        raise SeccompUnavailable(f"libseccomp is not installed ({exc}); apt-get install libseccomp2") from exc
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_release.restype = None
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_syscall_resolve_name.restype = ctypes.c_int
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_ArgCmp),
    ]
    lib.seccomp_rule_add_array.restype = ctypes.c_int
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_export_bpf.restype = ctypes.c_int
    return lib


def compile_filter() -> bytes:
    """The guest filter as a classic BPF program (what ``bwrap --seccomp`` reads)."""
    lib = _library()
    ctx = lib.seccomp_init(SCMP_ACT_ALLOW)
    if not ctx:
        raise SeccompUnavailable("seccomp_init failed")
    try:

        def add(name: str, action: int, *cmps: _ArgCmp) -> None:
            nr = lib.seccomp_syscall_resolve_name(name.encode())
            if nr < 0:  # not a call of this architecture (vm86 on x86_64, ...): nothing to refuse
                return
            array = (_ArgCmp * len(cmps))(*cmps) if cmps else None
            rc = lib.seccomp_rule_add_array(ctx, action, nr, len(cmps), array)
            if rc < 0:
                raise SeccompUnavailable(f"seccomp rule for {name} refused: {os.strerror(-rc)}")

        for names in BLOCKED.values():
            for name in names:
                add(name, _act_errno(errno.EPERM))
        add("clone3", _act_errno(errno.ENOSYS))
        for flag in CLONE_NAMESPACE_FLAGS.values():
            add("clone", _act_errno(errno.EPERM), _ArgCmp(0, SCMP_CMP_MASKED_EQ, flag, flag))
        with tempfile.TemporaryFile() as out:
            rc = lib.seccomp_export_bpf(ctx, out.fileno())
            if rc < 0:
                raise SeccompUnavailable(f"seccomp_export_bpf failed: {os.strerror(-rc)}")
            out.seek(0)
            return out.read()
    finally:
        lib.seccomp_release(ctx)


def blocked_calls() -> list[str]:
    """Every call the filter refuses (for docs and stats)."""
    names = [name for group in BLOCKED.values() for name in group]
    return [*names, "clone3", "clone (with a CLONE_NEW* flag)"]
