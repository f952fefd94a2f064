"""Network rules: the egress a guest is created with, the gate before open egress, and what a
live guest's rules are compared with."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from lfx.utils.sandbox.base import SandboxUnavailableError

logger = logging.getLogger("langflow_sandbox_createos")


DENY_ALL: tuple[str, ...] = ("240.0.0.0/4",)  # reserved, unroutable: CreateOS has no deny-all token
ALLOW_ALL: tuple[str, ...] = ("*",)
LINK_LOCAL = "169.254.0.0/16"

# --- network policy ------------------------------------------------------------------------


def egress_rules(allow_network: bool) -> tuple[str, ...]:
    return ALLOW_ALL if allow_network else DENY_ALL


def egress_gate(allow_network: bool, accepted: bool) -> None:
    """Refuse egress-off runs until the link-local exception is acknowledged."""
    if allow_network or accepted:
        return
    raise SandboxUnavailableError(
        f"Network is off, but a CreateOS guest can still reach {LINK_LOCAL} (the link-local range that "
        "carries the VM metadata service), which is accepted before the deny-all rule applies. Set "
        "LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS=true to run with that exception, or turn the "
        "network on (LANGFLOW_SANDBOX_ALLOW_NETWORK=true / Allow Network) if you want it open."
    )


def domains_refusal(domains: Sequence[str]) -> SandboxUnavailableError:
    return SandboxUnavailableError(
        f"LANGFLOW_SANDBOX_ALLOWED_DOMAINS is set ({', '.join(domains)}), but CreateOS does not enforce "
        "hostname rules: it would accept and echo them while restricting nothing. Unset it and choose "
        "LANGFLOW_SANDBOX_ALLOW_NETWORK=false (deny all) or true (open); for a real domain allowlist use "
        "the exec-sandbox backend, which filters DNS inside the guest."
    )


def egress_matches(live: Iterable[str] | None, wanted: Iterable[str]) -> bool:
    """Order-insensitive; absent, empty and ["*"] all mean allow-all."""

    def norm(rules: Iterable[str] | None) -> frozenset[str]:
        items = frozenset(r.strip() for r in (rules or ()) if r.strip())
        return items if items and items != frozenset(ALLOW_ALL) else frozenset(ALLOW_ALL)

    return norm(live) == norm(wanted)
