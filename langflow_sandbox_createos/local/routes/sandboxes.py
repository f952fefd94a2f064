"""Sandboxes: create, list, get, patch, delete, pause, resume, fork and resize."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ..catalog import DEFAULT_DISK_MIB, DEFAULT_ROOTFS, SHAPES, Shape
from ..envelope import ApiError, bad_request, success
from ..plane import Plane
from ..store import Sandbox, Store, generated_name
from .parsing import (
    NAME_RE,
    authorized,
    auto_pause,
    envs,
    json_object,
    paginated,
    sandbox,
    string_list,
    typed,
)

LIST_STATUSES = ("running", "creating", "destroyed", "failed")


async def create(request: Request) -> Response:
    plane = authorized(request)
    store = plane.store
    body = await json_object(request)
    shape = _shape(body)
    rootfs_name = _rootfs(plane, body)
    name = typed(body, "name", str, "a string")
    if name is not None and not NAME_RE.match(name):
        raise bad_request(
            "name must be 1-22 characters of [a-z0-9-], starting with a letter or digit",
            "name",
            "invalid_name",
        )
    egress = string_list(body, "egress")
    env_vars = envs(body, "envs") or {}
    disk_mib = typed(body, "disk_mib", int, "an integer") or shape.default_disk_mib
    if disk_mib < 0:
        raise bad_request("disk_mib must not be negative", "disk_mib")
    pause_after = auto_pause(body)
    _refuse_what_create_does_not_serve(body)
    ssh_pubkeys = string_list(body, "ssh_pubkeys") or []
    ingress = bool(typed(body, "ingress_enabled", bool, "a boolean"))
    _check_quota(plane)
    if name is None:
        name = _unused_name(store)
    else:
        _refuse_taken(store, name)
    started = time.monotonic()
    sb = await store.new_row(
        name=name,
        shape=shape,
        rootfs=rootfs_name,
        image=plane.images[rootfs_name],
        disk_mib=disk_mib or DEFAULT_DISK_MIB,
        egress=egress or [],
        envs=env_vars,
    )
    sb.auto_pause_after_seconds = pause_after
    sb.ssh_pubkeys = ssh_pubkeys
    sb.ingress_enabled = ingress
    await _boot(plane, sb, started)
    return success(sb.view())


def _shape(body: dict[str, Any]) -> Shape:
    shape_id = typed(body, "shape", str, "a shape id")
    if not shape_id:
        raise bad_request("shape is required", "shape")
    shape = SHAPES.get(shape_id)
    if shape is None:
        raise bad_request(f"unknown shape {shape_id!r}; GET /v1/shapes lists them", "shape", "unknown_shape")
    return shape


def _rootfs(plane: Plane, body: dict[str, Any]) -> str:
    rootfs_name: str = typed(body, "rootfs", str, "a rootfs name") or DEFAULT_ROOTFS
    if rootfs_name not in plane.images:
        raise bad_request(
            f"unknown rootfs {rootfs_name!r}; GET /v1/rootfs lists them", "rootfs", "unknown_rootfs"
        )
    return rootfs_name


def _refuse_what_create_does_not_serve(body: dict[str, Any]) -> None:
    if typed(body, "bandwidth_quota_bytes", int, "an integer"):
        raise bad_request("bandwidth_quota_bytes cannot be set at create", "bandwidth_quota_bytes")
    region = typed(body, "region", str, "a string")
    if region and region != "local":
        raise bad_request(f"region {region!r} does not match this control plane's region 'local'", "region")
    if body.get("disks"):
        raise ApiError(503, "disks API not configured")


def _check_quota(plane: Plane) -> None:
    if len(plane.store.live()) >= plane.config.max_sandboxes:
        raise ApiError(
            403, f"quota exceeded: at most {plane.config.max_sandboxes} live sandboxes", "quota_exceeded"
        )


def _refuse_taken(store: Store, name: str) -> None:
    if store.name_taken(name):
        raise ApiError(409, f"a sandbox named {name!r} already exists", "name_conflict", "name")


def _unused_name(store: Store) -> str:
    name = generated_name()
    while store.name_taken(name):
        name = generated_name()
    return name


async def _boot(plane: Plane, sb: Sandbox, started: float) -> None:
    """Start the guest, wait out the configured (and injected) boot delay, then mark it running."""
    plane.boot(sb)
    delay_ms = plane.config.boot_delay_ms + plane.faults.boot_delay_ms
    if delay_ms:
        await asyncio.sleep(delay_ms / 1000)
    if sb.status != "creating":
        raise ApiError(409, f"sandbox was {sb.status} while booting", "invalid_state")
    plane.store.mark_running(sb, started)


async def list_(request: Request) -> Response:
    plane = authorized(request)
    status = request.query_params.get("status")
    if status and status not in LIST_STATUSES:
        raise bad_request(f"status filter must be one of {', '.join(LIST_STATUSES)}", "status")
    rows = [sb for sb in reversed(plane.store.rows.values()) if not status or sb.status == status]
    return success(paginated([sb.view() for sb in rows], request))


async def get(request: Request) -> Response:
    return success(sandbox(authorized(request), request).view())


async def patch(request: Request) -> Response:
    sb = sandbox(authorized(request), request)
    body = await json_object(request)
    if sb.terminal:
        raise ApiError(409, f"sandbox is {sb.status}", "invalid_state")
    pause_after = auto_pause(body)
    ingress = typed(body, "ingress_enabled", bool, "a boolean")
    disable = typed(body, "disable_auto_pause", bool, "a boolean")
    if pause_after is not None:
        sb.auto_pause_after_seconds = pause_after
        sb.last_activity = time.monotonic()
    if disable:
        sb.auto_pause_after_seconds = None
    if ingress is not None:
        sb.ingress_enabled = ingress
    return success(sb.view())


async def delete(request: Request) -> Response:
    plane = authorized(request)
    sb = sandbox(plane, request)
    plane.store.destroy(sb)
    return success({"id": sb.id, "status": sb.status})


async def pause(request: Request) -> Response:
    plane = authorized(request)
    sb = sandbox(plane, request)
    plane.store.pause(sb)
    return success(sb.view())


async def resume(request: Request) -> Response:
    plane = authorized(request)
    sb = sandbox(plane, request)
    plane.store.resume(sb)
    return success(sb.view())


async def fork(request: Request) -> Response:
    plane = authorized(request)
    store = plane.store
    source = sandbox(plane, request)
    body = await json_object(request, required=False)
    if source.status not in ("paused", "pausing"):
        raise ApiError(409, f"only a paused sandbox can be forked (status: {source.status})", "invalid_state")
    if typed(body, "bandwidth_quota_bytes", int, "an integer"):
        raise bad_request("bandwidth_quota_bytes is not supported by createos-local", "bandwidth_quota_bytes")
    name = typed(body, "name", str, "a string")
    if name is not None and not NAME_RE.match(name):
        raise bad_request("name must be 1-22 characters of [a-z0-9-]", "name", "invalid_name")
    if name is not None:
        _refuse_taken(store, name)
    _check_quota(plane)
    egress = string_list(body, "egress")
    env_vars = envs(body, "envs")
    child = await store.new_row(
        name=_unused_name(store) if name is None else name,
        shape=source.shape,
        rootfs=source.rootfs,
        image=source.image,
        disk_mib=source.disk_mib,
        egress=list(source.egress) if egress is None else egress,
        envs=dict(source.envs) if env_vars is None else env_vars,
        copy_from=source,
    )
    child.forked_from = source.id
    child.auto_pause_after_seconds = source.auto_pause_after_seconds
    child.ssh_pubkeys = string_list(body, "ssh_pubkeys") or list(source.ssh_pubkeys)
    ingress = typed(body, "ingress_enabled", bool, "a boolean")
    child.ingress_enabled = source.ingress_enabled if ingress is None else ingress
    store.start_fork_child(child, bool(typed(body, "start_paused", bool, "a boolean")))
    return success(child.view())


async def resize(request: Request) -> Response:
    sb = sandbox(authorized(request), request)
    body = await json_object(request)
    disk_mib = typed(body, "disk_mib", int, "an integer")
    if disk_mib is None:
        raise bad_request("disk_mib is required", "disk_mib")
    if disk_mib < sb.disk_mib:
        raise bad_request(f"disk_mib can only grow (now {sb.disk_mib})", "disk_mib")
    if sb.terminal or sb.status == "destroying":
        raise ApiError(409, f"sandbox is {sb.status}", "invalid_state")
    await asyncio.to_thread(sb.layout.resize, disk_mib)
    sb.disk_mib = disk_mib
    return success({"id": sb.id, "disk_mib": disk_mib})
