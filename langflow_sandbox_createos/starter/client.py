"""Langflow's REST API as the starter needs it: log in, read the catalog, import the flow."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from langflow_sandbox_createos.starter.flow import LangflowError, build_flow, export_document

AUTH_HELP = (
    "this Langflow has authentication on (LANGFLOW_AUTO_LOGIN=false): set LANGFLOW_API_KEY, or "
    "LANGFLOW_SUPERUSER and LANGFLOW_SUPERUSER_PASSWORD"
)


class LangflowClient:
    """Just enough of Langflow's REST API: log in, catalog, flows, API keys, run.

    Authenticated by a bearer token (auto-login or the superuser's credentials) or by an API
    key (``x-api-key``), which Langflow accepts on every endpoint used here.
    """

    def __init__(self, base_url: str, timeout: float = 120.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.token: str | None = None
        self.api_key: str | None = None

    def __repr__(self) -> str:  # never the token or the key
        return f"LangflowClient({self.base_url!r}, logged_in={self.logged_in})"

    @property
    def logged_in(self) -> bool:
        return self.token is not None or self.api_key is not None

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
        form: Mapping[str, str] | None = None,
    ) -> Any:
        if form is not None:
            data: bytes | None = urllib.parse.urlencode(form).encode()
            content_type = "application/x-www-form-urlencoded"
        else:
            data = json.dumps(body).encode() if body is not None else None
            content_type = "application/json"
        req = urllib.request.Request(f"{self.base_url}{path}", data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        elif self.api_key:
            req.add_header("x-api-key", self.api_key)
        for key, value in (headers or {}).items():
            req.add_header(key, value)
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:2000]
            raise LangflowError(f"{method} {path} -> HTTP {exc.code}: {detail}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise LangflowError(f"{method} {path}: {exc}") from exc
        return json.loads(raw) if raw else None

    def healthy(self) -> bool:
        try:
            return (self.request("GET", "/health_check", timeout=5) or {}).get("status") == "ok"
        except LangflowError:
            return False

    def wait_healthy(self, timeout: float, alive: Any = None) -> None:
        """Poll ``/health_check`` until it answers ok; ``alive()`` returning False aborts early."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.healthy():
                return
            if alive is not None and not alive():
                raise LangflowError("Langflow exited while starting")
            time.sleep(1.0)
        raise LangflowError(f"Langflow did not answer /health_check within {timeout:.0f} s")

    def login(self) -> str:
        """A bearer token from auto-login (``LANGFLOW_AUTO_LOGIN=true``, Langflow's default)."""
        try:
            answer = self.request("GET", "/api/v1/auto_login")
        except LangflowError as exc:
            raise LangflowError(f"auto-login refused: {AUTH_HELP}") from exc
        self.token = answer["access_token"]
        return self.token

    def login_with_password(self, username: str, password: str) -> str:
        """A bearer token for ``username`` (``POST /api/v1/login``, form-encoded as Langflow wants)."""
        try:
            answer = self.request("POST", "/api/v1/login", form={"username": username, "password": password})
        except LangflowError as exc:
            # The server's answer is kept out: the message must never carry the password.
            status = str(exc).split(": ", 1)[0]  # "POST /api/v1/login -> HTTP 401"
            raise LangflowError(f"Langflow refused the credentials of {username!r} ({status})") from None
        self.token = answer["access_token"]
        return self.token

    def use_api_key(self, api_key: str) -> None:
        """Authenticate every request with ``x-api-key`` (checked at once with ``GET /api/v1/users/whoami``)."""
        self.api_key = api_key
        try:
            self.request("GET", "/api/v1/users/whoami")
        except LangflowError:
            self.api_key = None
            raise LangflowError("Langflow refused the API key") from None

    def authenticate(self, environ: Mapping[str, str]) -> None:
        """Log in the way ``environ`` says: an API key, else the superuser's credentials, else auto-login."""
        api_key = environ.get("LANGFLOW_API_KEY", "").strip()
        username = environ.get("LANGFLOW_SUPERUSER", "").strip()
        password = environ.get("LANGFLOW_SUPERUSER_PASSWORD", "")
        if api_key:
            self.use_api_key(api_key)
        elif username and password:
            self.login_with_password(username, password)
        else:
            self.login()

    def catalog(self) -> dict[str, Any]:
        return self.request("GET", "/api/v1/all")

    def flows(self) -> list[dict[str, Any]]:
        answer = self.request("GET", "/api/v1/flows/?get_all=true&header_flows=true")
        return answer if isinstance(answer, list) else answer.get("items", [])

    def create_flow(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", "/api/v1/flows/", body)

    def delete_flow(self, flow_id: str) -> None:
        self.request("DELETE", f"/api/v1/flows/{flow_id}")

    def create_api_key(self, name: str = "createos-starter") -> str:
        """An API key for ``/api/v1/run`` (which takes ``x-api-key``, not the bearer token)."""
        self.api_key = self.request("POST", "/api/v1/api_key/", {"name": name})["api_key"]
        return self.api_key

    def version(self) -> str:
        return self.request("GET", "/api/v1/version")["version"]

    def run(self, flow_id: str, input_value: str = "", timeout: float = 300.0) -> dict[str, Any]:
        if self.api_key is None:
            self.create_api_key()
        assert self.api_key is not None
        body = {"input_value": input_value, "input_type": "chat", "output_type": "any"}
        return self.request(
            "POST",
            f"/api/v1/run/{flow_id}?stream=false",
            body,
            headers={"x-api-key": self.api_key},
            timeout=timeout,
        )


def import_starter_flow(
    client: LangflowClient, *, replace: bool = True, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Build the starter flow from the server's catalog and create it; an older copy with the
    same name is deleted first (so ``make run`` twice leaves one flow, not two)."""
    if not client.logged_in:
        client.authenticate(os.environ if environ is None else environ)
    body = build_flow(client.catalog())
    if replace:
        for flow in client.flows():
            if flow.get("name") == body["name"]:
                client.delete_flow(flow["id"])
    return client.create_flow(body)


def build_export(client: LangflowClient, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The export file, built from a running Langflow's catalog (how the shipped one is made)."""
    if not client.logged_in:
        client.authenticate(os.environ if environ is None else environ)
    return export_document(build_flow(client.catalog()), client.version())


def write_json(path: Path, document: dict[str, Any]) -> None:
    path.write_text(
        json.dumps(document, indent=2, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8"
    )
