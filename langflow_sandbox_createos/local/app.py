"""The Starlette application: every control-plane route, admin routes and error handling."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hmac
import json
import logging
import os
import re
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route
from starlette.types import ASGIApp, Scope

from .catalog import DEFAULT_DISK_MIB, DEFAULT_ROOTFS, SHAPES
from .cgroups import GUEST_PIDS_MAX, CgroupManager
from .config import ServerConfig
from .envelope import ApiError, bad_request, error, fail, success
from .execution import ExecStreamResponse, run_buffered
from .faults import FaultMiddleware, FaultSet
from .files import FileDescriptorResponse, normalise, open_for_read, open_upload
from .images import GUEST_HOME, HOST_GUEST_GID, HOST_GUEST_UID, Image, build_images
from .jailer import ExecRequest, GuestRunner, isolation_probe
from .mounts import umount
from .network import EgressPolicy, host_addresses
from .stats import Counters, StatsMiddleware
from .store import Sandbox, Store, generated_name

log = logging.getLogger("createos.local")

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,21}$")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
LIST_STATUSES = ("running", "creating", "destroyed", "failed")
AUTO_PAUSE_RANGE = (60, 86400)
UNAUTHENTICATED = frozenset({"healthz", "readyz", "shapes", "rootfs"})


class Plane:
    """Everything the routes share: settings, sandboxes, guest runner, faults, counters."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.state_dir = config.state_dir.resolve()
        self.images: dict[str, Image] = {}
        self.cgroups = CgroupManager(enabled=config.memory_limits or config.isolation)
        self.memory_enforced: str | bool = False
        if config.memory_limits:
            self.memory_enforced = "cgroup" if self.cgroups.memory_parent is not None else "rlimit"
        self.runner = GuestRunner(self.state_dir, config.isolation, self.memory_enforced)
        self.store = Store(
            self.state_dir, self.cgroups, self.transition_delay, config.unique_names, config.isolation
        )
        if config.guests_dir is not None:
            self.store.sandboxes_dir = config.guests_dir
        self.faults = FaultSet()
        self.counters = Counters()
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
        self.images, notes = await asyncio.to_thread(
            build_images, self.state_dir / "images", self.config.rootfs, self.config.isolation
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
                    await net.apply(net.policy, current)
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
            "http_versions": dict(self.counters.http_versions),
            "bytes_sent": self.counters.bytes_sent,
            "memory_enforced": self.memory_enforced,
            "pids_limit": GUEST_PIDS_MAX if self.cgroups.pids_parent is not None else None,
            "freezer": "cgroup" if self.cgroups.freezer_parent is not None else "signals",
            "isolation": "bwrap" if self.config.isolation else False,
            "streaming": self.streaming_enabled,
            "faults": self.faults.as_json(),
            "sandboxes": [
                {"id": sb.id, "name": sb.name, "status": sb.status, "created_at": sb.view()["created_at"]}
                for sb in self.store.rows.values()
            ],
        }


# -- request parsing ----------------------------------------------------------------------
MAX_JSON_BYTES = 64 * 1024 * 1024


async def json_object(request: Request, required: bool = True) -> dict[str, Any]:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_JSON_BYTES:
        raise ApiError(413, f"JSON body over {MAX_JSON_BYTES} bytes", "body_too_large")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_JSON_BYTES:
            raise ApiError(413, f"JSON body over {MAX_JSON_BYTES} bytes", "body_too_large")
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        if required:
            raise bad_request("request body must be a JSON object")
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"malformed JSON body: {exc}") from exc
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object")
    return body


def _typed(body: dict[str, Any], key: str, kind: type | tuple[type, ...], what: str) -> Any:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise bad_request(f"{key} must be {what}", key)
    return value


def _no_nul(value: str, key: str) -> str:
    """A NUL would end the string at the kernel (argv, env): refuse it rather than cut it."""
    if "\0" in value:
        raise bad_request(f"{key} must not contain a NUL character (at position {value.index(chr(0))})", key)
    return value


