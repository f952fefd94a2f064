"""What a guest is created with: its name, its auto-pause budget, and what may travel to it."""

from __future__ import annotations

import hashlib
import logging
import secrets

logger = logging.getLogger("langflow_sandbox_createos")


NAME_MAX = 22

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
