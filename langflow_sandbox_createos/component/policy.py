"""The CreateOS Sandbox component inside Langflow's code-execution policy.

Two seams of the installed lfx, used the way its own Python Interpreter uses them:

- `ensure_code_execution_enabled()` (lfx.utils.python_repl_security): the component calls it
  before anything else in a run, so `allow_custom_components=false`,
  `block_code_interpreter_components=true` and `custom_component_admin_only=true` refuse the
  run with Langflow's own `CodeExecutionDisabledError` before a guest exists.
- `PROTECTED_TWEAK_FIELDS_BY_COMPONENT` (lfx.utils.flow_validation), the dict that
  `is_protected_tweak_field` consults per component type: our type ids are added to it, so a
  run's tweaks (and request variables) cannot change the fields below under any tweak policy,
  exactly like the Python Interpreter's `python_code`.

lfx's `CODE_EXECUTION_COMPONENT_TYPES` (the flow-level gate and the public-flow gate) is a
frozenset with no hook for extensions; docs/component.md says what that leaves and what the
component does instead.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping

logger = logging.getLogger("langflow_sandbox_createos.policy")

# Every identifier a node of the component can carry as its type: the extension slot id that
# saved flows store (`data.type`), the class name (lfx's request-variable check uses it), the
# component `name` and its display name.
COMPONENT_TYPES: tuple[str, ...] = (
    "ext:createos:CreateOSSandboxComponent@official",
    "CreateOSSandboxComponent",
    "CreateOSSandbox",
    "CreateOS Sandbox",
)

# The program, the network, the reuse scope, the VM size and the time budget: what the flow's
# author decided and a run's caller must not change.
PROTECTED_FIELDS: frozenset[str] = frozenset(
    {"python_code", "command", "allow_network", "session_mode", "shape", "timeout_seconds"}
)


def register_protected_tweak_fields() -> bool:
    """Add the component's fields to lfx's per-component protected tweak fields. Idempotent.
    Returns False (and logs an error) when the installed lfx has no such mutable mapping."""
    try:
        from lfx.utils import flow_validation
    except ImportError:  # no lfx: there is no tweak API to protect against
        return False
    table = getattr(flow_validation, "PROTECTED_TWEAK_FIELDS_BY_COMPONENT", None)
    if not isinstance(table, MutableMapping):
        logger.error(
            "lfx has no mutable PROTECTED_TWEAK_FIELDS_BY_COMPONENT: the CreateOS Sandbox component's "
            "code, command and network fields are NOT protected from tweaks. Set LANGFLOW_TWEAKS_POLICY=off "
            "or declared."
        )
        return False
    for component_type in COMPONENT_TYPES:
        table[component_type] = frozenset(table.get(component_type, frozenset())) | PROTECTED_FIELDS
    return True


def require_protected_tweak_fields() -> None:
    """Fail closed: no run while a tweak could change the component's protected fields."""
    if not register_protected_tweak_fields():
        raise CodeExecutionRefused(
            "CreateOS Sandbox: this lfx offers no way to protect the component's code, command and "
            "network fields from tweaks, so it refuses to run. Use a supported lfx (1.13)."
        )


class CodeExecutionRefused(ValueError):
    """The component cannot take part in Langflow's policy on this lfx."""


def public_flow_error(node: str) -> Exception:
    """lfx's refusal of a code-execution component in a public (unauthenticated) flow build,
    word for word; raised from the run because lfx's gate cannot list our type."""
    from lfx.utils.flow_validation import PublicFlowValidationError

    return PublicFlowValidationError(
        "Public flows cannot be built without authentication when they contain "
        f"code-execution components: {node}"
    )


def ensure_code_execution_enabled() -> None:
    """lfx's own gate, the one the Python Interpreter calls first. Raises lfx's
    CodeExecutionDisabledError (a ValueError) with Langflow's message."""
    from lfx.utils.python_repl_security import ensure_code_execution_enabled as lfx_gate

    lfx_gate()
