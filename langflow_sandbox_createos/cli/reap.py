"""`createos-langflow reap`: list (and with --yes delete) guests left behind by the plugin."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from langflow_sandbox_createos.core import clock
from langflow_sandbox_createos.core.settings import SettingsError

if TYPE_CHECKING:
    from langflow_sandbox_createos._createos import Client

# The names the plugin itself generates (22 characters: prefix + hex). The default reap
# matches these only: not the warm pools' `lf-w-` and `lf-xw-` guests (a running Langflow's
# pools; after a crash, reap them with `--prefix lf-xw- --include-active`), and
# not a sandbox someone else happened to name `lf-...`.
PLUGIN_NAME = re.compile(r"lf-[0-9a-f]{19}|lf-c-[0-9a-f]{17}|lf-x-[0-9a-f]{17}")
# A running (or creating) guest younger than this may be a run in progress: kept by default.
ACTIVE_GRACE_SECONDS = 2 * 3600
ACTIVE = frozenset({"creating", "running"})
REUSED_PREFIX = "lf-c-"  # the component's guests; Guest Reuse keeps its own until idle too long
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


def _with_pause_time(client: Client, row: dict[str, Any]) -> dict[str, Any]:
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
    from langflow_sandbox_createos.core import connection, failures

    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    try:
        endpoint = connection.endpoints.get()
        rows = endpoint.client.list()
        if args.idle is not None:  # a list row may leave out paused_at: ask for the full view
            rows = [_with_pause_time(endpoint.client, row) for row in rows]
    except Exception as exc:
        print(f"reap: {failures.describe(exc) if not isinstance(exc, SettingsError) else exc}", file=err)
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
            endpoint.client.delete(row["id"])
            deleted += 1
        except Exception as exc:
            failed.append((row["id"], failures.describe(exc)))
        _progress(index, len(leftovers), err)
    if leftovers:
        err.write("\n")
    print(f"Deleted {deleted} of {len(leftovers)} guest(s).", file=out)
    for sandbox_id, reason in failed:
        print(f"  failed {sandbox_id}: {reason}", file=out)
    try:  # what is left now, so nobody has to check by hand (the control plane may be going away)
        rows = endpoint.client.list()
        if args.idle is not None:
            rows = [_with_pause_time(endpoint.client, row) for row in rows]
    except Exception as exc:
        print(f"Could not list the guests again to check: {failures.describe(exc)}", file=out)
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
