"""Sandbox rows and their state machine (spec section 6).

creating -> running -> pausing -> paused -> resuming -> running; paused -> fork child
(forking -> running, or paused with ``start_paused``); any live state -> destroying ->
destroyed. ``destroyed`` and ``failed`` are terminal; their rows stay listed.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from . import pids
from .catalog import Shape
from .cgroups import CgroupManager, SandboxCgroups
from .envelope import ApiError
from .identity import GUEST_UID_BASE, GuestIds
from .images import Image
from .jailer import GuestLayout, GuestProcess

log = logging.getLogger("createos.local")

TERMINAL = frozenset({"destroyed", "failed"})
PAUSED_LIKE = frozenset({"pausing", "paused", "resuming", "forking"})
PAUSED_MESSAGE = "sandbox is paused; resume it before accessing files"
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_ADJECTIVES = ("brave", "calm", "eager", "quick", "quiet", "lucky", "proud", "witty", "gentle", "bold")
_ANIMALS = ("otter", "lynx", "heron", "panda", "koala", "ibis", "finch", "moose", "yak", "newt")


def new_ulid() -> str:
    value = (int(time.time() * 1000) << 80) | secrets.randbits(80)
    return "".join(_CROCKFORD[(value >> shift) & 31] for shift in range(125, -1, -5))


def rfc3339(ts: float) -> str:
    return (
        datetime.fromtimestamp(ts, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    )


def generated_name() -> str:
    return f"{secrets.choice(_ADJECTIVES)}-{secrets.choice(_ANIMALS)}-{secrets.token_hex(2)}"


@dataclass
class Sandbox:
    id: str
    name: str
    shape: Shape
    rootfs: str
    image: Image
    layout: GuestLayout
    cgroups: SandboxCgroups
    ip: str
    disk_mib: int
    egress: list[str]
    envs: dict[str, str]
    status: str = "creating"
    created_at: float = field(default_factory=time.time)
    running_at: float | None = None
    paused_at: float | None = None
    last_resumed_at: float | None = None
    destroyed_at: float | None = None
    spawn_ms: float | None = None
    forked_from: str | None = None
    auto_pause_after_seconds: int | None = None
    ingress_enabled: bool = False
    ssh_pubkeys: list[str] = field(default_factory=list)
    last_activity: float = field(default_factory=time.monotonic)
    processes: set[GuestProcess] = field(default_factory=set)
    transition: asyncio.Task[None] | None = None
    mounting: bool = False  # its disk and root are being made (off the event loop)

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    def egress_rules(self) -> list[str]:
        """The egress now stored: what the guest's network reads each time it loads its rules."""
        return self.egress

    def view(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": self.id,
            "name": self.name,
            "status": self.status,
            "shape": self.shape.id,
            "rootfs": self.rootfs,
            "region": "local",
            "vcpu": self.shape.vcpu,
            "mem_mib": self.shape.mem_mib,
            "disk_mib": self.disk_mib,
            "created_at": rfc3339(self.created_at),
            "ingress_enabled": self.ingress_enabled,
            "egress": list(self.egress),
            "envs": sorted(self.envs),
            "bandwidth_quota_bytes": -1,
        }
        if self.status != "creating":
            data["ip"] = self.ip
        optional_times = {
            "running_at": self.running_at,
            "paused_at": self.paused_at,
            "last_resumed_at": self.last_resumed_at,
            "destroyed_at": self.destroyed_at,
        }
        data.update({k: rfc3339(v) for k, v in optional_times.items() if v is not None})
        if self.spawn_ms is not None:
            data["spawn_ms"] = self.spawn_ms
        if self.forked_from:
            data["forked_from"] = self.forked_from
        if self.auto_pause_after_seconds:
            data["auto_pause_after_seconds"] = self.auto_pause_after_seconds
        if self.ssh_pubkeys:
            data["ssh_pubkeys"] = list(self.ssh_pubkeys)
        if self.ingress_enabled:
            data["ingress_url_template"] = f"https://<port>-{self.id}.sandbox.localhost"
        return data


