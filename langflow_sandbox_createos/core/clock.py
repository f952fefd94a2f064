"""Control-plane timestamps (RFC 3339 strings) as POSIX seconds. Imports nothing heavy:
the CLI uses it before it loads lfx."""

from __future__ import annotations

from datetime import datetime, timezone


def parse_timestamp(value: object) -> float | None:
    """`2026-11-30T16:31:00Z` (or with an offset, or naive = UTC) as POSIX seconds; None for
    anything else."""
    if not isinstance(value, str):
        return None
    try:
        stamp = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    return stamp.timestamp()


def paused_seconds(record: dict[str, object], now: float) -> float | None:
    """How long a guest record has been paused (from its `paused_at`); None when it is not
    paused or the control plane gave no pause time."""
    if record.get("status") != "paused":
        return None
    paused = parse_timestamp(record.get("paused_at"))
    return None if paused is None else max(0.0, now - paused)
