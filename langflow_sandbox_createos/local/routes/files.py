"""A sandbox's files: upload one (streamed to its disk, capped), download one."""

from __future__ import annotations

import errno
import os

from starlette.requests import Request
from starlette.responses import Response

from ..envelope import ApiError, success
from ..files import FileDescriptorResponse, normalise, open_for_read, open_upload
from .parsing import authorized, sandbox


async def put(request: Request) -> Response:
    plane = authorized(request)
    sb = sandbox(plane, request)
    guest_path = normalise(request.query_params.get("path"))
    plane.store.require_running(sb)
    cap = plane.config.max_file_bytes
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > cap:
        raise ApiError(413, f"file exceeds the {cap}-byte upload limit", "file_too_large")
    owner = (sb.layout.host_uid, sb.layout.host_uid) if plane.config.isolation else None
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


async def get(request: Request) -> Response:
    plane = authorized(request)
    sb = sandbox(plane, request)
    guest_path = normalise(request.query_params.get("path"))
    plane.store.require_running(sb)
    fd, size = open_for_read(sb.layout.fs, guest_path)
    return FileDescriptorResponse(fd, size)
