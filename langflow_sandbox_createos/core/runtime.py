"""What the three surfaces share: one native client per process and endpoint, the
mapping of native errors onto lfx's two error classes, the network policy, the
shape catalog and guest names.

Importing this module is cheap and reads no settings.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import secrets
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from lfx.utils.sandbox.base import SandboxExecutionError, SandboxUnavailableError

from langflow_sandbox_createos.core import settings
from langflow_sandbox_createos.core.settings import MIN_SHAPE_MEMORY_MIB, SettingsError

logger = logging.getLogger("langflow_sandbox_createos")

NAME_MAX = 22
DENY_ALL: tuple[str, ...] = ("240.0.0.0/4",)  # reserved, unroutable: CreateOS has no deny-all token
ALLOW_ALL: tuple[str, ...] = ("*",)
LINK_LOCAL = "169.254.0.0/16"

USER_AGENT = "langflow-sandbox-createos/0.3.0"

# Programs up to this size travel as the exec's stdin (one round trip fewer); larger ones
# are uploaded as a file first. stdin is a JSON string inside the exec request, whose size
# limit the API leaves undocumented and whose escaping can grow control-heavy text up to six
# times, while the file API takes raw bytes up to 500 MB. 256 KiB covers hand- and
# LLM-written code with a wide margin, and for anything larger the extra round trip is
# small next to moving the program itself.
STDIN_PROGRAM_MAX_BYTES = 256 * 1024


def nul_refusal(value: str, what: str) -> str | None:
    """Why `value` cannot travel to a guest, or None. A NUL byte ends every argv and env
    string at the kernel, and CPython refuses source code that holds one, so a value with a
    NUL is refused up front instead of arriving cut short (or differently for a program
    short enough for stdin and one long enough to be uploaded)."""
    at = value.find("\0")
    if at < 0:
        return None
    return (
        f"{what} contains a NUL character (\\x00) at position {at}. A NUL cannot be passed to a "
        "process (argv and environment strings end at the first one) and Python refuses source "
        "code that holds one; remove it, or write it as an escape such as \\x00 or \\0."
    )


def _native():  # imported lazily so a missing build fails at first use, with a clear error
    try:
        from langflow_sandbox_createos import _createos
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise SandboxUnavailableError(
            "The CreateOS native client (langflow_sandbox_createos._createos) is not built or cannot load: "
            f"{exc}. Reinstall the package; building it needs libcurl and jansson development headers."
        ) from exc
    return _createos


# --- one client per process and endpoint --------------------------------------------------


@dataclass
class Endpoint:
    """A native client plus what is cached per (base URL, key): preflight and shape catalog."""

    client: object
    base_url: str
    key_source: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    preflight_ok: bool = False
    shapes: tuple[tuple[int, str], ...] | None = None  # (mem_mib, id), ascending
    # the isolation the control plane's guests have, from its whoami (None: not asked yet).
    # CreateOS says nothing (microVMs); createos-local says "namespaces" (or "none").
    isolation: str | None = None


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


class _Endpoints:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[tuple[str, str, int], Endpoint] = {}

    def get(self) -> Endpoint:
        """The endpoint for the current settings. Raises SandboxUnavailableError on bad settings."""
        try:
            key = settings.api_key()
            url = settings.base_url()
            control_timeout = settings.control_timeout()
        except SettingsError as exc:
            raise SandboxUnavailableError(str(exc)) from None
        digest = key_digest(key.value)
        with self._lock:
            endpoint = self._by_key.get((url, digest, control_timeout))
            if endpoint is None:
                native = _native()
                try:
                    client = native.Client(
                        url, key.value, user_agent=USER_AGENT, control_timeout=float(control_timeout)
                    )
                except native.CreateOSError as exc:
                    raise to_lfx_error(exc, "configure the CreateOS client") from None
                endpoint = Endpoint(client=client, base_url=url, key_source=key.source)
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
                endpoint.client.close()  # type: ignore[attr-defined]
            except Exception:  # closing is best effort at shutdown
                logger.debug("closing the CreateOS client failed", exc_info=True)

    def reset_after_fork(self) -> None:
        # The parent's clients own its sockets and I/O threads: forget them, never close them.
        self._lock = threading.Lock()
        self._by_key = {}


endpoints = _Endpoints()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=endpoints.reset_after_fork)


# --- errors ------------------------------------------------------------------------------

_STATUS_HINTS = {
    400: (
        "the control plane rejected the request; check the shape and image settings "
        "(CREATEOS_SANDBOX_SHAPE, CREATEOS_SANDBOX_ROOTFS; for the executor CREATEOS_EXECUTOR_SHAPE, "
        "CREATEOS_EXECUTOR_ROOTFS) and the egress settings"
    ),
    401: "the API key was refused; check CREATEOS_SANDBOX_API_KEY (or CREATEOS_API_KEY)",
    402: "the CreateOS account has no credit left; add credit to the account",
    403: "the account is not allowed to do this (quota or permissions); check the account's limits",
    404: "the sandbox or file does not exist (it may have been deleted)",
    409: "the sandbox is not in a state that allows this (paused, or the name is taken)",
    422: "the control plane rejected the request as invalid",
    429: "the control plane is rate limiting this account; retry later",
}


# The native ProtocolError's code when an exec stream ended cleanly without its exit frame.
NO_EXIT_FRAME = "no_exit_frame"


def describe(exc: BaseException) -> str:
    """A one-paragraph description of a native error with the fix, key-free."""
    status = getattr(exc, "status", None)
    native = _native()
    if getattr(exc, "code", None) == NO_EXIT_FRAME:
        hint = (
            "the exec stream ended without an exit status (the guest agent may have crashed, or "
            "the network dropped the stream): the program's fate is unknown; retry the run"
        )
    elif status in _STATUS_HINTS:
        hint = _STATUS_HINTS[status]
    elif isinstance(status, int) and status >= 500:
        hint = "the CreateOS control plane failed; retry later"
    elif isinstance(exc, native.DeadlineError):
        hint = "the control plane did not answer in time; check CREATEOS_SANDBOX_BASE_URL and the network"
    elif isinstance(exc, native.ProtocolError):
        hint = "the control plane answered with something that is not the CreateOS API; check CREATEOS_SANDBOX_BASE_URL"
    elif isinstance(exc, native.ConfigError):
        hint = "fix the setting named above"
    elif status is None and isinstance(exc, native.TransientError):
        hint = "the control plane could not be reached; check CREATEOS_SANDBOX_BASE_URL and the network"
    else:
        hint = ""
    retry_after = getattr(exc, "retry_after", None)
    if retry_after:
        hint += f" (Retry-After: {retry_after:g} s)"
    text = str(exc)
    return f"{text} — {hint}" if hint else text


def to_lfx_error(exc: BaseException, action: str) -> SandboxExecutionError:
    """Map a native error onto lfx's classes: refusals and non-429 4xx fail closed as
    SandboxUnavailableError; 429, 5xx, transport and protocol faults are SandboxExecutionError."""
    native = _native()
    message = f"CreateOS: could not {action}: {describe(exc)}"
    if isinstance(exc, native.UnavailableError):
        return SandboxUnavailableError(message)
    return SandboxExecutionError(message)


# --- guests whose create or delete did not go as planned ------------------------------------


def create_may_have_landed(exc: BaseException) -> bool:
    """Whether a failed create may still have made its guest: its answer was lost (deadline,
    reset, cut or garbled body) or was a 5xx from somewhere in between. A 4xx, 429 included,
    is a definite refusal."""
    if getattr(exc, "sandbox_id", None):
        return False  # the caller knows the guest and deletes it
    status = getattr(exc, "status", None)
    return status is None or not 400 <= status < 500


def reap_lost_create(client: object, name: str, exc: BaseException) -> None:
    """After a create whose answer was lost, find the guest by its unique name and delete it,
    so an answer cut in flight never orphans a VM. Best effort, logged, never raises."""
    if not name or not create_may_have_landed(exc):
        return
    native = _native()
    try:
        rows = client.list(prefix=name)  # type: ignore[attr-defined]
    except native.CreateOSError as lookup:
        logger.warning(
            "CreateOS: a create failed without a usable answer and the guest named %s could not be "
            "looked up (%s). If it exists, auto-pause bounds its cost; delete leftovers with "
            "'createos-langflow reap --yes'.",
            name,
            describe(lookup),
        )
        return
    for row in rows:
        if row.get("name") != name or row.get("status") in ("destroyed", "failed"):
            continue
        try:
            client.delete(row["id"])  # type: ignore[attr-defined]
        except native.CreateOSError as failed:
            logger.warning(
                "CreateOS: could not delete guest %s (%s), created by a request whose answer was lost: "
                "%s. Auto-pause bounds its cost; delete leftovers with 'createos-langflow reap --yes'.",
                row.get("id"),
                name,
                describe(failed),
            )
        else:
            logger.info(
                "CreateOS: deleted guest %s (%s), created by a request whose answer was lost",
                row.get("id"),
                name,
            )


def log_pending_deletes(timeout: float) -> None:
    """Wait up to `timeout` for the background deletes of every client, logging each outcome.
    Runs at process exit, so a delete that failed in the last run is still reported."""
    deadline = time.monotonic() + timeout
    for endpoint in endpoints.all():
        try:
            pending = endpoint.client.pending_deletes()  # type: ignore[attr-defined]
        except Exception:  # a closed client has nothing to wait for
            continue
        log_delete_outcomes(endpoint.client, max(0.0, deadline - time.monotonic()) if pending else 0.0)


EXIT_DRAIN_SECONDS = 5.0
atexit.register(log_pending_deletes, EXIT_DRAIN_SECONDS)


def log_delete_outcomes(client: object, timeout: float, log: logging.Logger = logger) -> None:
    """Log the outcome of every background delete that finished (never the key): the
    backend's deletes and those the native client retried for the component."""
    try:
        outcomes = client.drain_deletes(timeout)  # type: ignore[attr-defined]
    except Exception:  # collecting outcomes must never fail a run
        log.debug("drain_deletes failed", exc_info=True)
        return
    for sandbox_id, status, error in outcomes:
        if error is None and (status is None or 200 <= status < 300 or status == 404):
            log.debug("CreateOS: deleted guest %s (HTTP %s)", sandbox_id, status)
        else:
            log.warning(
                "CreateOS: could not delete guest %s (HTTP %s): %s. Auto-pause bounds its cost; "
                "delete leftovers with 'createos-langflow reap --yes'.",
                sandbox_id,
                status,
                error or "unexpected status",
            )


