"""S8: what /proc says about a process tree (CPU, RSS, threads), and CPU confinement."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from s8_common import CLK_TCK

# --- /proc -----------------------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw.rsplit(") ", 1)[1].split()  # fields from 3 (state) on


def cpu_seconds(pid: int, children: bool = True) -> float:
    """utime + stime (+ cutime + cstime: children it has reaped) of one process, in seconds."""
    f = _stat_fields(pid)
    if f is None:
        return 0.0
    ticks = int(f[11]) + int(f[12])  # utime, stime (fields 14, 15)
    if children:
        ticks += int(f[13]) + int(f[14])  # cutime, cstime
    return ticks / CLK_TCK


def children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        f = _stat_fields(int(entry))
        if f is not None:
            kids.setdefault(int(f[1]), []).append(int(entry))
    return kids


def descendants(root: int) -> list[int]:
    kids = children_map()
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, []))
    return out


def tree_cpu_seconds(root: int) -> float:
    """The whole tree's CPU: each live process's own and reaped children's time (a process that
    ended inside the tree moved its time into its parent's cutime when it was reaped)."""
    return sum(cpu_seconds(pid) for pid in descendants(root))


def status_kib(pid: int, field: str) -> int | None:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


def threads(pid: int) -> list[int]:
    with contextlib.suppress(OSError):
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    return []


def on_cpu(cpu: int, argv: list[str]) -> list[str]:
    """`argv` confined to one CPU from its start (taskset execs it: the pid is argv's own)."""
    return ["taskset", "-c", str(cpu), *argv]


def pin_tree(root: int, cpus: set[int]) -> dict[str, Any]:
    """Every thread of every process under `root` onto `cpus` (threads and processes made later
    inherit it from their creator), twice to catch any made during the first pass; then check."""
    for _ in range(2):
        for pid in descendants(root):
            for tid in threads(pid):
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(tid, cpus)
    return check_affinity(root, cpus)


def check_affinity(root: int, cpus: set[int]) -> dict[str, Any]:
    procs, tids, wrong = 0, 0, []
    for pid in descendants(root):
        procs += 1
        for tid in threads(pid):
            tids += 1
            with contextlib.suppress(OSError):
                if os.sched_getaffinity(tid) != cpus:
                    wrong.append(tid)
    return {"cpus": sorted(cpus), "processes": procs, "threads": tids, "not_pinned": len(wrong)}


class CpuBusy:
    """Busy fraction of one CPU between two reads of /proc/stat."""

    def __init__(self, cpu: int) -> None:
        self.cpu = cpu
        self.last = self._read()

    def _read(self) -> tuple[int, int]:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith(f"cpu{self.cpu} "):
                v = [int(x) for x in line.split()[1:]]
                idle = v[3] + v[4]
                return sum(v) - idle, sum(v)
        return 0, 0

    def busy(self) -> float:
        now = self._read()
        d_busy, d_all = now[0] - self.last[0], now[1] - self.last[1]
        self.last = now
        return d_busy / d_all if d_all else 0.0
