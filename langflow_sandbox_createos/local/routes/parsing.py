"""Reading a request: the plane and sandbox it names, its JSON body, typed fields and query."""

from __future__ import annotations

import json
import re
from typing import Any

from starlette.requests import Request

from ..envelope import ApiError, bad_request
from ..plane import Plane
from ..store import Sandbox

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,21}$")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
AUTO_PAUSE_RANGE = (60, 86400)
MAX_JSON_BYTES = 64 * 1024 * 1024


def plane_of(request: Request) -> Plane:
    """The plane ``build_app`` put in the app's state."""
    plane: Plane = request.app.state.plane
    return plane


def authorized(request: Request) -> Plane:
    """The plane, once the request has shown the API key (401 otherwise)."""
    plane = plane_of(request)
    plane.authorize(request)
    return plane


def sandbox(plane: Plane, request: Request) -> Sandbox:
    """The sandbox the path names (404 when there is none)."""
    return plane.store.get(request.path_params["sandbox_id"])


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


def typed(body: dict[str, Any], key: str, kind: type | tuple[type, ...], what: str) -> Any:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise bad_request(f"{key} must be {what}", key)
    return value


def no_nul(value: str, key: str) -> str:
    """A NUL would end the string at the kernel (argv, env): refuse it rather than cut it."""
    if "\0" in value:
        raise bad_request(f"{key} must not contain a NUL character (at position {value.index(chr(0))})", key)
    return value


def string_list(body: dict[str, Any], key: str) -> list[str] | None:
    value = typed(body, key, list, "a list of strings")
    if value is not None and not all(isinstance(v, str) for v in value):
        raise bad_request(f"{key} must be a list of strings", key)
    if value is not None:
        for i, item in enumerate(value):
            no_nul(item, f"{key}[{i}]")
    return value


def envs(body: dict[str, Any], key: str) -> dict[str, str] | None:
    value = typed(body, key, dict, "an object of string values")
    if value is None:
        return None
    for k, v in value.items():
        if not ENV_KEY_RE.match(k):
            raise bad_request(f"invalid environment variable name {k!r}", key)
        if not isinstance(v, str):
            raise bad_request(f"{key}.{k} must be a string", key)
        no_nul(v, f"{key}.{k}")
    return dict(value)


def auto_pause(body: dict[str, Any]) -> int | None:
    value = typed(body, "auto_pause_after_seconds", int, "an integer")
    low, high = AUTO_PAUSE_RANGE
    if value is not None and value != 0 and not low <= value <= high:
        raise bad_request(
            f"auto_pause_after_seconds must be between {low} and {high}", "auto_pause_after_seconds"
        )
    return value or None


def query_int(request: Request, key: str, default: int) -> int:
    raw = request.query_params.get(key)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise bad_request(f"{key} must be an integer", key) from exc


def paginated(rows: list[Any], request: Request) -> dict[str, Any]:
    limit = min(max(query_int(request, "limit", 50), 1), 500)
    offset = max(query_int(request, "offset", 0), 0)
    page = rows[offset : offset + limit]
    return {
        "data": page,
        "pagination": {"total": len(rows), "limit": limit, "offset": offset, "count": len(page)},
    }