# --- network policy ------------------------------------------------------------------------


def egress_rules(allow_network: bool) -> tuple[str, ...]:
    return ALLOW_ALL if allow_network else DENY_ALL


def egress_gate(allow_network: bool, accepted: bool) -> None:
    """Refuse egress-off runs until the link-local exception is acknowledged."""
    if allow_network or accepted:
        return
    raise SandboxUnavailableError(
        f"Network is off, but a CreateOS guest can still reach {LINK_LOCAL} (the link-local range that "
        "carries the VM metadata service), which is accepted before the deny-all rule applies. Set "
        "LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS=true to run with that exception, or turn the "
        "network on (LANGFLOW_SANDBOX_ALLOW_NETWORK=true / Allow Network) if you want it open."
    )


def domains_refusal(domains: Sequence[str]) -> SandboxUnavailableError:
    return SandboxUnavailableError(
        f"LANGFLOW_SANDBOX_ALLOWED_DOMAINS is set ({', '.join(domains)}), but CreateOS does not enforce "
        "hostname rules: it would accept and echo them while restricting nothing. Unset it and choose "
        "LANGFLOW_SANDBOX_ALLOW_NETWORK=false (deny all) or true (open); for a real domain allowlist use "
        "the exec-sandbox backend, which filters DNS inside the guest."
    )


