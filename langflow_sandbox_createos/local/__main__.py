"""``createos-local``: command-line entry point of the local CreateOS control plane."""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import logging
import os
import secrets
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .config import ServerConfig


def _rootfs(value: str) -> tuple[str, Path]:
    name, sep, path = value.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError("expected NAME=PATH")
    directory = Path(path).resolve()
    if not directory.is_dir():
        raise argparse.ArgumentTypeError(f"{path} is not a directory")
    return name, directory


def searchable_by_others(directory: Path) -> bool:
    """Whether an unprivileged user can walk down to ``directory`` (every step o+x)."""
    return all(d.stat().st_mode & 0o001 for d in (directory, *directory.parents))


API_KEY_ENV = "CREATEOS_LOCAL_API_KEY"


def is_loopback(host: str) -> bool:
    """True for `localhost` and any 127.0.0.0/8 or ::1 address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def api_key(given: str | None) -> tuple[str, bool]:
    """The API key to require, and whether it was generated here (then it is printed)."""
    key = given if given is not None else os.environ.get(API_KEY_ENV)
    if key is not None:
        if not key.strip():
            raise ValueError(f"the API key (--api-key or ${API_KEY_ENV}) must not be empty")
        return key, False
    return secrets.token_urlsafe(24), True


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="createos-local",
        description="Offline CreateOS control plane: the /v1 API on loopback, real guests in bubblewrap.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow a --host that is not a loopback address (the API is then reachable from other machines)",
    )
    p.add_argument("--port", type=int, default=8787, help="TCP port; 0 picks a free one (default 8787)")
    p.add_argument(
        "--api-key",
        help=(
            f"the X-Api-Key clients must send (every route but /healthz and /readyz, /_local/* included); "
            f"default ${API_KEY_ENV}, else a random key printed at start"
        ),
    )
    p.add_argument("--state-dir", type=Path, help="directory for guest files (default: a fresh temp dir)")
    p.add_argument("--port-file", type=Path, help="write the bound port to this file once listening")
    p.add_argument(
        "--tls-cert", type=Path, help="serve HTTPS with this PEM certificate (chain); needs --tls-key"
    )
    p.add_argument("--tls-key", type=Path, help="the PEM private key for --tls-cert")
    p.add_argument(
        "--http2",
        action="store_true",
        help="serve HTTP/2 (and HTTP/1.1) with hypercorn; needs --tls-cert (connection faults are HTTP/1.1 only)",
    )
    p.add_argument("--boot-delay-ms", type=int, default=0, help="extra time create takes before running")
    p.add_argument(
        "--transition-delay-ms", type=int, default=0, help="time pausing/resuming/forking/destroying last"
    )
    p.add_argument(
        "--heartbeat-seconds", type=float, default=5.0, help="streaming heartbeat interval (default 5)"
    )
    p.add_argument(
        "--no-streaming", action="store_true", help="answer streaming exec with 404, like old servers"
    )
    p.add_argument(
        "--no-isolation", action="store_true", help="run guests as plain host processes (no bwrap)"
    )
    p.add_argument("--no-memory-limit", action="store_true", help="do not enforce the shape's memory")
    p.add_argument(
        "--rootfs",
        type=_rootfs,
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="serve rootfs NAME with directory PATH as the guest's / (repeatable)",
    )
    _limits(p)
    p.add_argument(
        "--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"]
    )
    return p


def _limits(p: argparse.ArgumentParser) -> None:
    """What one guest, one client and the whole server may hold, how guests are owned, and the
    emulation's knobs for tests (auto-pause's unit, duplicate names)."""
    p.add_argument(
        "--max-file-bytes", type=int, default=500 * 1024 * 1024, help="upload size cap (default 500 MiB)"
    )
    p.add_argument(
        "--max-exec-output-bytes",
        type=int,
        default=64 * 1024 * 1024,
        help="per-stream cap of a buffered exec's stdout/stderr (default 64 MiB)",
    )
    p.add_argument("--max-sandboxes", type=int, default=1000, help="live sandboxes before create answers 403")
    p.add_argument(
        "--max-connections-per-client",
        type=int,
        default=512,
        help="connections one client address may hold open; more are closed on arrival (default 512)",
    )
    p.add_argument(
        "--max-unauthenticated-connections",
        type=int,
        default=32,
        help="connections without the API key kept beyond their first 2 s, all clients together; "
        "the oldest is closed for a new one (default 32)",
    )
    p.add_argument(
        "--idle-connection-seconds",
        type=float,
        default=60.0,
        help="close a connection that sent nothing for this long with no request in progress (default 60)",
    )
    p.add_argument(
        "--guest-uid-base",
        type=int,
        default=ServerConfig.guest_uid_base,
        help="each guest's root is a host uid of its own from this one on, 65,536 of them "
        f"(default {ServerConfig.guest_uid_base}); no host user or group may have one",
    )
    p.add_argument(
        "--shared-guest-uid",
        action="store_true",
        help="every guest's root is the one host uid --guest-uid-base (the fallback where the "
        "kernel cannot idmap the image layers)",
    )
    p.add_argument(
        "--auto-pause-unit-ms",
        type=int,
        default=1000,
        help="length of one second of auto_pause_after_seconds, in ms (tests shrink it)",
    )
    p.add_argument(
        "--allow-duplicate-names",
        action="store_true",
        help="do not reject duplicate names among live sandboxes",
    )


def main(argv: Sequence[str] | None = None) -> None:
    args, key, generated = parse_args(argv)
    # the key lives in the config from here on; a process this server starts inherits nothing
    # of it by accident (each helper gets an environment of its own anyway, see helpers.py)
    os.environ.pop(API_KEY_ENV, None)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    owned_state = args.state_dir is None
    config = server_config(args, key, make_state_dir(args.state_dir))
    # imported late so --help works without the server dependencies
    from .plane import check_isolation
    from .server import serve

    problem = check_isolation(config)
    if problem:
        print(f"createos-local: cannot isolate guests: {problem}", file=sys.stderr)
        raise SystemExit(2)
    if config.isolation:
        enter_private_mount_namespace(config.state_dir, owned_state)
    if generated:
        print(f"createos-local: API key (generated for this run): {key}", flush=True)
    # sandboxes are not persisted: leftovers of a previous run are garbage
    shutil.rmtree(config.state_dir / "sandboxes", ignore_errors=True)
    guests_link = mount_guests_dir(config)
    try:
        serve(config)
    finally:
        if guests_link is not None:
            unmount_guests_dir(guests_link)
        if owned_state:
            shutil.rmtree(config.state_dir, ignore_errors=True)


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, str, bool]:
    """The command line, checked (a usage error exits when it does not hold together), with
    the API key to require and whether it was generated here."""
    p = parser()
    args = p.parse_args(argv)
    if not is_loopback(args.host) and not args.allow_remote:
        p.error(
            f"--host {args.host} is not a loopback address: every machine that can reach it could create "
            "guests (which run real processes here) with the API key. Pass --allow-remote to mean it."
        )
    try:
        key, generated = api_key(args.api_key)
    except ValueError as exc:
        p.error(str(exc))
    if args.max_connections_per_client < 1 or args.idle_connection_seconds <= 0:
        p.error("--max-connections-per-client must be at least 1 and --idle-connection-seconds above 0")
    if args.max_unauthenticated_connections < 1:
        p.error("--max-unauthenticated-connections must be at least 1")
    if not args.no_isolation:
        guest_uids(p, args)
    if (args.tls_cert is None) != (args.tls_key is None):
        p.error("--tls-cert and --tls-key go together")
    if args.http2 and args.tls_cert is None:
        p.error("--http2 needs --tls-cert and --tls-key (clients negotiate HTTP/2 with TLS ALPN)")
    if args.http2:
        try:
            import hypercorn  # noqa: F401
        except ImportError:
            p.error("--http2 needs hypercorn: pip install hypercorn")
    return args, key, generated


def guest_uids(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The guests' host uids must be unprivileged, valid, and nobody else's."""
    from .identity import GUEST_UID_SPAN, host_users_in_range

    base = args.guest_uid_base
    if not 65536 <= base <= 2**32 - 2 - GUEST_UID_SPAN:
        p.error(f"--guest-uid-base must be between 65536 and {2**32 - 2 - GUEST_UID_SPAN}")
    if not args.shared_guest_uid and args.max_sandboxes > GUEST_UID_SPAN:
        p.error(f"--max-sandboxes over {GUEST_UID_SPAN} needs --shared-guest-uid (one host uid per guest)")
    taken = host_users_in_range(base)
    if taken:
        p.error(f"--guest-uid-base {base}: the guests' host uids would include {', '.join(taken[:3])}")