def _string_list(body: dict[str, Any], key: str) -> list[str] | None:
    value = _typed(body, key, list, "a list of strings")
    if value is not None and not all(isinstance(v, str) for v in value):
        raise bad_request(f"{key} must be a list of strings", key)
    if value is not None:
        for i, item in enumerate(value):
            _no_nul(item, f"{key}[{i}]")
    return value


def _envs(body: dict[str, Any], key: str) -> dict[str, str] | None:
    value = _typed(body, key, dict, "an object of string values")
    if value is None:
        return None
    for k, v in value.items():
        if not ENV_KEY_RE.match(k):
            raise bad_request(f"invalid environment variable name {k!r}", key)
        if not isinstance(v, str):
            raise bad_request(f"{key}.{k} must be a string", key)
        _no_nul(v, f"{key}.{k}")
    return dict(value)


def _auto_pause(body: dict[str, Any]) -> int | None:
    value = _typed(body, "auto_pause_after_seconds", int, "an integer")
    low, high = AUTO_PAUSE_RANGE
    if value is not None and value != 0 and not low <= value <= high:
        raise bad_request(
            f"auto_pause_after_seconds must be between {low} and {high}", "auto_pause_after_seconds"
        )
    return value or None


def _query_int(request: Request, key: str, default: int) -> int:
    raw = request.query_params.get(key)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise bad_request(f"{key} must be an integer", key) from exc


def _paginated(rows: list[Any], request: Request) -> dict[str, Any]:
    limit = min(max(_query_int(request, "limit", 50), 1), 500)
    offset = max(_query_int(request, "offset", 0), 0)
    page = rows[offset : offset + limit]
    return {
        "data": page,
        "pagination": {"total": len(rows), "limit": limit, "offset": offset, "count": len(page)},
    }


