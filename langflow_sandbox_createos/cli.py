"""`createos-langflow`: the operator CLI.

  doctor   check the configuration of every surface and say how to fix what is wrong
  reap     list (and with --yes delete) guests left behind by the plugin

Both use the native client and the same settings module as the surfaces.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from typing import Any

from langflow_sandbox_createos import clock, settings
from langflow_sandbox_createos.settings import SettingsError

# The names the plugin itself generates (22 characters: prefix + hex). The default reap
# matches these only: not the warm pools' `lf-w-` and `lf-xw-` guests (a running Langflow's
# pools; after a crash, reap them with `--prefix lf-xw- --include-active`), and
# not a sandbox someone else happened to name `lf-...`.
PLUGIN_NAME = re.compile(r"lf-[0-9a-f]{19}|lf-c-[0-9a-f]{17}|lf-x-[0-9a-f]{17}")
# A running (or creating) guest younger than this may be a run in progress: kept by default.
ACTIVE_GRACE_SECONDS = 2 * 3600
ACTIVE = frozenset({"creating", "running"})
REUSED_PREFIX = "lf-c-"  # the component's guests; Guest Reuse keeps its own until idle too long
ENTRY_POINTS = {
    "lfx.sandbox_backends": "createos",
    "langflow.extensions": "langflow-sandbox-createos",
    "lfx.executors": "createos",
}
DISTRIBUTION = "langflow-sandbox-createos"


# --- doctor ----------------------------------------------------------------------------------


@dataclass
class Check:
    name: str
    ok: bool | None  # None = informational, does not affect the verdict
    detail: str
    fix: str = ""
    surfaces: tuple[str, ...] = ()  # the surfaces this check gates; empty = all configured ones


@dataclass
class Report:
    surfaces: dict[str, bool] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)

    def add(self, check: Check) -> None:
        self.checks.append(check)

    @property
    def ok(self) -> bool:
        enabled = {name for name, on in self.surfaces.items() if on}
        for check in self.checks:
            if check.ok is False and (not check.surfaces or enabled & set(check.surfaces)):
                return False
        return True


def _surfaces(environ: os._Environ[str] | dict[str, str]) -> tuple[dict[str, bool], list[Check]]:
    plugins = {p.strip().lower() for p in environ.get("LANGFLOW_SANDBOX_BACKEND_PLUGINS", "").split(",")}
    selected = environ.get("LANGFLOW_SANDBOX_BACKEND", "").strip().lower() == "createos"
    allowed = "createos" in plugins
    executor = environ.get("LANGFLOW_EXECUTOR_KIND", "").strip().lower() == "createos"
    checks: list[Check] = []
    if selected and not allowed:
        checks.append(
            Check(
                "backend trust gate",
                False,
                "LANGFLOW_SANDBOX_BACKEND=createos but createos is not in LANGFLOW_SANDBOX_BACKEND_PLUGINS; "
                "Langflow will refuse to start.",
                "export LANGFLOW_SANDBOX_BACKEND_PLUGINS=createos",
                ("backend",),
            )
        )
    elif allowed and not selected:
        checks.append(
            Check(
                "backend selection",
                None,
                "createos is allowlisted but not selected, so the Python Interpreter still runs in-process.",
                "export LANGFLOW_SANDBOX_BACKEND=createos to switch the backend on",
            )
        )
    surfaces = {"backend": selected, "component": True, "executor": executor}
    return surfaces, checks


def _check_entry_points(report: Report) -> None:
    try:
        version = metadata.version("lfx")
        report.add(Check("lfx", True, f"lfx {version} is installed"))
    except metadata.PackageNotFoundError:
        report.add(Check("lfx", False, "lfx is not installed", "pip install 'lfx>=1.13,<1.14' (or langflow)"))
        return
    for group, name in ENTRY_POINTS.items():
        found = [ep for ep in metadata.entry_points(group=group) if ep.name.strip().lower() == name]
        owners = sorted({getattr(ep.dist, "name", "?") for ep in found})
        surface = {"lfx.sandbox_backends": "backend", "langflow.extensions": "component"}.get(
            group, "executor"
        )
        if not found:
            report.add(
                Check(
                    f"entry point {group}:{name}",
                    False,
                    "not visible to this Python",
                    f"pip install {DISTRIBUTION} into the environment Langflow runs in",
                    (surface,),
                )
            )
        elif len(owners) > 1:
            report.add(
                Check(
                    f"entry point {group}:{name}",
                    False,
                    f"published by several distributions ({', '.join(owners)}); lfx refuses both",
                    "uninstall all but one of them",
                    (surface,),
                )
            )
        else:
            report.add(Check(f"entry point {group}:{name}", True, f"from {owners[0]}"))
    try:
        from lfx.utils.sandbox import registry

        builtin_names: frozenset[str] = getattr(registry, "_builtin_names", frozenset())
        if "createos" in builtin_names:
            report.add(
                Check(
                    "builtin shadowing",
                    False,
                    "this lfx has a built-in 'createos' sandbox backend, which refuses the plugin of that name",
                    "use an lfx release without the in-tree createos backend (1.13.x)",
                    ("backend",),
                )
            )
        else:
            report.add(Check("builtin shadowing", True, "no built-in 'createos' backend in this lfx"))
    except Exception as exc:  # an lfx without the registry cannot load the backend at all
        report.add(
            Check(
                "sandbox registry",
                False,
                f"lfx has no sandbox backend registry ({exc})",
                "upgrade to lfx 1.13",
                ("backend",),
            )
        )


def _check_policy(report: Report) -> Any:
    try:
        backend = settings.backend_settings()
    except SettingsError as exc:
        report.add(Check("backend settings", False, str(exc), "fix the variable named above", ("backend",)))
        return None
    if backend.allowed_domains:
        report.add(
            Check(
                "network policy",
                False,
                f"LANGFLOW_SANDBOX_ALLOWED_DOMAINS={','.join(backend.allowed_domains)} is refused: CreateOS "
                "does not enforce hostname rules",
                "unset LANGFLOW_SANDBOX_ALLOWED_DOMAINS; choose LANGFLOW_SANDBOX_ALLOW_NETWORK=true or false",
                ("backend",),
            )
        )
    elif not backend.allow_network and not backend.accept_egress_exceptions:
        report.add(
            Check(
                "network policy",
                False,
                "egress is off but 169.254.0.0/16 stays reachable; runs are refused until you acknowledge it",
                "export LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS=true "
                "(or LANGFLOW_SANDBOX_ALLOW_NETWORK=true)",
                ("backend",),
            )
        )
    else:
        verdict = "open (unrestricted)" if backend.allow_network else "deny-all, 169.254.0.0/16 acknowledged"
        report.add(Check("network policy", True, verdict))
    try:
        executor = settings.executor_settings()
        report.add(
            Check(
                "executor settings",
                True,
                f"shape {executor.shape}, rootfs {executor.rootfs}, timeout {executor.timeout_seconds}s, "
                f"egress {','.join(executor.egress)}",
            )
        )
    except SettingsError as exc:
        report.add(Check("executor settings", False, str(exc), "fix the variable named above", ("executor",)))
    return backend


def _check_control_plane(report: Report, backend: Any) -> None:
    from langflow_sandbox_createos import runtime

    try:
        key = settings.api_key()
        report.add(Check("API key", True, f"set from {key.source}"))
    except SettingsError as exc:
        report.add(Check("API key", False, str(exc), "export CREATEOS_SANDBOX_API_KEY=..."))
        return
    try:
        url = settings.base_url()
        report.add(Check("base URL", True, url))
    except SettingsError as exc:
        report.add(Check("base URL", False, str(exc), "fix CREATEOS_SANDBOX_BASE_URL"))
        return
    try:
        endpoint = runtime.endpoints.get()
        who = endpoint.client.whoami()  # type: ignore[attr-defined]
        stats = who.get("stats") or {}
        report.add(
            Check(
                "control plane",
                True,
                f"{url} accepted the key (user {who.get('user_id', '?')}, "
                f"{stats.get('running', 0)} running, {stats.get('paused', 0)} paused)",
            )
        )
    except Exception as exc:
        report.add(
            Check(
                "control plane",
                False,
                runtime.describe(exc),
                "check CREATEOS_SANDBOX_BASE_URL, the network and the key",
            )
        )
        return
    _check_isolation(report, runtime.plane_isolation(who))
    if backend is None:
        return
    try:
        shape = runtime.pick_shape(runtime.catalog(endpoint), backend.memory_mb, backend.shape)
        report.add(
            Check(
                "backend shape",
                True,
                f"{shape} (floor max(LANGFLOW_SANDBOX_MEMORY_MB={backend.memory_mb}, 4096) MiB"
                + (", pinned by CREATEOS_SANDBOX_SHAPE)" if backend.shape else ")"),
            )
        )
    except Exception as exc:
        report.add(
            Check(
                "backend shape",
                False,
                str(exc),
                "adjust CREATEOS_SANDBOX_SHAPE or LANGFLOW_SANDBOX_MEMORY_MB",
                ("backend",),
            )
        )


def _check_isolation(report: Report, isolation: str) -> None:
    """What the control plane's guests really are, and what the backend tells lfx."""
    if isolation == "hardware-virtualized":
        report.add(Check("isolation", True, "hardware-virtualized: each guest is a microVM"))
        return
    try:
        accepted = settings.accept_local_isolation()
    except SettingsError as exc:
        report.add(Check("isolation", False, str(exc), "fix the variable named above", ("backend",)))
        return
    truth = f"{isolation!r}: guests are processes in Linux namespaces on this machine's shared kernel, not microVMs"
    if accepted:
        report.add(
            Check(
                "isolation",
                None,
                f"{truth}; CREATEOS_SANDBOX_ACCEPT_LOCAL_ISOLATION=true accepts it, so the backend reports "
                "hardware-virtualized to lfx (tests and demos only)",
            )
        )
    else:
        report.add(
            Check(
                "isolation",
                False,
                f"{truth}; the backend reports that to lfx, which refuses to run the Python Interpreter on it",
                "point CREATEOS_SANDBOX_BASE_URL at CreateOS, or export CREATEOS_SANDBOX_ACCEPT_LOCAL_ISOLATION=true "
                "(tests and demos)",
                ("backend",),
            )
        )