def make_state_dir(given: Path | None) -> Path:
    """The state directory, made: ``given``, else a fresh temporary one (``main`` removes it)."""
    state_dir = Path(tempfile.mkdtemp(prefix="createos-local-")) if given is None else given
    state_dir.mkdir(parents=True, exist_ok=True)
    return state_dir


def server_config(args: argparse.Namespace, key: str, state_dir: Path) -> ServerConfig:
    return ServerConfig(
        host=args.host,
        port=args.port,
        api_key=key,
        state_dir=state_dir.resolve(),
        boot_delay_ms=args.boot_delay_ms,
        transition_delay_ms=args.transition_delay_ms,
        heartbeat_seconds=args.heartbeat_seconds,
        streaming=not args.no_streaming,
        isolation=not args.no_isolation,
        rootfs=dict(args.rootfs),
        max_sandboxes=args.max_sandboxes,
        max_connections_per_client=args.max_connections_per_client,
        idle_connection_seconds=args.idle_connection_seconds,
        max_unauthenticated_connections=args.max_unauthenticated_connections,
        guest_uid_base=args.guest_uid_base,
        shared_guest_uid=args.shared_guest_uid,
        max_file_bytes=args.max_file_bytes,
        max_exec_output_bytes=args.max_exec_output_bytes,
        auto_pause_unit_ms=args.auto_pause_unit_ms,
        unique_names=not args.allow_duplicate_names,
        memory_limits=not args.no_memory_limit,
        port_file=args.port_file,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        http2=args.http2,
        log_level=args.log_level,
    )