# -- routes --------------------------------------------------------------------------------
def build_app(plane: Plane) -> ASGIApp:
    store = plane.store

    def sandbox(request: Request) -> Sandbox:
        return store.get(request.path_params["sandbox_id"])

    async def healthz(request: Request) -> Response:
        return success({"up": True})

    async def readyz(request: Request) -> Response:
        return success({"ready": True})

    async def whoami(request: Request) -> Response:
        plane.authorize(request)
        live = store.live()
        running = sum(sb.status == "running" for sb in live)
        paused = sum(sb.status == "paused" for sb in live)
        counts = {
            "running": running,
            "paused": paused,
            "other": len(live) - running - paused,
            "total": len(live),
        }
        # what the guests really are, so a client can tell (the real service says nothing: microVMs)
        isolation = "namespaces" if plane.config.isolation else "none"
        return success(
            {"user_id": "local-user", "name": "createos-local", "isolation": isolation, "stats": counts}
        )

    async def shapes(request: Request) -> Response:
        return success(_paginated([s.as_json() for s in SHAPES.values()], request))

    def catalog() -> dict[str, Image]:
        return {name: image for name, image in plane.images.items() if image.template_id is None}

    def templates() -> list[Image]:
        return [image for name, image in plane.images.items() if name == image.template_id]

    async def rootfs(request: Request) -> Response:
        images = catalog()
        entries = [{"name": n, "description": i.description, "deprecated": False} for n, i in images.items()]
        return success({"rootfs": list(images), "default": DEFAULT_ROOTFS, "entries": entries})

    async def templates_list(request: Request) -> Response:
        plane.authorize(request)
        rows = [
            {"id": i.template_id, "name": i.name, "base": DEFAULT_ROOTFS, "status": "ready"}
            for i in templates()
        ]
        return success(_paginated(rows, request))

    async def resize(request: Request) -> Response:
        plane.authorize(request)
        sb = sandbox(request)
        body = await json_object(request)
        disk_mib = _typed(body, "disk_mib", int, "an integer")
        if disk_mib is None:
            raise bad_request("disk_mib is required", "disk_mib")
        if disk_mib < sb.disk_mib:
            raise bad_request(f"disk_mib can only grow (now {sb.disk_mib})", "disk_mib")
        if sb.terminal or sb.status == "destroying":
            raise ApiError(409, f"sandbox is {sb.status}", "invalid_state")
        await asyncio.to_thread(sb.layout.resize, disk_mib)
        sb.disk_mib = disk_mib
        return success({"id": sb.id, "disk_mib": disk_mib})

    async def create(request: Request) -> Response:
        plane.authorize(request)
        body = await json_object(request)
        shape_id = _typed(body, "shape", str, "a shape id")
        if not shape_id:
            raise bad_request("shape is required", "shape")
        shape = SHAPES.get(shape_id)
        if shape is None:
            raise bad_request(
                f"unknown shape {shape_id!r}; GET /v1/shapes lists them", "shape", "unknown_shape"
            )
        rootfs_name = _typed(body, "rootfs", str, "a rootfs name") or DEFAULT_ROOTFS
        if rootfs_name not in plane.images:
            raise bad_request(
                f"unknown rootfs {rootfs_name!r}; GET /v1/rootfs lists them", "rootfs", "unknown_rootfs"
            )
        name = _typed(body, "name", str, "a string")
        if name is not None and not NAME_RE.match(name):
            raise bad_request(
                "name must be 1-22 characters of [a-z0-9-], starting with a letter or digit",
                "name",
                "invalid_name",
            )
        egress = _string_list(body, "egress")
        envs = _envs(body, "envs") or {}
        disk_mib = _typed(body, "disk_mib", int, "an integer") or shape.default_disk_mib
        if disk_mib < 0:
            raise bad_request("disk_mib must not be negative", "disk_mib")
        auto_pause = _auto_pause(body)
        if _typed(body, "bandwidth_quota_bytes", int, "an integer"):
            raise bad_request("bandwidth_quota_bytes cannot be set at create", "bandwidth_quota_bytes")
        region = _typed(body, "region", str, "a string")
        if region and region != "local":
            raise bad_request(
                f"region {region!r} does not match this control plane's region 'local'", "region"
            )
        if body.get("disks"):
            raise ApiError(503, "disks API not configured")
        ssh_pubkeys = _string_list(body, "ssh_pubkeys") or []
        ingress = bool(_typed(body, "ingress_enabled", bool, "a boolean"))
        if len(store.live()) >= plane.config.max_sandboxes:
            raise ApiError(
                403, f"quota exceeded: at most {plane.config.max_sandboxes} live sandboxes", "quota_exceeded"
            )
        if name is None:
            name = generated_name()
            while store.name_taken(name):
                name = generated_name()
        elif store.name_taken(name):
            raise ApiError(409, f"a sandbox named {name!r} already exists", "name_conflict", "name")
        started = time.monotonic()
        sb = await store.new_row(
            name=name,
            shape=shape,
            rootfs=rootfs_name,
            image=plane.images[rootfs_name],
            disk_mib=disk_mib or DEFAULT_DISK_MIB,
            egress=egress or [],
            envs=envs,
        )
        sb.auto_pause_after_seconds = auto_pause
        sb.ssh_pubkeys = ssh_pubkeys
        sb.ingress_enabled = ingress
        plane.boot(sb)
        delay_ms = plane.config.boot_delay_ms + plane.faults.boot_delay_ms
        if delay_ms:
            await asyncio.sleep(delay_ms / 1000)
        if sb.status != "creating":
            raise ApiError(409, f"sandbox was {sb.status} while booting", "invalid_state")
        store.mark_running(sb, started)
        return success(sb.view())

    async def list_sandboxes(request: Request) -> Response:
        plane.authorize(request)
        status = request.query_params.get("status")
        if status and status not in LIST_STATUSES:
            raise bad_request(f"status filter must be one of {', '.join(LIST_STATUSES)}", "status")
        rows = [sb for sb in reversed(store.rows.values()) if not status or sb.status == status]
        return success(_paginated([sb.view() for sb in rows], request))

    async def get_sandbox(request: Request) -> Response:
        plane.authorize(request)
        return success(sandbox(request).view())

    async def patch_sandbox(request: Request) -> Response:
        plane.authorize(request)
        sb = sandbox(request)
        body = await json_object(request)
        if sb.terminal:
            raise ApiError(409, f"sandbox is {sb.status}", "invalid_state")
        auto_pause = _auto_pause(body)
        ingress = _typed(body, "ingress_enabled", bool, "a boolean")
        disable = _typed(body, "disable_auto_pause", bool, "a boolean")
        if auto_pause is not None:
            sb.auto_pause_after_seconds = auto_pause
            sb.last_activity = time.monotonic()
        if disable:
            sb.auto_pause_after_seconds = None
        if ingress is not None:
            sb.ingress_enabled = ingress
        return success(sb.view())

    async def delete_sandbox(request: Request) -> Response:
        plane.authorize(request)
        sb = sandbox(request)
        store.destroy(sb)
        return success({"id": sb.id, "status": sb.status})

    async def pause(request: Request) -> Response:
        plane.authorize(request)
        sb = sandbox(request)
        store.pause(sb)
        return success(sb.view())

    async def resume(request: Request) -> Response:
        plane.authorize(request)
        sb = sandbox(request)
        store.resume(sb)
        return success(sb.view())

    async def fork(request: Request) -> Response:
        plane.authorize(request)
        source = sandbox(request)
        body = await json_object(request, required=False)
        if source.status not in ("paused", "pausing"):
            raise ApiError(
                409, f"only a paused sandbox can be forked (status: {source.status})", "invalid_state"
            )
        if _typed(body, "bandwidth_quota_bytes", int, "an integer"):
            raise bad_request(
                "bandwidth_quota_bytes is not supported by createos-local", "bandwidth_quota_bytes"
            )
        name = _typed(body, "name", str, "a string")
        if name is not None and not NAME_RE.match(name):
            raise bad_request("name must be 1-22 characters of [a-z0-9-]", "name", "invalid_name")
        if name is not None and store.name_taken(name):
            raise ApiError(409, f"a sandbox named {name!r} already exists", "name_conflict", "name")
        if len(store.live()) >= plane.config.max_sandboxes:
            raise ApiError(
                403, f"quota exceeded: at most {plane.config.max_sandboxes} live sandboxes", "quota_exceeded"
            )
        egress = _string_list(body, "egress")
        envs = _envs(body, "envs")
        while name is None or store.name_taken(name):
            name = generated_name()
        child = await store.new_row(
            name=name,
            shape=source.shape,
            rootfs=source.rootfs,
            image=source.image,
            disk_mib=source.disk_mib,
            egress=list(source.egress) if egress is None else egress,
            envs=dict(source.envs) if envs is None else envs,
            copy_from=source,
        )
        child.forked_from = source.id
        child.auto_pause_after_seconds = source.auto_pause_after_seconds
        child.ssh_pubkeys = _string_list(body, "ssh_pubkeys") or list(source.ssh_pubkeys)
        ingress = _typed(body, "ingress_enabled", bool, "a boolean")
        child.ingress_enabled = source.ingress_enabled if ingress is None else ingress
        store.start_fork_child(child, bool(_typed(body, "start_paused", bool, "a boolean")))
        return success(child.view())

    async def egress_get(request: Request) -> Response:
        plane.authorize(request)
        sb = sandbox(request)
        return success({"id": sb.id, "egress": list(sb.egress)})

    async def egress_put(request: Request) -> Response:
        plane.authorize(request)
        sb = sandbox(request)
        body = await json_object(request)
        if "egress" not in body:
            raise bad_request("egress is required (a list of rules, or null for allow-all)", "egress")
        egress = _string_list(body, "egress")
        if sb.terminal:
            raise ApiError(409, f"sandbox is {sb.status}", "invalid_state")
        sb.egress = egress or []
        return success({"id": sb.id, "egress": list(sb.egress)})

    async def files_put(request: Request) -> Response:
        plane.authorize(request)
        sb = sandbox(request)
        guest_path = normalise(request.query_params.get("path"))
        store.require_running(sb)
        cap = plane.config.max_file_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > cap:
            raise ApiError(413, f"file exceeds the {cap}-byte upload limit", "file_too_large")
        owner = (HOST_GUEST_UID, HOST_GUEST_GID) if plane.config.isolation else None
        upload = open_upload(sb.layout.fs, guest_path, owner)
        size = 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > cap:
                    raise ApiError(413, f"file exceeds the {cap}-byte upload limit", "file_too_large")
                try:
                    os.write(upload.fd, chunk)
                except OSError as exc:
                    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                        raise ApiError(
                            507, f"the sandbox's disk ({sb.disk_mib} MiB) is full; resize it", "disk_full"
                        ) from exc
                    raise
            upload.commit()
        finally:
            upload.close()
        return success({"path": guest_path, "size": size})

    async def files_get(request: Request) -> Response:
        plane.authorize(request)
        sb = sandbox(request)
        guest_path = normalise(request.query_params.get("path"))
        store.require_running(sb)
        fd, size = open_for_read(sb.layout.fs, guest_path)
        return FileDescriptorResponse(fd, size)

    async def exec_(request: Request) -> Response:
        plane.authorize(request)
        sb = sandbox(request)
        body = await json_object(request)
        cmd = _typed(body, "cmd", str, "a string")
        if not cmd:
            raise bad_request("cmd is required", "cmd")
        _no_nul(cmd, "cmd")
        args = _string_list(body, "args") or []
        env = _envs(body, "env") or {}
        stdin = _typed(body, "stdin", str, "a string")
        stream_flag = _typed(body, "stream", bool, "a boolean")
        stream = request.query_params.get("stream", "").lower() in ("1", "true") or bool(stream_flag)
        if stream and not plane.streaming_enabled:
            raise ApiError(404, "streaming exec is not supported by this control plane", "not_found")
        store.require_running(sb)
        undeclared = sorted(set(env) - set(sb.envs))
        if undeclared:
            raise bad_request(
                f"env keys must be declared at create; not declared: {', '.join(undeclared)}",
                "env",
                "env_not_declared",
            )
        sb.last_activity = time.monotonic()
        guest_env = {
            **dict(sb.image.env),
            "HOME": GUEST_HOME,
            "LANG": "C.UTF-8",
            "HOSTNAME": sb.name or sb.id,
            "CREATEOS_SANDBOX_ID": sb.id,
            "CREATEOS_SANDBOX_NAME": sb.name,
            **sb.envs,
            **env,
        }
        req = ExecRequest(
            sandbox_id=sb.id,
            hostname=sb.name or sb.id,
            layout=sb.layout,
            image=sb.image,
            egress=list(sb.egress),
            env=guest_env,
            cmd=cmd,
            args=args,
            cgroups=sb.cgroups,
            mem_mib=sb.shape.mem_mib,
        )
        stdin_bytes = stdin.encode() if stdin is not None else None
        if stream:
            return ExecStreamResponse(plane.runner, sb, req, stdin_bytes, plane.config.heartbeat_seconds)
        result = await run_buffered(
            plane.runner, sb, req, stdin_bytes, plane.config.max_exec_output_bytes, request.receive
        )
        if result is None:
            return Response(status_code=499)
        return success(result)

    # -- admin ----------------------------------------------------------------------------
    def admin_only(request: Request) -> None:
        """Admin routes: loopback clients with the API key. A guest whose egress allows all
        shares the host's network namespace and can reach this socket; without the key
        (which no guest is given) it gets 401 like on every /v1 route."""
        host = request.client.host if request.client else ""
        if host not in ("127.0.0.1", "::1", "localhost") and not host.startswith("127."):
            raise ApiError(403, "admin routes are served to loopback clients only", "forbidden")
        plane.authorize(request)

    async def local_stats(request: Request) -> Response:
        admin_only(request)
        return Response(json.dumps(plane.stats()), media_type="application/json")

    async def local_network(request: Request) -> Response:
        """One guest's network as the kernel holds it: for tests and operators."""
        admin_only(request)
        sb = sandbox(request)
        net = sb.layout.network
        policy = EgressPolicy.parse(sb.egress)
        view: dict[str, Any] = {
            "id": sb.id,
            "egress": list(sb.egress),
            "allow_all": policy.allow_all,
            "enforced": [str(n) for n in policy.networks] + [f"{a}:{p}" for a, p in policy.ports],
            "not_enforced": list(policy.unenforced),
            "namespace": net is not None,
            "nat": net.nat_running if net is not None else False,
            "rules": await net.read_back() if net is not None else None,
        }
        return Response(json.dumps(view), media_type="application/json")

    async def local_faults(request: Request) -> Response:
        admin_only(request)
        if request.method == "PUT":
            plane.faults = FaultSet.parse(await json_object(request))
        elif request.method == "DELETE":
            plane.faults = FaultSet()
        return success(plane.faults.as_json())

    # -- error handling -------------------------------------------------------------------
    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return exc.response()

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 405:
            message = f"method {request.method} not allowed on {request.url.path}"
        elif exc.status_code == 404:
            message = f"no route for {request.method} {request.url.path}"
        else:
            message = str(exc.detail)
        headers = dict(exc.headers) if exc.headers else None
        if exc.status_code >= 500:
            return error(message, exc.status_code, headers)
        return fail({"message": message, "code": "http_error"}, exc.status_code, headers)

    async def internal_error(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error(f"internal error: {type(exc).__name__}", 500)

    sb_path = "/v1/sandboxes/{sandbox_id}"
    routes = [
        Route("/healthz", healthz, methods=["GET"], name="healthz"),
        Route("/readyz", readyz, methods=["GET"], name="readyz"),
        Route("/v1/whoami", whoami, methods=["GET"], name="whoami"),
        Route("/v1/shapes", shapes, methods=["GET"], name="shapes"),
        Route("/v1/rootfs", rootfs, methods=["GET"], name="rootfs"),
        Route("/v1/templates", templates_list, methods=["GET"], name="templates"),
        Route("/v1/sandboxes", create, methods=["POST"], name="create"),
        Route("/v1/sandboxes", list_sandboxes, methods=["GET"], name="list"),
        Route(sb_path, get_sandbox, methods=["GET"], name="get"),
        Route(sb_path, patch_sandbox, methods=["PATCH"], name="patch"),
        Route(sb_path, delete_sandbox, methods=["DELETE"], name="delete"),
        Route(f"{sb_path}/pause", pause, methods=["POST"], name="pause"),
        Route(f"{sb_path}/resume", resume, methods=["POST"], name="resume"),
        Route(f"{sb_path}/fork", fork, methods=["POST"], name="fork"),
        Route(f"{sb_path}/resize", resize, methods=["POST"], name="resize"),
        Route(f"{sb_path}/egress", egress_get, methods=["GET"], name="egress_get"),
        Route(f"{sb_path}/egress", egress_put, methods=["PUT"], name="egress_put"),
        Route(f"{sb_path}/files", files_put, methods=["PUT"], name="files_put"),
        Route(f"{sb_path}/files", files_get, methods=["GET"], name="files_get"),
        Route(f"{sb_path}/exec", exec_, methods=["POST"], name="exec"),
        Route("/_local/stats", local_stats, methods=["GET"], name="local_stats"),
        Route("/_local/sandboxes/{sandbox_id}/network", local_network, methods=["GET"], name="local_network"),
        Route("/_local/faults", local_faults, methods=["GET", "PUT", "DELETE"], name="local_faults"),
    ]

    def classify(scope: Scope) -> str:
        partial = None
        for route in routes:
            match, _ = route.matches(scope)
            if match is Match.FULL:
                name = route.name
                if name == "exec" and _query_flag(scope, b"stream"):
                    return "exec_stream"
                return name
            if match is Match.PARTIAL and partial is None:
                partial = route.name
        return partial or "not_found"

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await plane.start()
        try:
            yield
        finally:
            await plane.stop()

    handlers: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
        ApiError: api_error,
        HTTPException: http_error,
        Exception: internal_error,
    }
    app = Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan)  # type: ignore[arg-type]
    # outside Starlette's own error middleware, so even a 500 carries X-Request-Id
    return StatsMiddleware(FaultMiddleware(app, plane), plane.counters, classify)


def _query_flag(scope: Scope, key: bytes) -> bool:
    for part in scope.get("query_string", b"").split(b"&"):
        name, _, value = part.partition(b"=")
        if name == key and value.lower() in (b"1", b"true"):
            return True
    return False


def check_isolation(config: ServerConfig) -> str | None:
    """None when guests can be isolated (or isolation is off), else why not."""
    if not config.isolation:
        return None
    reason = isolation_probe(shutil.which("bwrap"))
    if reason:
        return f"{reason}. Start with --no-isolation to run guests as plain host processes."
    return None