def _check_implementation(report: Report) -> None:
    from langflow_sandbox_createos import installation

    ours = installation.this_copy()
    try:
        native = installation.native_versions()
    except ImportError as exc:
        report.add(
            Check(
                "implementation",
                False,
                f"{ours.describe()}: the native client does not load ({exc})",
                f"reinstall {DISTRIBUTION} (the manylinux wheel bundles libcurl and jansson)",
            )
        )
        return
    imported = installation.imported_copy()
    if imported is not None and imported.directory != ours.directory:
        report.add(
            Check(
                "implementation",
                False,
                f"Python (and so Langflow) imports {imported.describe()}, which shadows this installation, "
                f"{ours.describe()}",
                f"remove the other copy: rm -r {imported.directory} and its "
                f"{DISTRIBUTION} dist-info, or pip uninstall it in the environment that installed it",
            )
        )
        return
    report.add(
        Check("implementation", True, f"{DISTRIBUTION} {ours.version or '?'}, {native}, at {ours.directory}")
    )


def _check_composition(report: Report) -> None:
    """What the surfaces do to each other when the executor is on (docs/executor.md)."""
    if not report.surfaces.get("executor"):
        return
    if report.surfaces.get("backend"):
        python = (
            "Python Interpreter nodes in those runs still run with this host's sandbox backend (createos): "
            "the guest sends each call to the host, which runs it with its own settings and key"
        )
    else:
        python = (
            "no sandbox backend is selected here, so Python Interpreter nodes in those runs use lfx's "
            "restricted mode inside the guest, as they would in this process"
        )
    report.add(
        Check(
            "executor with the backend and component",
            None,
            f"/api/v1/run and lfx run execute whole flows in CreateOS guests; {python}. CreateOS Sandbox "
            "nodes in those runs run on this host's engine the same way (the key never enters a guest); "
            "the executor's template (CREATEOS_EXECUTOR_ROOTFS) needs langflow-sandbox-createos installed "
            "for flows that hold one, like any component's package. Canvas runs (the Playground, a "
            "node's play button) do not use the executor: they use the backend and the component directly.",
        )
    )


