"""cgroup v1 memory, freezer and pids groups, one set per sandbox, under a per-server parent.

Used when ``/sys/fs/cgroup/{memory,freezer,pids}`` are writable (we run as root on cgroup v1).
The pids group caps a sandbox at ``GUEST_PIDS_MAX`` tasks (threads count), so a fork bomb
fails with EAGAIN inside its guest instead of exhausting the host's PID space.
Guests join their groups through the launcher shell (see ``jailer.py``) before ``bwrap`` runs,
so every process of an exec is accounted, frozen on pause and killed on delete.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from .pids import signal_members

CGROUP_ROOT = Path("/sys/fs/cgroup")
PARENT_PREFIX = "createos-local-"
GUEST_PIDS_MAX = 1024  # tasks per sandbox (processes and threads of all its execs)


def _writable_parent(controller: str, tag: str) -> Path | None:
    base = CGROUP_ROOT / controller
    if not (base / "cgroup.procs").exists():
        return None
    parent = base / f"{PARENT_PREFIX}{tag}"
    try:
        parent.mkdir(exist_ok=True)
        probe = parent / "probe"
        probe.mkdir(exist_ok=True)
        probe.rmdir()
    except OSError:
        return None
    return parent


def _read_pids(group: Path) -> list[int]:
    try:
        return [int(line) for line in (group / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _remove_group(group: Path, freezer: bool) -> None:
    """Kill every task of ``group`` and remove it (thawing first: frozen tasks cannot die)."""
    if not group.exists():
        return
    if freezer:
        with contextlib.suppress(OSError):
            (group / "freezer.state").write_text("THAWED")
    for _ in range(100):
        signal_members(lambda: _read_pids(group), signal.SIGKILL)
        try:
            group.rmdir()
            return
        except OSError:
            time.sleep(0.01)


class SandboxCgroups:
    def __init__(self, memory: Path | None, freezer: Path | None, pids: Path | None = None) -> None:
        self.memory = memory
        self.freezer = freezer
        self.pids_group = pids

    def procs_files(self) -> list[str]:
        groups = (self.memory, self.freezer, self.pids_group)
        return [str(g / "cgroup.procs") for g in groups if g is not None]

    def pids(self) -> list[int]:
        group = self.freezer or self.memory or self.pids_group
        return _read_pids(group) if group else []

    def freeze(self) -> bool:
        if self.freezer is None:
            return False
        (self.freezer / "freezer.state").write_text("FROZEN")
        return True

    def thaw(self) -> bool:
        if self.freezer is None:
            return False
        (self.freezer / "freezer.state").write_text("THAWED")
        return True

    def kill_all(self) -> None:
        if self.freezer is not None:
            with contextlib.suppress(OSError):
                (self.freezer / "freezer.state").write_text("THAWED")
        signal_members(self.pids, signal.SIGKILL)

    def remove(self) -> None:
        if self.freezer is not None:
            _remove_group(self.freezer, freezer=True)
        if self.memory is not None:
            _remove_group(self.memory, freezer=False)
        if self.pids_group is not None:
            _remove_group(self.pids_group, freezer=False)


class CgroupManager:
    """Owns ``/sys/fs/cgroup/<controller>/createos-local-<pid>`` for this server process."""

    def __init__(self, enabled: bool = True) -> None:
        tag = str(os.getpid())
        if enabled:
            _cleanup_stale()
        self.memory_parent = _writable_parent("memory", tag) if enabled else None
        self.freezer_parent = _writable_parent("freezer", tag) if enabled else None
        self.pids_parent = _writable_parent("pids", tag) if enabled else None

    def create(self, sandbox_id: str, mem_mib: int) -> SandboxCgroups:
        memory = freezer = pids = None
        if self.memory_parent is not None:
            memory = self.memory_parent / sandbox_id
            try:
                memory.mkdir(exist_ok=True)
                (memory / "memory.limit_in_bytes").write_text(str(mem_mib * 1024 * 1024))
            except OSError:
                memory = None
        if self.freezer_parent is not None:
            freezer = self.freezer_parent / sandbox_id
            try:
                freezer.mkdir(exist_ok=True)
            except OSError:
                freezer = None
        if self.pids_parent is not None:
            pids = self.pids_parent / sandbox_id
            try:
                pids.mkdir(exist_ok=True)
                (pids / "pids.max").write_text(str(GUEST_PIDS_MAX))
            except OSError:
                pids = None
        return SandboxCgroups(memory, freezer, pids)

    def close(self) -> None:
        parents = ((self.freezer_parent, True), (self.memory_parent, False), (self.pids_parent, False))
        for parent, is_freezer in parents:
            if parent is None or not parent.exists():
                continue
            for child in parent.iterdir():
                if child.is_dir():
                    _remove_group(child, is_freezer)
            with contextlib.suppress(OSError):
                parent.rmdir()


def _cleanup_stale() -> None:
    """Remove the groups left behind by a createos-local that was killed without cleanup."""
    for controller in ("freezer", "memory", "pids"):
        base = CGROUP_ROOT / controller
        try:
            parents = [p for p in base.iterdir() if p.name.startswith(PARENT_PREFIX)]
        except OSError:
            continue
        for parent in parents:
            pid = parent.name[len(PARENT_PREFIX) :]
            if pid.isdigit() and Path(f"/proc/{pid}").exists():
                continue
            for child in parent.iterdir():
                if child.is_dir():
                    _remove_group(child, controller == "freezer")
            with contextlib.suppress(OSError):
                parent.rmdir()
