"""The frame format of the executor's guest runner: the one definition the host and the guest
share.

The host reads frames with `reader.FrameReader`; the guest runner writes them with
`guest/frames.py`'s `Frames`, and this module's text is the first part of the runner's
program (`guest.runner_source`), so both halves use the same lines. Standard library only.

Each frame is one line `LFXF2 <seq> <mac> <type> <json>`, where mac =
HMAC-SHA256(secret, "<seq> <type> <json>")[:32 hex] keyed with the per-run secret and `seq`
counts up from 0. A pooled runner's uploaded spec is `<mac>\\n<json>` with mac =
HMAC-SHA256(secret, "spec " + json). See docs/executor.md, "Framing and its threat model".
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Callable
from typing import Any

MAGIC = "LFXF2"
MAC_HEX = 32
# The runner's exit statuses.
EXIT_TIMEOUT = 124  # the runner's watchdog fired (a `timeout` frame went first)
EXIT_NO_LFX = 3
EXIT_INSTALL_FAILED = 4
EXIT_FAILED = 1  # the run raised (a `fatal` frame went first)
# The most characters of an error, a traceback or pip's output one frame carries.
TAIL_CHARS = 4000

# Every frame type the runner writes: the most bytes of JSON one may hold, and whether the
# runner writes it once per run. Flow code can learn the frame secret (it shares the runner's
# memory), so the host holds each frame to this table: an authentic frame of another type, or
# over its limit (`reader.py`), or a second one of a once-per-run type (`engine.py`), fails the
# run. Control frames are small; vertex events are capped at 512 KiB by the runner; the rest
# carry messages, code and the run's results.
_KIB, _MIB = 1024, 1024 * 1024
FRAME_TYPES: dict[str, tuple[int, bool]] = {
    # type: (byte limit, once per run)
    "hello": (64 * _KIB, True),
    "ready": (64 * _KIB, True),
    "graph": (64 * _KIB, True),
    "accepted": (64 * _KIB, True),
    "waiting": (64 * _KIB, True),
    "done": (64 * _KIB, True),
    "timeout": (64 * _KIB, False),
    "missing_lfx": (64 * _KIB, False),
    "idle_expired": (64 * _KIB, False),
    "installing": (64 * _KIB, False),
    "installed": (64 * _KIB, False),
    "install_failed": (64 * _KIB, False),
    "fatal": (64 * _KIB, False),
    "delete": (64 * _KIB, False),
    "zygote": (64 * _KIB, True),  # a reused guest's warm runner is up (its start exec only)
    "vertex": (1 * _MIB, False),
    "event": (4 * _MIB, False),
    "store": (4 * _MIB, False),
    "update": (4 * _MIB, False),
    "sandbox": (4 * _MIB, False),
    "trace": (4 * _MIB, False),
    "history": (64 * _KIB, False),
    "outputs": (8 * _MIB, True),
}
FRAME_LIMITS = {kind: limit for kind, (limit, _) in FRAME_TYPES.items()}
ONCE = frozenset(kind for kind, (_, once) in FRAME_TYPES.items() if once)


def new_token() -> str:
    """A per-run frame secret (256 bits, hex)."""
    return secrets.token_hex(32)


def frame_mac(key: bytes, seq: int, kind: str, body: str) -> str:
    return hmac.new(key, f"{seq} {kind} {body}".encode(), hashlib.sha256).hexdigest()[:MAC_HEX]


def spec_mac(key: bytes, body: bytes) -> str:
    """Authenticates a pooled runner's uploaded spec."""
    return hmac.new(key, b"spec " + body, hashlib.sha256).hexdigest()


def frame_body(kind: str, fields: dict[str, Any], default: Callable[[Any], Any] | None = None) -> str:
    """A frame's JSON: its fields and its type as `t`."""
    return json.dumps({**fields, "t": kind}, ensure_ascii=True, separators=(",", ":"), default=default)


def frame_line(key: bytes, seq: int, kind: str, body: str) -> str:
    """One frame, without its newline."""
    return f"{MAGIC} {seq} {frame_mac(key, seq, kind, body)} {kind} {body}"


def encode_frame(key: bytes, seq: int, kind: str, **fields: Any) -> str:
    """What the guest writes (used by tests to check both halves agree)."""
    return frame_line(key, seq, kind, frame_body(kind, fields)) + "\n"


def tail(text: str, limit: int = TAIL_CHARS) -> str:
    return text if len(text) <= limit else "..." + text[-limit:]
