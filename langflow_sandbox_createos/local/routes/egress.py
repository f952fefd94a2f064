"""A sandbox's egress rules: read them, replace them (at once, for every process of the guest)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from ..envelope import ApiError, bad_request, success
from ..network import NetworkError
from .parsing import authorized, json_object, sandbox, string_list


async def get(request: Request) -> Response:
    sb = sandbox(authorized(request), request)
    return success({"id": sb.id, "egress": list(sb.egress)})


async def put(request: Request) -> Response:
    """Store the rules and, once the guest has a network, load them into it before answering:
    new connections of every process in the guest (background ones of earlier execs included)
    obey them from then on, and one already open to a destination they refuse is cut at the
    guest's next packet on it. A guest without a network yet gets them when it is made."""
    plane = authorized(request)
    sb = sandbox(plane, request)
    body = await json_object(request)
    if "egress" not in body:
        raise bad_request("egress is required (a list of rules, or null for allow-all)", "egress")
    egress = string_list(body, "egress")
    if sb.terminal:
        raise ApiError(409, f"sandbox is {sb.status}", "invalid_state")
    sb.egress = egress or []
    net = sb.layout.network
    if net is not None and sb.status != "destroying":
        try:
            await net.apply(sb.egress_rules, plane.runner.host_addresses)
        except NetworkError as exc:  # the guest is left refusing everything (fails closed)
            if sb.terminal or sb.status == "destroying":  # deleted meanwhile
                raise ApiError(409, f"sandbox is {sb.status}", "invalid_state") from exc
            raise ApiError(500, f"the guest's egress rules could not be loaded: {exc}") from exc
    return success({"id": sb.id, "egress": list(sb.egress)})
