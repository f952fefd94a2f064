"""Server settings, filled from the command line by ``__main__``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8787
    api_key: str = ""  # required: an empty key authorises nobody
    state_dir: Path = Path(".")
    boot_delay_ms: int = 0
    transition_delay_ms: int = 0
    heartbeat_seconds: float = 5.0
    streaming: bool = True
    isolation: bool = True
    # guest name -> host directory used as the guest's / ("devbox:1" is the host's own /)
    rootfs: dict[str, Path] = field(default_factory=dict)
    max_sandboxes: int = 1000
    # how long one "second" of auto_pause_after_seconds lasts, so tests can shrink it
    auto_pause_unit_ms: int = 1000
    unique_names: bool = True
    max_exec_output_bytes: int = 64 * 1024 * 1024
    max_file_bytes: int = 500 * 1024 * 1024
    memory_limits: bool = True
    port_file: Path | None = None
    # serve HTTPS with this certificate chain and key (PEM); plain HTTP when unset
    tls_cert: Path | None = None
    tls_key: Path | None = None
    http2: bool = False  # hypercorn, HTTP/2 over TLS (ALPN); needs tls_cert
    log_level: str = "warning"
    # what one client address may hold open, and how long a silent connection lives
    max_connections_per_client: int = 512
    idle_connection_seconds: float = 60.0
    # connections that have not shown the API key, all clients together (beyond a short grace)
    max_unauthenticated_connections: int = 32
    # where the guests' roots are reached when the state dir is not searchable by the guest user
    guests_dir: Path | None = None
    # each guest's root is a host uid of its own from this base on (identity.py), or this one
    # for every guest with shared_guest_uid
    guest_uid_base: int = 0x70000000
    shared_guest_uid: bool = False
