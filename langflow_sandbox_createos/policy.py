"""A documented import path (docs/component.md): ``register_protected_tweak_fields()`` for
programs that call lfx's ``aload_flow_from_json`` before Langflow loaded the extension. The
code lives in ``component/policy.py``."""

from langflow_sandbox_createos.component.policy import register_protected_tweak_fields

__all__ = ["register_protected_tweak_fields"]