class Store:
    def __init__(
        self,
        state_dir: Path,
        cgroups: CgroupManager,
        transition_delay: Callable[[], float],
        unique_names: bool = True,
        isolation: bool = True,
        ids: GuestIds | None = None,
    ) -> None:
        self.isolation = isolation
        self.ids = ids if ids is not None else GuestIds(GUEST_UID_BASE, shared=False)
        self.state_dir = state_dir
        self.sandboxes_dir = state_dir / "sandboxes"
        self.cgroups = cgroups
        self.transition_delay = transition_delay
        self.unique_names = unique_names
        self.rows: dict[str, Sandbox] = {}
        self._ip_counter = 1
        self._background: set[asyncio.Task[None]] = set()

    # -- lookup -------------------------------------------------------------------------
    def get(self, sandbox_id: str) -> Sandbox:
        sb = self.rows.get(sandbox_id)
        if sb is None:
            raise ApiError(404, "sandbox not found", "not_found")
        return sb

    def live(self) -> list[Sandbox]:
        return [sb for sb in self.rows.values() if not sb.terminal]

    def name_taken(self, name: str) -> bool:
        return self.unique_names and any(sb.name == name for sb in self.live())

    def require_running(self, sb: Sandbox) -> None:
        if sb.status == "running":
            return
        if sb.status in PAUSED_LIKE:
            raise ApiError(409, PAUSED_MESSAGE, "sandbox_paused")
        raise ApiError(409, f"sandbox is {sb.status}", "invalid_state")

    # -- creation -----------------------------------------------------------------------
    def _next_ip(self) -> str:
        self._ip_counter += 1
        n = self._ip_counter
        return f"10.{(n >> 16) & 255}.{(n >> 8) & 255}.{n & 255}"

    async def new_row(
        self,
        *,
        name: str,
        shape: Shape,
        rootfs: str,
        image: Image,
        disk_mib: int,
        egress: list[str],
        envs: dict[str, str],
        copy_from: Sandbox | None = None,
    ) -> Sandbox:
        """A new sandbox with its disk and root mounted (a copy of ``copy_from``'s for a fork).
        The row is listed (``creating``) before the mounts, so its name is taken meanwhile."""
        sandbox_id = f"sb-{new_ulid().lower()}"
        host_uid = self.ids.take(sandbox_id) if self.isolation else -1
        sb = Sandbox(
            id=sandbox_id,
            name=name,
            shape=shape,
            rootfs=rootfs,
            image=image,
            layout=GuestLayout(self.sandboxes_dir / sandbox_id, host_uid=host_uid),
            cgroups=self.cgroups.create(sandbox_id, shape.mem_mib),
            ip=self._next_ip(),
            disk_mib=disk_mib,
            egress=egress,
            envs=envs,
        )
        self.rows[sandbox_id] = sb
        source = copy_from.layout if copy_from is not None else None
        sb.mounting = True
        try:
            await asyncio.to_thread(
                sb.layout.create, image, disk_mib, self.isolation, source, not self.ids.shared
            )
        except (OSError, subprocess.CalledProcessError) as exc:
            sb.status = "failed"
            sb.cgroups.remove()
            self.ids.give_back(host_uid, sandbox_id)
            raise ApiError(500, f"could not create the guest's disk: {exc}") from exc
        finally:
            sb.mounting = False
        if sb.terminal or sb.status == "destroying":  # deleted while its disk was being made
            await asyncio.to_thread(sb.layout.remove)
            self.ids.give_back(host_uid, sandbox_id)
        return sb

    def mark_running(self, sb: Sandbox, started: float) -> None:
        now = time.time()
        sb.status = "running"
        sb.running_at = now
        sb.spawn_ms = round((time.monotonic() - started) * 1000, 3)
        sb.last_activity = time.monotonic()

    # -- transitions --------------------------------------------------------------------
    def _schedule(self, sb: Sandbox, step: Callable[[], None]) -> None:
        async def run() -> None:
            delay = self.transition_delay()
            if delay > 0:
                await asyncio.sleep(delay)
            step()

        sb.transition = asyncio.create_task(run())

    def pause(self, sb: Sandbox) -> None:
        if sb.status != "running":
            raise ApiError(
                409, f"sandbox is {sb.status}; only a running sandbox can be paused", "invalid_state"
            )
        sb.status = "pausing"
        self._freeze(sb)

        def done() -> None:
            sb.status = "paused"
            sb.paused_at = time.time()

        self._schedule(sb, done)

    def resume(self, sb: Sandbox) -> None:
        if sb.status != "paused":
            raise ApiError(
                409, f"sandbox is {sb.status}; only a paused sandbox can be resumed", "invalid_state"
            )
        sb.status = "resuming"

        def done() -> None:
            self._thaw(sb)
            sb.status = "running"
            sb.last_resumed_at = time.time()
            sb.last_activity = time.monotonic()

        self._schedule(sb, done)

    def start_fork_child(self, child: Sandbox, start_paused: bool) -> None:
        if start_paused:
            child.status = "paused"
            child.paused_at = time.time()
            return
        started = time.monotonic()
        if self.transition_delay() <= 0:
            self.mark_running(child, started)
            return
        child.status = "forking"
        self._schedule(child, lambda: self.mark_running(child, started))

    def _freeze(self, sb: Sandbox) -> None:
        self._set_frozen(sb, frozen=True)
        sb.last_activity = time.monotonic()

    def _thaw(self, sb: Sandbox) -> None:
        self._set_frozen(sb, frozen=False)

    @staticmethod
    def _set_frozen(sb: Sandbox, frozen: bool) -> None:
        """The cgroup freezer when the sandbox has one, else SIGSTOP/SIGCONT to every guest
        process group (what a plane without writable cgroups, or --no-isolation, relies on)."""
        try:
            done = sb.cgroups.freeze() if frozen else sb.cgroups.thaw()
        except OSError:
            done = False
        if done:
            return
        sig = signal.SIGSTOP if frozen else signal.SIGCONT
        for proc in sb.processes:
            pids.signal_own_group(proc.proc, sig)

    def destroy(self, sb: Sandbox) -> None:
        if sb.terminal:
            return
        if sb.transition is not None:
            sb.transition.cancel()
        inline = sb.status in ("paused", "error", "creating", "failed")
        sb.status = "destroying"
        if inline:
            self._kill(sb)
            self._release(sb)
            self._finish(sb)
            return

        async def run() -> None:
            delay = self.transition_delay()
            if delay > 0:
                await asyncio.sleep(delay)
            self._kill(sb)
            await asyncio.to_thread(self._release, sb)
            self._finish(sb)

        task = asyncio.create_task(run())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    @staticmethod
    def _kill(sb: Sandbox) -> None:
        """Kill every guest process (thawing frozen ones, which cannot die while frozen)."""
        running = [proc for proc in sb.processes if proc.running]
        if running:
            log.info("deleting %s: killing its %d running exec(s)", sb.id, len(running))
        for proc in list(sb.processes):
            proc.kill()
        sb.cgroups.kill_all()
        sb.layout.kill_init()

    def _release(self, sb: Sandbox) -> None:
        """Free the cgroups, remove the files and hand the guest's host uid back (its
        processes are gone with its PID 1). Blocking: run it off the event loop."""
        sb.cgroups.remove()
        if not sb.mounting:  # else new_row removes them once the mounts are done
            sb.layout.remove()
            self.ids.give_back(sb.layout.host_uid, sb.id)

    @staticmethod
    def _finish(sb: Sandbox) -> None:
        sb.status = "destroyed"
        sb.destroyed_at = time.time()

    async def shutdown(self) -> None:
        for task in self._background:
            task.cancel()
        doomed = []
        for sb in self.rows.values():
            if sb.transition is not None:
                sb.transition.cancel()
            if not sb.terminal:
                self._kill(sb)
                doomed.append(sb)

        def release_all() -> None:
            for sb in doomed:
                self._release(sb)

        await asyncio.to_thread(release_all)
        for sb in doomed:
            self._finish(sb)
