"""What every route shares: settings, sandboxes, the jailer, faults and counters (``Plane``)."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import shutil
import time
from typing import Any, Protocol

from starlette.requests import Request

from .cgroups import GUEST_PIDS_MAX, CgroupManager
from .config import ServerConfig
from .envelope import ApiError
from .faults import FaultSet
from .identity import GuestIds, idmap_problem
from .images import Image, build_images
from .jailer import GuestRunner, isolation_probe
from .mounts import umount
from .network import host_addresses
from .stats import Counters
from .store import Sandbox, Store

log = logging.getLogger("createos.local")


class HeldConnections(Protocol):
    """What the plane reads of the HTTP/1.1 server's connection guard (``server.ConnectionGuard``):
    the connections that have not shown the key yet."""

    @property
    def waiting(self) -> int: ...


class Plane:
    """Everything the routes share: settings, sandboxes, the jailer, faults, counters."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.state_dir = config.state_dir.resolve()
        self.images: dict[str, Image] = {}
        self.cgroups = CgroupManager(enabled=config.memory_limits or config.isolation)
        self.memory_enforced: str | bool = False
        if config.memory_limits:
            self.memory_enforced = "cgroup" if self.cgroups.memory_parent is not None else "rlimit"
        self.runner = GuestRunner(self.state_dir, config.isolation, self.memory_enforced)
        self.ids = GuestIds(config.guest_uid_base, config.shared_guest_uid)
        self.store = Store(
            self.state_dir,
            self.cgroups,
            self.transition_delay,
            config.unique_names,
            config.isolation,
            self.ids,
        )
        if config.guests_dir is not None:
            self.store.sandboxes_dir = config.guests_dir
        self.faults = FaultSet()
        self.counters = Counters()
        self.connection_guard: HeldConnections | None = None  # set by the HTTP/1.1 server
        self._auto_pause: asyncio.Task[None] | None = None
        self._boots: set[asyncio.Task[None]] = set()

    def boot(self, sb: Sandbox) -> None:
        """Start the guest's PID 1 now, off the request, so the first exec finds it running
        (the exec waits for it if it is still starting, and starts it if this failed)."""
        if not self.config.isolation:
            return

        async def start() -> None:
            try:
                await self.runner.ensure_init(sb.layout, sb.name or sb.id, sb.cgroups, sb.shape.mem_mib)
            except Exception:  # the first exec tries again and reports why
                log.debug("early start of %s's PID 1 failed", sb.id, exc_info=True)
            if sb.terminal or sb.status == "destroying":
                sb.layout.kill_init()

        task = asyncio.create_task(start())
        self._boots.add(task)
        task.add_done_callback(self._boots.discard)

    def transition_delay(self) -> float:
        return self.config.transition_delay_ms / 1000

    @property
    def streaming_enabled(self) -> bool:
        return self.faults.streaming if self.faults.streaming is not None else self.config.streaming

    def authorize(self, request: Request) -> None:
        key = request.headers.get("x-api-key", "")
        if not key or not hmac.compare_digest(key.encode(), self.config.api_key.encode()):
            raise ApiError(401, "invalid api key" if key else "missing api key", "unauthorized")

    async def start(self) -> None:
        if self.config.isolation and not self.ids.shared:
            problem = await asyncio.to_thread(idmap_problem, self.state_dir / "idmap-probe", self.ids.base)
            if problem:
                log.warning("%s: every guest's root is the one host uid %d instead", problem, self.ids.base)
                self.ids.shared = True
        owner = self.ids.base if self.config.isolation and self.ids.shared else None
        self.images, notes = await asyncio.to_thread(
            build_images, self.state_dir / "images", self.config.rootfs, self.config.isolation, owner
        )
        for note in notes:
            log.warning("%s", note)
        self._auto_pause = asyncio.create_task(self._auto_pause_loop())

    async def stop(self) -> None:
        if self._auto_pause is not None:
            self._auto_pause.cancel()
        self.runner.kill_all()
        await self.store.shutdown()
        await asyncio.to_thread(self.cgroups.close)
        if self.config.isolation:  # the images' tmpfs, now that no guest root uses it
            with contextlib.suppress(OSError):
                umount(self.state_dir / "images")

    async def _auto_pause_loop(self) -> None:
        unit = self.config.auto_pause_unit_ms / 1000
        tick = min(1.0, max(unit / 4, 0.02))
        while True:
            await asyncio.sleep(tick)
            if self.config.isolation:
                await self._refresh_host_addresses()
            now = time.monotonic()
            for sb in self.store.live():
                limit = sb.auto_pause_after_seconds
                if sb.status == "running" and limit and now - sb.last_activity >= limit * unit:
                    log.info("auto-pausing %s after %ss idle", sb.id, limit)
                    try:
                        self.store.pause(sb)
                    except Exception:  # keep the clock running for the other sandboxes
                        log.exception("auto-pause of %s failed", sb.id)

    async def _refresh_host_addresses(self) -> None:
        """A guest refuses every address of the host: when the host gains one (a new interface,
        a DHCP lease), every guest's rules learn it within a tick."""
        current = host_addresses()
        if current == self.runner.host_addresses:
            return
        self.runner.host_addresses = current
        for sb in self.store.live():
            net = sb.layout.network
            if net is not None and net.policy is not None:
                try:
                    await net.apply(sb.egress_rules, current)
                except OSError:
                    log.exception("could not update %s's network rules to the host's new addresses", sb.id)

    def stats(self) -> dict[str, Any]:
        by_state: dict[str, int] = {}
        for sb in self.store.rows.values():
            by_state[sb.status] = by_state.get(sb.status, 0) + 1
        return {
            "pid": os.getpid(),
            "requests": dict(self.counters.requests),
            "responses_by_status": dict(self.counters.statuses),
            "sandboxes_by_state": by_state,
            "live": len(self.store.live()),
            "guest_processes": self.runner.live_processes,
            "connections_opened": self.counters.connections_opened,
            "connections_open": self.counters.connections_open,
            "connections_refused": self.counters.connections_refused,
            "connections_unauthenticated": self.connection_guard.waiting if self.connection_guard else None,
            "http_versions": dict(self.counters.http_versions),
            "bytes_sent": self.counters.bytes_sent,
            "memory_enforced": self.memory_enforced,
            "pids_limit": GUEST_PIDS_MAX if self.cgroups.pids_parent is not None else None,
            "freezer": "cgroup" if self.cgroups.freezer_parent is not None else "signals",
            "isolation": "bwrap" if self.config.isolation else False,
            "guest_uids": ("shared" if self.ids.shared else "per-guest") if self.config.isolation else None,
            "streaming": self.streaming_enabled,
            "faults": self.faults.as_json(),
            "sandboxes": [
                {
                    "id": sb.id,
                    "name": sb.name,
                    "status": sb.status,
                    "created_at": sb.view()["created_at"],
                    "host_uid": sb.layout.host_uid if self.config.isolation else None,
                }
                for sb in self.store.rows.values()
            ],
        }


def check_isolation(config: ServerConfig) -> str | None:
    """None when guests can be isolated (or isolation is off), else why not."""
    if not config.isolation:
        return None
    reason = isolation_probe(shutil.which("bwrap"), config.guest_uid_base)
    if reason:
        return f"{reason}. Start with --no-isolation to run guests as plain host processes."
    return None
