"""What the plane serves about itself: health, the caller, shapes, rootfs and templates."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from ..catalog import DEFAULT_ROOTFS, SHAPES
from ..envelope import success
from ..images import Image
from ..plane import Plane
from .parsing import authorized, paginated, plane_of


async def healthz(request: Request) -> Response:
    return success({"up": True})


async def readyz(request: Request) -> Response:
    return success({"ready": True})


async def whoami(request: Request) -> Response:
    plane = authorized(request)
    live = plane.store.live()
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
    return success(paginated([s.as_json() for s in SHAPES.values()], request))


def _catalog(plane: Plane) -> dict[str, Image]:
    return {name: image for name, image in plane.images.items() if image.template_id is None}


def _templates(plane: Plane) -> list[Image]:
    return [image for name, image in plane.images.items() if name == image.template_id]


async def rootfs(request: Request) -> Response:
    images = _catalog(plane_of(request))
    entries = [{"name": n, "description": i.description, "deprecated": False} for n, i in images.items()]
    return success({"rootfs": list(images), "default": DEFAULT_ROOTFS, "entries": entries})


async def templates(request: Request) -> Response:
    plane = authorized(request)
    rows = [
        {"id": i.template_id, "name": i.name, "base": DEFAULT_ROOTFS, "status": "ready"}
        for i in _templates(plane)
    ]
    return success(paginated(rows, request))
