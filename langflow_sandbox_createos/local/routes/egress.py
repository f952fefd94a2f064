"""A sandbox's egress rules: read them, replace them."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from ..envelope import ApiError, bad_request, success
from .parsing import authorized, json_object, sandbox, string_list


async def get(request: Request) -> Response:
    sb = sandbox(authorized(request), request)
    return success({"id": sb.id, "egress": list(sb.egress)})


async def put(request: Request) -> Response:
    sb = sandbox(authorized(request), request)
    body = await json_object(request)
    if "egress" not in body:
        raise bad_request("egress is required (a list of rules, or null for allow-all)", "egress")
    egress = string_list(body, "egress")
    if sb.terminal:
        raise ApiError(409, f"sandbox is {sb.status}", "invalid_state")
    sb.egress = egress or []
    return success({"id": sb.id, "egress": list(sb.egress)})
