"""What a guest is created with: its name, its auto-pause budget (read from the runs' time
budget, ``core/budget.py``), and what may travel to it."""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from langflow_sandbox_createos.core.budget import TimeBudget
    from langflow_sandbox_createos.core.connection import Endpoint

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


# A pooled guest is handed out only while it is this much younger than its auto-pause budget.
EXPIRY_MARGIN_SECONDS = 15.0


@dataclass(frozen=True, repr=False)
class GuestSpec:
    """Everything a guest is created with, for all three surfaces, and the key of every warm
    pool: guests made from equal specs are interchangeable.

    The endpoint rides along: its base URL and the API key's digest take part in equality
    (guests of one account are never another's), the key itself never does. ``envs`` is None
    when the create request carries no env (the component); env values take part in equality
    and never show in the repr. A pool whose guests get their env values at exec keys on
    :meth:`env_at_exec` instead, which blanks the values."""

    endpoint: Endpoint = field(compare=False)
    shape: str
    rootfs: str
    egress: tuple[str, ...]
    auto_pause_seconds: int
    envs: tuple[tuple[str, str], ...] | None = None
    base_url: str = field(init=False)
    key_digest: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "base_url", self.endpoint.base_url)
        object.__setattr__(self, "key_digest", self.endpoint.key_digest)

    @classmethod
    def of(
        cls,
        endpoint: Endpoint,
        *,
        shape: str,
        rootfs: str,
        egress: Iterable[str],
        budget: TimeBudget,
        envs: Mapping[str, str] | None = None,
    ) -> GuestSpec:
        """The guest spec of runs of ``budget`` (its auto-pause budget is read from it)."""
        return cls(
            endpoint=endpoint,
            shape=shape,
            rootfs=rootfs,
            egress=tuple(egress),
            auto_pause_seconds=budget.auto_pause_seconds(),
            envs=None if envs is None else tuple(sorted(envs.items())),
        )

    def env_at_exec(self) -> GuestSpec:
        """The same spec with the env values blanked: they are passed at exec, not at create."""
        return replace(self, envs=tuple((key, "") for key, _ in self.envs or ()))

    def create_request(self, name: str | None = None) -> dict[str, Any]:
        """The body of ``POST /v1/sandboxes`` (``name`` None: the control plane names it)."""
        request: dict[str, Any] = {"shape": self.shape, "rootfs": self.rootfs}
        if name is not None:
            request["name"] = name
        request["egress"] = list(self.egress)
        if self.envs is not None:
            request["envs"] = dict(self.envs)
        request["auto_pause_after_seconds"] = self.auto_pause_seconds
        return request

    def lifetime_seconds(self) -> float:
        """How long after its create request a pooled guest may still be handed out."""
        return self.auto_pause_seconds - EXPIRY_MARGIN_SECONDS

    def idle_window_seconds(self) -> float:
        """A pool unused for this long stops replacing the guests that expire."""
        return float(self.auto_pause_seconds)

    def __repr__(self) -> str:
        env_keys = [key for key, _ in self.envs or ()]
        return (
            f"{type(self).__name__}({self.base_url}, shape={self.shape}, rootfs={self.rootfs}, "
            f"egress={list(self.egress)}, env_keys={env_keys}, auto_pause={self.auto_pause_seconds}s)"
        )
