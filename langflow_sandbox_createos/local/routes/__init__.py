"""createos-local's HTTP surface: the route table, error handling and the middleware around it.

Each resource's handlers live in a module of their own (``meta``, ``sandboxes``, ``egress``,
``files``, ``exec``, ``admin``); every handler reads the ``Plane`` from ``request.app.state``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route
from starlette.types import ASGIApp, Scope

from ..envelope import ApiError, error, fail
from ..faults import FaultMiddleware
from ..plane import Plane
from ..stats import StatsMiddleware
from . import admin, egress, files, meta, sandboxes
from .exec import exec_

log = logging.getLogger("createos.local")

SB_PATH = "/v1/sandboxes/{sandbox_id}"
ROUTES = [
    Route("/healthz", meta.healthz, methods=["GET"], name="healthz"),
    Route("/readyz", meta.readyz, methods=["GET"], name="readyz"),
    Route("/v1/whoami", meta.whoami, methods=["GET"], name="whoami"),
    Route("/v1/shapes", meta.shapes, methods=["GET"], name="shapes"),
    Route("/v1/rootfs", meta.rootfs, methods=["GET"], name="rootfs"),
    Route("/v1/templates", meta.templates, methods=["GET"], name="templates"),
    Route("/v1/sandboxes", sandboxes.create, methods=["POST"], name="create"),
    Route("/v1/sandboxes", sandboxes.list_, methods=["GET"], name="list"),
    Route(SB_PATH, sandboxes.get, methods=["GET"], name="get"),
    Route(SB_PATH, sandboxes.patch, methods=["PATCH"], name="patch"),
    Route(SB_PATH, sandboxes.delete, methods=["DELETE"], name="delete"),
    Route(f"{SB_PATH}/pause", sandboxes.pause, methods=["POST"], name="pause"),
    Route(f"{SB_PATH}/resume", sandboxes.resume, methods=["POST"], name="resume"),
    Route(f"{SB_PATH}/fork", sandboxes.fork, methods=["POST"], name="fork"),
    Route(f"{SB_PATH}/resize", sandboxes.resize, methods=["POST"], name="resize"),
    Route(f"{SB_PATH}/egress", egress.get, methods=["GET"], name="egress_get"),
    Route(f"{SB_PATH}/egress", egress.put, methods=["PUT"], name="egress_put"),
    Route(f"{SB_PATH}/files", files.put, methods=["PUT"], name="files_put"),
    Route(f"{SB_PATH}/files", files.get, methods=["GET"], name="files_get"),
    Route(f"{SB_PATH}/exec", exec_, methods=["POST"], name="exec"),
    Route("/_local/stats", admin.stats, methods=["GET"], name="local_stats"),
    Route("/_local/sandboxes/{sandbox_id}/network", admin.network, methods=["GET"], name="local_network"),
    Route("/_local/faults", admin.faults, methods=["GET", "PUT", "DELETE"], name="local_faults"),
]


def build_app(plane: Plane) -> ASGIApp:
    app = Starlette(routes=ROUTES, exception_handlers=HANDLERS, lifespan=lifespan)  # type: ignore[arg-type]
    app.state.plane = plane
    # outside Starlette's own error middleware, so even a 500 carries X-Request-Id
    return StatsMiddleware(FaultMiddleware(app, plane), plane.counters, classify)


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    plane: Plane = app.state.plane
    await plane.start()
    try:
        yield
    finally:
        await plane.stop()


def classify(scope: Scope) -> str:
    """The route name a request counts under in the stats (``exec_stream`` for a streamed exec)."""
    partial = None
    for route in ROUTES:
        match, _ = route.matches(scope)
        if match is Match.FULL:
            name = route.name
            if name == "exec" and _query_flag(scope, b"stream"):
                return "exec_stream"
            return name
        if match is Match.PARTIAL and partial is None:
            partial = route.name
    return partial or "not_found"


def _query_flag(scope: Scope, key: bytes) -> bool:
    for part in scope.get("query_string", b"").split(b"&"):
        name, _, value = part.partition(b"=")
        if name == key and value.lower() in (b"1", b"true"):
            return True
    return False


# -- error handling -----------------------------------------------------------------------
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


HANDLERS: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
    ApiError: api_error,
    HTTPException: http_error,
    Exception: internal_error,
}