def doctor(environ: dict[str, str] | None = None) -> Report:
    env = dict(os.environ) if environ is None else environ
    surfaces, checks = _surfaces(env)
    report = Report(surfaces=surfaces, checks=checks)
    _check_implementation(report)
    _check_entry_points(report)
    backend = _check_policy(report)
    _check_control_plane(report, backend)
    _check_composition(report)
    return report


def _print_report(report: Report) -> None:
    on = ", ".join(name for name, enabled in report.surfaces.items() if enabled) or "none"
    print(f"Surfaces switched on: {on}")
    marks = {True: "ok  ", False: "FAIL", None: "info"}
    for check in report.checks:
        print(f"[{marks[check.ok]}] {check.name}: {check.detail}")
        if check.fix and check.ok is not True:
            print(f"       fix: {check.fix}")
    print("Verdict: " + ("the configured surfaces will work" if report.ok else "fix the FAIL lines above"))


# --- reap --------------------------------------------------------------------------------------

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")


def parse_duration(text: str) -> float:
    match = _DURATION.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration such as 90s, 30m, 2h or 1d")
    scale = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]
    return float(match.group(1)) * scale


def _age_seconds(row: dict[str, Any], now: float) -> float | None:
    created = clock.parse_timestamp(row.get("created_at"))
    return None if created is None else max(0.0, now - created)


