"""`createos-langflow doctor`: check the configuration of every surface and say how to fix what
is wrong."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from langflow_sandbox_createos.cli import installation
from langflow_sandbox_createos.cli.installation import DISTRIBUTION
from langflow_sandbox_createos.core import settings
from langflow_sandbox_createos.core.settings import SettingsError

ENTRY_POINTS = {
    "lfx.sandbox_backends": "createos",
    "langflow.extensions": "langflow-sandbox-createos",
    "lfx.executors": "createos",
}


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
    from langflow_sandbox_createos.core import connection, failures, shape_catalog

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
        endpoint = connection.endpoints.get()
        who = endpoint.client.whoami()
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
                failures.describe(exc),
                "check CREATEOS_SANDBOX_BASE_URL, the network and the key",
            )
        )
        return
    _check_isolation(report, connection.plane_isolation(who))
    if backend is None:
        return
    try:
        shape = shape_catalog.pick_shape(shape_catalog.catalog(endpoint), backend.memory_mb, backend.shape)
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


def print_report(report: Report) -> None:
    on = ", ".join(name for name, enabled in report.surfaces.items() if enabled) or "none"
    print(f"Surfaces switched on: {on}")
    marks = {True: "ok  ", False: "FAIL", None: "info"}
    for check in report.checks:
        print(f"[{marks[check.ok]}] {check.name}: {check.detail}")
        if check.fix and check.ok is not True:
            print(f"       fix: {check.fix}")
    print("Verdict: " + ("the configured surfaces will work" if report.ok else "fix the FAIL lines above"))


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