def enter_private_mount_namespace(state_dir: Path, owned_state: bool) -> None:
    from .mounts import private_mount_namespace

    if owned_state:
        state_dir.chmod(0o711)

    # every guest disk and root is a mount of this namespace: none reaches the host's
    # mount table, and all of them go away with this process, even on SIGKILL
    private_mount_namespace()


def mount_guests_dir(config: ServerConfig) -> Path | None:
    """Guests run as an unprivileged host user whose bwrap opens its root by path: when a
    directory above the state dir is private (e.g. under /root), the sandboxes are also
    mounted (in this process's namespace only) on a searchable directory of their own,
    returned here (None when it is not needed)."""
    if not config.isolation or searchable_by_others(config.state_dir):
        return None
    from .mounts import MS_BIND, mount

    sandboxes = config.state_dir / "sandboxes"
    sandboxes.mkdir(mode=0o711)
    guests_link = Path(tempfile.mkdtemp(prefix="createos-local-guests-"))
    guests_link.chmod(0o711)
    mount(sandboxes, guests_link, None, MS_BIND)
    config.guests_dir = guests_link
    return guests_link


def unmount_guests_dir(guests_link: Path) -> None:
    from .mounts import umount

    with contextlib.suppress(OSError):
        umount(guests_link)
    with contextlib.suppress(OSError):
        guests_link.rmdir()


if __name__ == "__main__":
    main()