def egress_matches(live: Iterable[str] | None, wanted: Iterable[str]) -> bool:
    """Order-insensitive; absent, empty and ["*"] all mean allow-all."""

    def norm(rules: Iterable[str] | None) -> frozenset[str]:
        items = frozenset(r.strip() for r in (rules or ()) if r.strip())
        return items if items and items != frozenset(ALLOW_ALL) else frozenset(ALLOW_ALL)

    return norm(live) == norm(wanted)


# --- shapes ------------------------------------------------------------------------------


def parse_catalog(rows: Iterable[dict]) -> tuple[tuple[int, str], ...]:
    shapes = []
    for row in rows:
        shape_id, mem = row.get("id"), row.get("mem_mib")
        if isinstance(shape_id, str) and isinstance(mem, int) and not isinstance(mem, bool):
            shapes.append((mem, shape_id))
        else:
            logger.debug("skipping unreadable shape row %r", row)
    return tuple(sorted(shapes))


def catalog(endpoint: Endpoint) -> tuple[tuple[int, str], ...]:
    """The shape catalog, every page, fetched once per endpoint."""
    with endpoint.lock:
        if endpoint.shapes is None:
            native = _native()
            try:
                rows = endpoint.client.shapes()  # type: ignore[attr-defined]
            except native.CreateOSError as exc:
                # classified like every other call: a 429, 5xx, transport or protocol fault
                # here is as transient as it is anywhere else
                raise to_lfx_error(exc, "read the shape catalog") from None
            endpoint.shapes = parse_catalog(rows)
        return endpoint.shapes


