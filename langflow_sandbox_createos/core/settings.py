"""Every environment variable the plugin reads, parsed and validated in one place.

Nothing here runs at import time: lfx imports the plugin while it is still
building its own settings, so each value is read when a surface asks for it.
A bad value raises `SettingsError`, whose message names the variable, what was
wrong with it and how to fix it. The API key is never echoed.
"""

from __future__ import annotations

import ipaddress
import os
import re
import sys
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar
from urllib.parse import urlsplit

DEFAULT_BASE_URL = "https://api.sb.createos.sh"
DEFAULT_ROOTFS = "devbox:1"
DEFAULT_COMPONENT_SHAPE = "s-2vcpu-4gb"
DEFAULT_EXECUTOR_SHAPE = "s-4vcpu-8gb"
DEFAULT_MAX_OUTPUT_BYTES = 16 * 1024 * 1024
MIN_OUTPUT_BYTES = 1024
MAX_OUTPUT_BYTES = 1024 * 1024 * 1024  # per stream: more would not fit in a worker's memory anyway
_WHOLE_NUMBER = re.compile(r"[+-]?[0-9]+")  # ASCII digits only: int() also takes "٣" and "1_0"
DEFAULT_CONTROL_TIMEOUT_SECONDS = 60  # the native client's own default
MIN_SHAPE_MEMORY_MIB = 4096
KEY_HELP_URL = "https://createos.sh/app/profile"

# Langflow's own sandbox defaults (lfx SecuritySettings).
LANGFLOW_TIMEOUT_DEFAULT = 30
LANGFLOW_MEMORY_DEFAULT = 192
MAX_TIMEOUT_SECONDS = 3600

_TRUE = frozenset({"1", "true", "yes", "on", "y", "t"})
_FALSE = frozenset({"0", "false", "no", "off", "n", "f"})


# Variables that hold a control-plane key: never forwarded into a guest. createos-local's own
# key is one (docs export it with the same value as CREATEOS_SANDBOX_API_KEY).
CREDENTIAL_VARIABLES = frozenset({"CREATEOS_SANDBOX_API_KEY", "CREATEOS_API_KEY", "CREATEOS_LOCAL_API_KEY"})


def _holds_the_key(value: str | None, environ: Mapping[str, str]) -> bool:
    """Whether `value` is (or contains) the API key this process uses."""
    if not value:
        return False
    keys = (environ.get(name, "").strip() for name in ("CREATEOS_SANDBOX_API_KEY", "CREATEOS_API_KEY"))
    return any(key and len(key) >= 8 and key in value for key in keys)


def holds_the_key(value: str | None, environ: Mapping[str, str] | None = None) -> bool:
    """Whether `value` is (or contains) the CreateOS API key this process uses: such a value
    never enters a guest."""
    return _holds_the_key(value, _env(environ))


class SettingsError(ValueError):
    """A setting has a value the plugin cannot use. The message names the fix."""


