"""The control plane as one value: the native client of one base URL and API key, with what is
cached for it (preflight, shape catalog, the isolation its guests have) and the key's digest,
computed once. One per process and endpoint; reset in a forked child.

Importing this module is cheap and reads no settings.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from langflow_sandbox_createos import __version__
from langflow_sandbox_createos.core import failures, hooks, settings
from langflow_sandbox_createos.core.native import load_native

if TYPE_CHECKING:
    from langflow_sandbox_createos._createos import Client

logger = logging.getLogger("langflow_sandbox_createos")


USER_AGENT = f"langflow-sandbox-createos/{__version__}"


# --- one client per process and endpoint --------------------------------------------------


@dataclass
class Endpoint:
    """The control plane as one value, read from the settings once and passed down: the native
    client of one base URL and API key, the key's digest (what tells two accounts' guests and
    pools apart), the control timeout, and what is cached per endpoint (preflight, shape
    catalog, isolation). The key itself never shows in a repr."""

    client: Client = field(repr=False)
    base_url: str
    key: settings.ApiKey = field(repr=False)
    key_digest: str
    control_timeout: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    preflight_ok: bool = False
    shapes: tuple[tuple[int, str], ...] | None = None  # (mem_mib, id), ascending
    # the isolation the control plane's guests have, from its whoami (None: not asked yet).
    # CreateOS says nothing (microVMs); createos-local says "namespaces" (or "none").
    isolation: str | None = None

    @property
    def key_source(self) -> str:
        return self.key.source


def plane_isolation(whoami: object) -> str:
    """The isolation of a control plane's guests from its whoami answer: createos-local names
    its own ("namespaces", "none"); CreateOS names none, and runs microVMs."""
    stated = whoami.get("isolation") if isinstance(whoami, dict) else None
    if isinstance(stated, str) and stated.strip():
        return "".join(ch for ch in stated.strip()[:32] if ch.isalnum() or ch in "-_") or "unknown"
    return "hardware-virtualized"


def key_digest(key: str) -> str:
    """The API key as a digest (never the key): what tells two accounts' endpoints and pools apart."""
    return hashlib.blake2s(key.encode(), digest_size=16).hexdigest()


# Every variable the endpoint is read from.
ENDPOINT_VARIABLES = (
    "CREATEOS_SANDBOX_API_KEY",
    "CREATEOS_API_KEY",
    "CREATEOS_SANDBOX_BASE_URL",
    "CREATEOS_SANDBOX_CONTROL_TIMEOUT_SECONDS",
)


def _endpoint_settings() -> tuple[settings.ApiKey, str, int, str]:
    with failures.refusing_bad_settings():
        key = settings.api_key()
        url = settings.base_url()
        control_timeout = settings.control_timeout()
    return key, url, control_timeout, key_digest(key.value)


class _Endpoints:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[tuple[str, str, int], Endpoint] = {}
        # parsed once per change of the variables, not on every run
        self._settings = settings.EnvMemo(ENDPOINT_VARIABLES, _endpoint_settings)

    def get(self) -> Endpoint:
        """The endpoint for the current settings. Raises SandboxUnavailableError on bad settings."""
        key, url, control_timeout, digest = self._settings.get()
        endpoint = self._by_key.get((url, digest, control_timeout))  # a dict read is atomic
        if endpoint is not None:
            return endpoint
        with self._lock:
            endpoint = self._by_key.get((url, digest, control_timeout))
            if endpoint is None:
                with failures.native_errors("configure the CreateOS client"):
                    client = load_native().Client(
                        url, key.value, user_agent=USER_AGENT, control_timeout=float(control_timeout)
                    )
                endpoint = Endpoint(
                    client=client,
                    base_url=url,
                    key=key,
                    key_digest=digest,
                    control_timeout=float(control_timeout),
                )
                self._by_key[(url, digest, control_timeout)] = endpoint
            return endpoint

    def all(self) -> list[Endpoint]:
        with self._lock:
            return list(self._by_key.values())

    def clear(self) -> None:
        with self._lock:
            endpoints = list(self._by_key.values())
            self._by_key.clear()
        for endpoint in endpoints:
            try:
                endpoint.client.close()
            except Exception:  # closing is best effort at shutdown
                logger.debug("closing the CreateOS client failed", exc_info=True)

    def reset_after_fork(self) -> None:
        # The parent's clients own its sockets and I/O threads: forget them, never close them.
        self._lock = threading.Lock()
        self._by_key = {}


endpoints = _Endpoints()
hooks.after_fork("endpoints", endpoints.reset_after_fork)