def _format_age(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


TERMINAL = frozenset({"destroyed", "destroying", "failed"})


def find_leftovers(
    rows: Sequence[dict[str, Any]],
    *,
    prefixes: Sequence[str] | None = None,
    states: Sequence[str] | None = None,
    older_than: float | None = None,
    idle_longer_than: float | None = None,
    include_active: bool = False,
    now: float | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """The rows to reap, and how many matching rows were kept as possibly in progress.

    Without `prefixes`, only names the plugin generates match (see PLUGIN_NAME); with them,
    any name starting with one of them. Unless `include_active`, a `creating` or `running`
    guest younger than ACTIVE_GRACE_SECONDS is kept: it may be running a program now.
    `idle_longer_than`: only reused guests (`lf-c-`) paused for longer than that, which is how
    the component measures idleness."""
    now = time.time() if now is None else now
    picked = []
    active = 0
    for row in rows:
        name = row.get("name") or ""
        status = row.get("status") or ""
        if prefixes is None:
            if not PLUGIN_NAME.fullmatch(name):
                continue
        elif not any(name.startswith(p) for p in prefixes):
            continue
        if states is not None and status not in states:
            continue
        if states is None and status in TERMINAL:
            continue
        age = _age_seconds(row, now)
        if older_than is not None and (age is None or age < older_than):
            continue
        idle = clock.paused_seconds(row, now)
        if idle_longer_than is not None and (
            not name.startswith(REUSED_PREFIX) or idle is None or idle <= idle_longer_than
        ):
            continue
        if not include_active and status in ACTIVE and (age is None or age < ACTIVE_GRACE_SECONDS):
            active += 1
            continue
        picked.append({**row, "age_seconds": age, "idle_seconds": idle})
    return picked, active


def _with_pause_time(client: Any, row: dict[str, Any]) -> dict[str, Any]:
    name = str(row.get("name") or "")
    if row.get("status") != "paused" or "paused_at" in row or not name.startswith(REUSED_PREFIX):
        return row
    try:
        return client.get(row["id"])
    except Exception:  # gone meanwhile, or unreadable: it is not reaped as idle
        return row


def _progress(done: int, total: int, stream: Any) -> None:
    width = 30
    filled = int(width * done / total) if total else width
    stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
    stream.flush()


def reap(args: argparse.Namespace, out: Any = None, err: Any = None) -> int:
    from langflow_sandbox_createos import runtime

    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    try:
        endpoint = runtime.endpoints.get()
        rows = endpoint.client.list()  # type: ignore[attr-defined]
        if args.idle is not None:  # a list row may leave out paused_at: ask for the full view
            rows = [_with_pause_time(endpoint.client, row) for row in rows]
    except Exception as exc:
        print(f"reap: {runtime.describe(exc) if not isinstance(exc, SettingsError) else exc}", file=err)
        return 2

    def pick(rows: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
        return find_leftovers(
            rows,
            prefixes=tuple(args.prefix) if args.prefix else None,
            states=tuple(args.state) if args.state else None,
            older_than=args.older_than,
            idle_longer_than=args.idle,
            include_active=args.include_active,
        )

    leftovers, active = pick(rows)
    if args.json:
        document = {"guests": leftovers, "dry_run": not args.yes, "kept_active": active}
        json.dump(document, out, indent=2, default=str)
        out.write("\n")
    else:
        print(f"{'ID':<30} {'NAME':<24} {'STATE':<11} {'AGE':<7} IDLE", file=out)
        for row in leftovers:
            idle = row["idle_seconds"]
            print(
                f"{row.get('id', ''):<30} {row.get('name', ''):<24} {row.get('status', ''):<11} "
                f"{_format_age(row['age_seconds']):<7} {'-' if idle is None else _format_age(idle)}",
                file=out,
            )
        print(f"{len(leftovers)} guest(s) left behind by the plugin.", file=out)
        if active:
            print(
                f"Kept {active} creating or running guest(s) younger than {ACTIVE_GRACE_SECONDS // 3600}h: "
                "they may be running a program now (--include-active to include them).",
                file=out,
            )
    if not args.yes:
        if leftovers and not args.json:
            print("Dry run: nothing deleted. Re-run with --yes to delete them.", file=out)
        return 0
    deleted, failed = 0, []
    for index, row in enumerate(leftovers, 1):
        try:
            endpoint.client.delete(row["id"])  # type: ignore[attr-defined]
            deleted += 1
        except Exception as exc:
            failed.append((row["id"], runtime.describe(exc)))
        _progress(index, len(leftovers), err)
    if leftovers:
        err.write("\n")
    print(f"Deleted {deleted} of {len(leftovers)} guest(s).", file=out)
    for sandbox_id, reason in failed:
        print(f"  failed {sandbox_id}: {reason}", file=out)
    try:  # what is left now, so nobody has to check by hand (the control plane may be going away)
        rows = endpoint.client.list()  # type: ignore[attr-defined]
        if args.idle is not None:
            rows = [_with_pause_time(endpoint.client, row) for row in rows]
    except Exception as exc:
        print(f"Could not list the guests again to check: {runtime.describe(exc)}", file=out)
        return 1
    left, _ = pick(rows)
    going = sum(1 for row in left if row.get("status") == "destroying")
    print(
        f"Left now: {len(left) - going} guest(s) matching"
        + (f" ({going} more being destroyed)" if going else "")
        + ("; nothing is left." if len(left) == going else "."),
        file=out,
    )
    return 1 if failed or len(left) > going else 0


# --- entry ------------------------------------------------------------------------------------


def read_env_file(path: str) -> dict[str, str]:
    """``NAME=value`` lines (``export`` and shell quoting allowed, ``#`` comments), as `make run`
    writes its environment to ``.run/createos.env``."""
    import shlex

    values: dict[str, str] = {}
    with open(path, encoding="utf-8") as handle:
        for number, raw in enumerate(handle, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            words = shlex.split(line, comments=True)
            if words and words[0] == "export":
                words = words[1:]
            if len(words) != 1 or "=" not in words[0]:
                raise SettingsError(f"{path}:{number}: expected NAME=value")
            name, _, value = words[0].partition("=")
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise SettingsError(f"{path}:{number}: {name!r} is not a variable name")
            values[name] = value
    return values


def _env_file_option(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "--env-file",
        metavar="FILE",
        help="read the environment from FILE first (NAME=value lines), e.g. .run/createos.env, "
        "which `make run` writes: then this command sees what that Langflow sees",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="createos-langflow", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    doc = sub.add_parser("doctor", help="check the configuration and explain each fix")
    doc.add_argument("--json", action="store_true", help="machine-readable output")
    _env_file_option(doc)
    rp = sub.add_parser(
        "reap", help="list or delete guests left behind (lf-, lf-c-, lf-x- names; --prefix for others)"
    )
    rp.add_argument("--older-than", type=parse_duration, default=None, help="only guests older than e.g. 2h")
    rp.add_argument(
        "--prefix",
        action="append",
        help="any name with this prefix (repeatable); default: the names the plugin generates "
        "(lf-, lf-c-, lf-x- followed by hex; not the warm pools' lf-w- and lf-xw-)",
    )
    rp.add_argument(
        "--include-active",
        action="store_true",
        help="also creating/running guests younger than 2h (by default kept: a run may be in progress)",
    )
    rp.add_argument("--state", action="append", help="only guests in this state (repeatable)")
    rp.add_argument(
        "--idle",
        type=parse_duration,
        default=None,
        help="only reused guests (lf-c-) paused for longer than e.g. 1h (CREATEOS_SANDBOX_REUSE_IDLE_SECONDS)",
    )
    rp.add_argument("--yes", action="store_true", help="really delete (default: dry run)")
    rp.add_argument("--json", action="store_true", help="machine-readable output")
    _env_file_option(rp)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.env_file:
        try:
            os.environ.update(read_env_file(args.env_file))
        except (OSError, SettingsError) as exc:
            print(f"createos-langflow: --env-file: {exc}", file=sys.stderr)
            return 2
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {"doctor": _doctor_cmd, "reap": reap}
    return handlers[args.command](args)


def _doctor_cmd(args: argparse.Namespace) -> int:
    report = doctor()
    if args.json:
        print(
            json.dumps(
                {"ok": report.ok, "surfaces": report.surfaces, "checks": [asdict(c) for c in report.checks]},
                indent=2,
            )
        )
    else:
        _print_report(report)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
