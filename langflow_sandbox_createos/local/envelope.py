"""JSend envelopes (spec section 2) and the API error type every route raises."""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import Response

JSON_MEDIA_TYPE = "application/json"


def dumps(payload: Any) -> bytes:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


def success(data: Any, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(dumps({"status": "success", "data": data}), status_code, headers, JSON_MEDIA_TYPE)


def fail(data: Any, status_code: int, headers: dict[str, str] | None = None) -> Response:
    return Response(dumps({"status": "fail", "data": data}), status_code, headers, JSON_MEDIA_TYPE)


def error(message: str, status_code: int = 500, headers: dict[str, str] | None = None) -> Response:
    body = {"status": "error", "message": message, "code": status_code}
    return Response(dumps(body), status_code, headers, JSON_MEDIA_TYPE)


class ApiError(Exception):
    """A client-visible failure, rendered as a JSend ``fail`` (4xx) or ``error`` (5xx) envelope.

    ``fail`` data is always an object: ``{"message": ..., "code": ...}`` for general failures,
    plus the offending field as a key (``{"name": "reason", ...}``) for validation failures.
    """

    def __init__(
        self,
        status_code: int,
        message: str,
        code: str | None = None,
        field: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.code = code
        self.field = field
        self.headers = headers

    def response(self) -> Response:
        if self.status_code >= 500:
            return error(self.message, self.status_code, self.headers)
        data: dict[str, Any] = {}
        if self.field:
            data[self.field] = self.message
        data["message"] = self.message
        if self.code:
            data["code"] = self.code
        return fail(data, self.status_code, self.headers)


def bad_request(message: str, field: str | None = None, code: str = "invalid_request") -> ApiError:
    return ApiError(400, message, code, field)