def _env(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def raw(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The stripped value of `name`, or None when it is unset or blank."""
    value = _env(environ).get(name)
    if value is None:
        return None
    value = value.strip()
    return value or None


def parse_bool(name: str, default: bool, environ: Mapping[str, str] | None = None) -> bool:
    value = raw(name, environ)
    if value is None:
        return default
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise SettingsError(
        f"{name}={value!r} is not a boolean. Use true or false (also accepted: 1/0, yes/no, on/off)."
    )


def whole_number(value: str) -> int | None:
    """`value` as an int when it is an optional sign and ASCII digits (spaces around allowed),
    else None. Unicode digits, underscores and huge digit strings are not whole numbers here."""
    text = value.strip()
    if not _WHOLE_NUMBER.fullmatch(text) or len(text) > 30:
        return None
    return int(text, 10)


def parse_int(
    name: str,
    default: int,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> int:
    value = raw(name, environ)
    if value is None:
        return default
    number = whole_number(value)
    if number is None:
        raise SettingsError(
            f"{name}={value!r} is not a whole number. Set it to an integer such as {default}."
        )
    if minimum is not None and number < minimum:
        raise SettingsError(
            f"{name}={number} is below the minimum of {minimum}. Set it to at least {minimum}."
        )
    if maximum is not None and number > maximum:
        raise SettingsError(
            f"{name}={number} is above the maximum of {maximum}. Set it to at most {maximum}."
        )
    return number


def parse_list(name: str, environ: Mapping[str, str] | None = None) -> tuple[str, ...] | None:
    """A comma-separated list; None when unset or blank."""
    value = raw(name, environ)
    if value is None:
        return None
    return tuple(item.strip() for item in value.split(",") if item.strip())


# --- credentials and endpoint ------------------------------------------------------------


@dataclass(frozen=True)
class ApiKey:
    value: str
    source: str  # the variable it came from

    def __repr__(self) -> str:  # never show the key
        return f"ApiKey(source={self.source!r}, value=<redacted>)"

    __str__ = __repr__


def api_key(environ: Mapping[str, str] | None = None) -> ApiKey:
    """The API key from CREATEOS_SANDBOX_API_KEY, falling back to CREATEOS_API_KEY."""
    for name in ("CREATEOS_SANDBOX_API_KEY", "CREATEOS_API_KEY"):
        value = raw(name, environ)
        if value is None:
            continue
        if any(ord(ch) < 0x21 or ord(ch) > 0x7E for ch in value):
            raise SettingsError(
                f"{name} contains whitespace, control or non-ASCII characters, which cannot be sent in an "
                "HTTP header. Copy the key again without extra characters."
            )
        return ApiKey(value, name)
    raw_url = raw("CREATEOS_SANDBOX_BASE_URL", environ) or ""  # the same mapping the key is read from
    try:
        host = urlsplit(raw_url).hostname if raw_url else None
    except ValueError:  # judged where the URL is read; here it only picks the advice
        host = None
    if host and is_loopback_host(host):  # createos-local: its key is its own, not an account's
        raise SettingsError(
            f"No CreateOS API key: set CREATEOS_SANDBOX_API_KEY to the key of the createos-local at "
            f"{raw_url} (the one it printed at start, or its CREATEOS_LOCAL_API_KEY). Under `make run`: "
            "createos-langflow doctor --env-file .run/createos.env"
        )
    raise SettingsError(
        "No CreateOS API key: set CREATEOS_SANDBOX_API_KEY (or CREATEOS_API_KEY). "
        f"Create a key at {KEY_HELP_URL}."
    )


def is_loopback_host(host: str) -> bool:
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def base_url(environ: Mapping[str, str] | None = None) -> str:
    """CREATEOS_SANDBOX_BASE_URL, validated: https (plain http only to a loopback host),
    no credentials, query or fragment. A path prefix is kept."""
    name = "CREATEOS_SANDBOX_BASE_URL"
    value = raw(name, environ) or DEFAULT_BASE_URL
    try:
        parts = urlsplit(value)
        port = parts.port  # raises on a malformed port
    except ValueError as exc:
        raise SettingsError(
            f"{name}={value!r} is not a valid URL ({exc}). Example: {DEFAULT_BASE_URL}"
        ) from None
    del port
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SettingsError(
            f"{name}={value!r} must be an http(s) URL with a host, such as {DEFAULT_BASE_URL}."
        )
    if parts.username is not None or parts.password is not None:
        raise SettingsError(f"{name} must not contain credentials; the key goes in CREATEOS_SANDBOX_API_KEY.")
    if parts.query or parts.fragment:
        raise SettingsError(f"{name}={value!r} must not have a query string or fragment.")
    if parts.scheme == "http" and not is_loopback_host(parts.hostname):
        raise SettingsError(
            f"{name}={value!r} uses plain http to a non-loopback host, which would send the API key "
            "unencrypted. Use https:// (plain http is allowed only for 127.0.0.1, ::1 and localhost)."
        )
    return value.rstrip("/")


# --- the sandbox backend -----------------------------------------------------------------


# Backend runs, and component runs, holding a guest at once per process (admission.py).
DEFAULT_SANDBOX_MAX_GUESTS = 16
# How long a run may wait in line for one of those slots (every surface); 0 waits forever.
DEFAULT_MAX_WAIT_SECONDS = 120


@dataclass(frozen=True)
class BackendSettings:
    timeout_seconds: int
    memory_mb: int
    allow_network: bool
    allowed_domains: tuple[str, ...]
    accept_egress_exceptions: bool
    rootfs: str
    shape: str | None  # pinned, or None for automatic choice
    max_output_bytes: int
    warm_pool: int
    max_guests: int = DEFAULT_SANDBOX_MAX_GUESTS
    max_wait_seconds: int = DEFAULT_MAX_WAIT_SECONDS


def _lfx_sandbox_settings() -> object | None:
    """lfx's view of the LANGFLOW_SANDBOX_* settings (it may come from a .env file or code),
    but only when lfx's settings service already exists, as it does inside Langflow and
    `lfx run`. Creating it here would import lfx's whole service stack (tens of seconds)
    from a CLI or a bare process; there the environment variables decide, as they would
    for lfx itself."""
    manager = getattr(sys.modules.get("lfx.services.manager"), "_service_manager", None)
    services = getattr(manager, "services", None)
    service_type = getattr(sys.modules.get("lfx.services.schema"), "ServiceType", None)
    key = getattr(service_type, "SETTINGS_SERVICE", None)
    if not isinstance(services, dict) or key is None or key not in services:
        return None
    try:
        from lfx.utils.sandbox.base import _sandbox_settings

        return _sandbox_settings()
    except Exception:  # the settings stack failed: env vars decide
        return None


T = TypeVar("T")


class EnvMemo(Generic[T]):
    """A value parsed from the environment, parsed again only when the environment changed.

    Keyed on the values of `names` (every variable the parse reads) and on what `extra`
    returns (what else it depends on, such as lfx's settings service); any change in them
    parses again, so a changed variable takes effect on the next call. A parse that raises
    is not remembered: the next call parses (and raises) again. Thread-safe without a lock:
    the last (key, value) pair is replaced as one object."""

    def __init__(
        self, names: tuple[str, ...], parse: Callable[[], T], extra: Callable[[], Hashable] | None = None
    ) -> None:
        self.names = names
        self._parse = parse
        self._extra = extra
        self._last: tuple[Hashable, T] | None = None
        # os.environ keeps its values in `_data`, keyed by the encoded names (CPython's
        # os._Environ): reading it directly skips a str -> bytes -> str round trip per name
        # on every call. Only when `_env` (the mapping every parse reads) is os.environ itself.
        data = getattr(os.environ, "_data", None)
        encode = getattr(os.environ, "encodekey", None)
        self._encoded = tuple(map(encode, names)) if isinstance(data, dict) and encode else None

    def _values(self) -> tuple[object, ...]:
        environ = _env(None)  # looked up on every call: the mapping the parse will read
        if environ is os.environ and self._encoded is not None:
            data = os.environ._data  # type: ignore[attr-defined]
            return tuple(map(data.get, self._encoded))
        return tuple(map(environ.get, self.names))

    def get(self) -> T:
        key = (self._values(), self._extra() if self._extra else None)
        last = self._last
        if last is not None and last[0] == key:
            return last[1]
        value = self._parse()
        self._last = (key, value)
        return value

    def clear(self) -> None:
        self._last = None


def backend_settings(environ: Mapping[str, str] | None = None) -> BackendSettings:
    """Settings of the sandbox backend. An explicit LANGFLOW_SANDBOX_* variable is parsed
    here (with a clear error); otherwise lfx's settings service decides."""
    lfx = _lfx_sandbox_settings() if environ is None else None
    timeout = parse_int(
        "LANGFLOW_SANDBOX_TIMEOUT_SECONDS",
        int(getattr(lfx, "timeout_seconds", LANGFLOW_TIMEOUT_DEFAULT)),
        minimum=1,
        maximum=MAX_TIMEOUT_SECONDS,
        environ=environ,
    )
    memory = parse_int(
        "LANGFLOW_SANDBOX_MEMORY_MB",
        int(getattr(lfx, "memory_mb", LANGFLOW_MEMORY_DEFAULT)),
        minimum=1,
        environ=environ,
    )
    allow_network = parse_bool(
        "LANGFLOW_SANDBOX_ALLOW_NETWORK", bool(getattr(lfx, "allow_network", False)), environ
    )
    domains = parse_list("LANGFLOW_SANDBOX_ALLOWED_DOMAINS", environ)
    if domains is None:
        domains = tuple(getattr(lfx, "allowed_domains", ()) or ())
    return BackendSettings(
        timeout_seconds=timeout,
        memory_mb=memory,
        allow_network=allow_network,
        allowed_domains=domains,
        accept_egress_exceptions=accept_egress_exceptions(environ),
        rootfs=rootfs(environ),
        shape=raw("CREATEOS_SANDBOX_SHAPE", environ),
        max_output_bytes=max_output_bytes(environ),
        warm_pool=parse_int("CREATEOS_SANDBOX_WARM_POOL", 0, minimum=0, maximum=64, environ=environ),
        max_guests=sandbox_max_guests(environ),
        max_wait_seconds=sandbox_max_wait_seconds(environ),
    )


# Every variable backend_settings() reads (tests/unit/test_settings.py records the reads).
BACKEND_VARIABLES = (
    "LANGFLOW_SANDBOX_TIMEOUT_SECONDS",
    "LANGFLOW_SANDBOX_MEMORY_MB",
    "LANGFLOW_SANDBOX_ALLOW_NETWORK",
    "LANGFLOW_SANDBOX_ALLOWED_DOMAINS",
    "LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS",
    "CREATEOS_SANDBOX_ROOTFS",
    "CREATEOS_SANDBOX_SHAPE",
    "CREATEOS_SANDBOX_MAX_OUTPUT_BYTES",
    "CREATEOS_SANDBOX_WARM_POOL",
    "CREATEOS_SANDBOX_MAX_GUESTS",
    "CREATEOS_SANDBOX_MAX_WAIT_SECONDS",
)


def _lfx_sandbox_values() -> Hashable:
    """What backend_settings() takes from lfx's settings service, as a memo key."""
    lfx = _lfx_sandbox_settings()
    if lfx is None:
        return None
    return (
        getattr(lfx, "timeout_seconds", None),
        getattr(lfx, "memory_mb", None),
        getattr(lfx, "allow_network", None),
        tuple(getattr(lfx, "allowed_domains", ()) or ()),
    )


_backend_memo: EnvMemo[BackendSettings] = EnvMemo(BACKEND_VARIABLES, backend_settings, _lfx_sandbox_values)


def current_backend_settings() -> BackendSettings:
    """backend_settings() of this process's environment, parsed once per change of it (the
    sandbox backend asks on every run)."""
    return _backend_memo.get()


def control_timeout(environ: Mapping[str, str] | None = None) -> int:
    """CREATEOS_SANDBOX_CONTROL_TIMEOUT_SECONDS: the whole deadline of one control-plane call
    (whoami, shapes, create, list, get, resume, upload, download, delete), connect included.
    Exec deadlines are separate (each surface's own timeout plus its grace)."""
    return parse_int(
        "CREATEOS_SANDBOX_CONTROL_TIMEOUT_SECONDS",
        DEFAULT_CONTROL_TIMEOUT_SECONDS,
        minimum=1,
        maximum=MAX_TIMEOUT_SECONDS,
        environ=environ,
    )


def accept_egress_exceptions(environ: Mapping[str, str] | None = None) -> bool:
    return parse_bool("LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS", False, environ)


def accept_local_isolation(environ: Mapping[str, str] | None = None) -> bool:
    """CREATEOS_SANDBOX_ACCEPT_LOCAL_ISOLATION: run the backend on a control plane whose guests
    are not microVMs (createos-local: Linux namespaces on a shared kernel), for tests and demos."""
    return parse_bool("CREATEOS_SANDBOX_ACCEPT_LOCAL_ISOLATION", False, environ)


# A reused guest (Guest Reuse = flow or session) idle longer than this is deleted: at its
# next use, by the sweep that runs with reused runs, and by `createos-langflow reap --idle`.
DEFAULT_REUSE_IDLE_SECONDS = 3600
MAX_REUSE_IDLE_SECONDS = 30 * 86400


def sandbox_max_guests(environ: Mapping[str, str] | None = None) -> int:
    """CREATEOS_SANDBOX_MAX_GUESTS: the sandbox backend's runs and the component's runs in
    flight at once in this process (each surface its own line)."""
    return parse_int(
        "CREATEOS_SANDBOX_MAX_GUESTS", DEFAULT_SANDBOX_MAX_GUESTS, minimum=1, maximum=1024, environ=environ
    )


def sandbox_max_wait_seconds(environ: Mapping[str, str] | None = None) -> int:
    """CREATEOS_SANDBOX_MAX_WAIT_SECONDS: how long a backend or component run may wait in line
    for a guest slot before it fails (0: no deadline)."""
    return parse_int(
        "CREATEOS_SANDBOX_MAX_WAIT_SECONDS",
        DEFAULT_MAX_WAIT_SECONDS,
        minimum=0,
        maximum=MAX_TIMEOUT_SECONDS,
        environ=environ,
    )


def reuse_idle_seconds(environ: Mapping[str, str] | None = None) -> int:
    return parse_int(
        "CREATEOS_SANDBOX_REUSE_IDLE_SECONDS",
        DEFAULT_REUSE_IDLE_SECONDS,
        minimum=1,
        maximum=MAX_REUSE_IDLE_SECONDS,
        environ=environ,
    )


def max_output_bytes(environ: Mapping[str, str] | None = None) -> int:
    """CREATEOS_SANDBOX_MAX_OUTPUT_BYTES, the cap per output stream every surface applies."""
    return parse_int(
        "CREATEOS_SANDBOX_MAX_OUTPUT_BYTES",
        DEFAULT_MAX_OUTPUT_BYTES,
        minimum=MIN_OUTPUT_BYTES,
        maximum=MAX_OUTPUT_BYTES,
        environ=environ,
    )


def rootfs(environ: Mapping[str, str] | None = None) -> str:
    return raw("CREATEOS_SANDBOX_ROOTFS", environ) or DEFAULT_ROOTFS


def pinned_shape(environ: Mapping[str, str] | None = None) -> str | None:
    return raw("CREATEOS_SANDBOX_SHAPE", environ)


# --- the whole-flow executor -------------------------------------------------------------


# Executor runs in flight at once per process; the rest wait in line (admission.py).
DEFAULT_EXECUTOR_MAX_GUESTS = 8


@dataclass(frozen=True)
class ExecutorSettings:
    rootfs: str
    shape: str
    timeout_seconds: int
    egress: tuple[str, ...]
    install_lfx: bool
    pip_extra: tuple[str, ...]
    lfx_version: str | None
    env_allowlist: tuple[str, ...]
    max_output_bytes: int
    warm_pool: int = 0
    warm_pool_idle_seconds: int = 300
    max_guests: int = DEFAULT_EXECUTOR_MAX_GUESTS
    max_wait_seconds: int = DEFAULT_MAX_WAIT_SECONDS
    reuse: bool = False
    reuse_idle_seconds: int = 300
    reuse_max_runs: int = 4


def validate_address_rule(rule: str, setting: str) -> str:
    """An egress rule the platform enforces: `*`, an IPv4 address or CIDR, optionally `:port`.
    Hostname rules are refused because CreateOS stores them without enforcing them."""
    if rule == "*":
        return rule
    address, _, port = rule.partition(":") if rule.count(":") == 1 else (rule, "", "")
    if port and not (port.isdigit() and 0 < int(port) < 65536):
        raise SettingsError(f"{setting}: {rule!r} has an invalid port. Use ADDRESS[:PORT] or CIDR.")
    try:
        ipaddress.IPv4Network(address, strict=False)
    except ValueError:
        raise SettingsError(
            f"{setting}: {rule!r} is not an IPv4 address or CIDR. CreateOS accepts hostname rules but does "
            "not enforce them, so only address and CIDR rules (or * for open) are allowed."
        ) from None
    return rule


def executor_settings(environ: Mapping[str, str] | None = None) -> ExecutorSettings:
    egress_rules = parse_list("CREATEOS_EXECUTOR_EGRESS", environ)
    if egress_rules is None:
        egress: tuple[str, ...] = ("*",)
    elif not egress_rules:
        raise SettingsError(
            "CREATEOS_EXECUTOR_EGRESS lists no rules. Use * for open egress, or comma-separated "
            "addresses/CIDRs such as 203.0.113.7:443,198.51.100.0/24."
        )
    else:
        egress = tuple(validate_address_rule(rule, "CREATEOS_EXECUTOR_EGRESS") for rule in egress_rules)
        if "*" in egress and len(egress) > 1:
            raise SettingsError("CREATEOS_EXECUTOR_EGRESS mixes * with other rules; * alone means open.")
    env_names = parse_list("CREATEOS_EXECUTOR_ENV", environ) or ()
    for name in env_names:
        if not name.replace("_", "a").isalnum() or name[0].isdigit():
            raise SettingsError(f"CREATEOS_EXECUTOR_ENV: {name!r} is not an environment variable name.")
        if name in CREDENTIAL_VARIABLES:
            raise SettingsError(
                f"CREATEOS_EXECUTOR_ENV must not forward {name}: it holds a control-plane key, which never "
                "enters a guest. Remove it from CREATEOS_EXECUTOR_ENV."
            )
        if _holds_the_key(_env(environ).get(name), _env(environ)):
            raise SettingsError(
                f"CREATEOS_EXECUTOR_ENV must not forward {name}: its value is the CreateOS API key "
                "(CREATEOS_SANDBOX_API_KEY / CREATEOS_API_KEY), which never enters a guest. Remove it "
                "from CREATEOS_EXECUTOR_ENV."
            )
    pip = raw("CREATEOS_EXECUTOR_PIP", environ)
    return ExecutorSettings(
        rootfs=raw("CREATEOS_EXECUTOR_ROOTFS", environ) or rootfs(environ),
        shape=raw("CREATEOS_EXECUTOR_SHAPE", environ) or DEFAULT_EXECUTOR_SHAPE,
        timeout_seconds=parse_int(
            "CREATEOS_EXECUTOR_TIMEOUT_SECONDS", 600, minimum=1, maximum=86400, environ=environ
        ),
        egress=egress,
        install_lfx=parse_bool("CREATEOS_EXECUTOR_INSTALL_LFX", False, environ),
        pip_extra=tuple(pip.split()) if pip else (),
        lfx_version=raw("CREATEOS_EXECUTOR_LFX_VERSION", environ),
        env_allowlist=env_names,
        max_output_bytes=max_output_bytes(environ),
        warm_pool=parse_int("CREATEOS_EXECUTOR_WARM_POOL", 0, minimum=0, maximum=16, environ=environ),
        warm_pool_idle_seconds=parse_int(
            "CREATEOS_EXECUTOR_WARM_POOL_IDLE_SECONDS", 300, minimum=30, maximum=3600, environ=environ
        ),
        max_guests=parse_int(
            "CREATEOS_EXECUTOR_MAX_GUESTS",
            DEFAULT_EXECUTOR_MAX_GUESTS,
            minimum=1,
            maximum=1024,
            environ=environ,
        ),
        max_wait_seconds=parse_int(
            "CREATEOS_EXECUTOR_MAX_WAIT_SECONDS",
            DEFAULT_MAX_WAIT_SECONDS,
            minimum=0,
            maximum=MAX_TIMEOUT_SECONDS,
            environ=environ,
        ),
        reuse=parse_bool("CREATEOS_EXECUTOR_REUSE", False, environ),
        reuse_idle_seconds=parse_int(
            "CREATEOS_EXECUTOR_REUSE_IDLE_SECONDS", 300, minimum=30, maximum=86400, environ=environ
        ),
        reuse_max_runs=parse_int(
            "CREATEOS_EXECUTOR_REUSE_MAX_RUNS", 4, minimum=1, maximum=32, environ=environ
        ),
    )
