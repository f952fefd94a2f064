"""The ``/_local/*`` admin routes: stats, a guest's network as the kernel holds it, faults.

They are served to loopback clients with the API key only."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ..envelope import ApiError, success
from ..faults import FaultSet
from ..network import EgressPolicy
from ..plane import Plane
from .parsing import authorized, json_object, sandbox


def admin_only(request: Request) -> Plane:
    """Admin routes: loopback clients with the API key. A guest whose egress allows all
    shares the host's network namespace and can reach this socket; without the key
    (which no guest is given) it gets 401 like on every /v1 route."""
    host = request.client.host if request.client else ""
    if host not in ("127.0.0.1", "::1", "localhost") and not host.startswith("127."):
        raise ApiError(403, "admin routes are served to loopback clients only", "forbidden")
    return authorized(request)


async def stats(request: Request) -> Response:
    plane = admin_only(request)
    return Response(json.dumps(plane.stats()), media_type="application/json")


async def network(request: Request) -> Response:
    """One guest's network as the kernel holds it: for tests and operators."""
    sb = sandbox(admin_only(request), request)
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


async def faults(request: Request) -> Response:
    plane = admin_only(request)
    if request.method == "PUT":
        plane.faults = FaultSet.parse(await json_object(request))
    elif request.method == "DELETE":
        plane.faults = FaultSet()
    return success(plane.faults.as_json())