def pick_shape(shapes: Sequence[tuple[int, str]], memory_mb: int, pinned: str | None) -> str:
    """The smallest shape with at least max(memory_mb, 4096) MiB, or the pinned one if it
    is in the catalog and not below the floor. Never rounds down."""
    if not shapes:
        raise SandboxUnavailableError(
            "CreateOS returned an empty shape catalog, so no shape can be chosen safely. "
            "Check CREATEOS_SANDBOX_BASE_URL points at a CreateOS control plane."
        )
    floor = max(memory_mb, MIN_SHAPE_MEMORY_MIB)
    if pinned is not None:
        by_id = {shape_id: mem for mem, shape_id in shapes}
        if pinned not in by_id:
            raise SandboxUnavailableError(
                f"CREATEOS_SANDBOX_SHAPE={pinned!r} is not in the CreateOS shape catalog. "
                f"Available: {', '.join(s for _, s in shapes)}."
            )
        if by_id[pinned] < memory_mb:
            raise SandboxUnavailableError(
                f"CREATEOS_SANDBOX_SHAPE={pinned!r} has {by_id[pinned]} MiB, below "
                f"LANGFLOW_SANDBOX_MEMORY_MB={memory_mb}. Pin a larger shape or lower the memory setting."
            )
        return pinned
    for mem, shape_id in shapes:
        if mem >= floor:
            return shape_id
    raise SandboxUnavailableError(
        f"No CreateOS shape has at least {floor} MiB (max(LANGFLOW_SANDBOX_MEMORY_MB={memory_mb}, "
        f"{MIN_SHAPE_MEMORY_MIB})); the largest is {shapes[-1][1]} with {shapes[-1][0]} MiB. "
        "Lower LANGFLOW_SANDBOX_MEMORY_MB or pin a shape with CREATEOS_SANDBOX_SHAPE."
    )


def shape_memory(shapes: Sequence[tuple[int, str]], shape_id: str) -> int | None:
    return next((mem for mem, s in shapes if s == shape_id), None)


# --- guest names and budgets ------------------------------------------------------------------


def random_name(prefix: str) -> str:
    """A fresh name of exactly 22 characters: a `destroying` guest still holds its name."""
    return prefix + secrets.token_hex(NAME_MAX)[: NAME_MAX - len(prefix)]


def stable_name(prefix: str, *parts: str) -> str:
    """A deterministic 22-character name derived from `parts`."""
    digest = hashlib.blake2s(":".join(parts).encode(), digest_size=16).hexdigest()
    return prefix + digest[: NAME_MAX - len(prefix)]


def auto_pause_seconds(timeout_seconds: int) -> int:
    """Longer than one execution: the activity clock is touched only when an exec is accepted."""
    return min(86400, max(60, timeout_seconds + 120))
