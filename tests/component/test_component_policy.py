"""The component inside Langflow's code-execution policy, with the real installed lfx: its
gate refuses a run before any guest exists, its tweak floor protects our fields like the
Python Interpreter's code, and a public (anonymous) build is refused as lfx refuses its own
code-execution components. tests/e2e/test_policy.py proves the same through a Langflow server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from lfx.exceptions.component import ComponentBuildError
from lfx.exceptions.tweaks import TweakRefusedError
from lfx.processing.process import process_tweaks
from lfx.services.authorization.base import ExecutionPrincipal
from lfx.utils.flow_validation import is_protected_tweak_field

from langflow_sandbox_createos.component import policy
from langflow_sandbox_createos.local.testing import LocalControlPlane

from .conftest import all_ids, run_flow

OUR_TYPE = "ext:createos:CreateOSSandboxComponent@official"


@pytest.fixture
def lfx_settings() -> Iterator[Any]:
    """lfx's live settings object (the one its gate reads), restored after the test."""
    from lfx.services.deps import get_settings_service

    settings = get_settings_service().settings
    saved = {
        name: getattr(settings, name)
        for name in (
            "allow_custom_components",
            "block_code_interpreter_components",
            "custom_component_admin_only",
        )
    }
    yield settings
    for name, value in saved.items():
        setattr(settings, name, value)


def test_our_fields_are_protected_for_every_type_id(component_cls: type) -> None:
    # component_cls loaded the bundle file as Langflow does; that registered the fields
    for component_type in policy.COMPONENT_TYPES:
        for field in ("python_code", "command", "allow_network", "session_mode", "shape", "timeout_seconds"):
            assert is_protected_tweak_field(component_type, field), (component_type, field)
        assert not is_protected_tweak_field(component_type, "collect_artifacts")
    assert component_cls.__name__ in policy.COMPONENT_TYPES
    assert component_cls.name in policy.COMPONENT_TYPES
    assert component_cls.display_name in policy.COMPONENT_TYPES


def _node(node_id: str, node_type: str, fields: dict[str, tuple[str, Any]]) -> dict[str, Any]:
    template = {name: {"type": kind, "value": value} for name, (kind, value) in fields.items()}
    return {"id": node_id, "data": {"id": node_id, "type": node_type, "node": {"template": template}}}


def test_lfx_refuses_tweaks_of_our_fields_with_the_interpreters_reason(
    component_cls: type, lfx_settings: Any
) -> None:
    assert lfx_settings.tweaks_policy == "permissive"  # lfx's default: everything else tweakable
    flow = {
        "nodes": [
            _node("PythonREPLComponent-1", "PythonREPLComponent", {"python_code": ("str", "print(1)")}),
            _node(
                "CreateOSSandbox-1",
                OUR_TYPE,
                {
                    "python_code": ("str", "print(1)"),
                    "command": ("str", ""),
                    "allow_network": ("bool", False),
                    "session_mode": ("str", "off"),
                    "shape": ("str", ""),
                    "timeout_seconds": ("int", 60),
                    "collect_artifacts": ("bool", False),
                },
            ),
        ]
    }
    with pytest.raises(TweakRefusedError) as reference:
        process_tweaks(flow, {"PythonREPLComponent-1": {"python_code": "import os"}})
    tweaks = {"python_code": "x", "command": "id", "allow_network": True, "session_mode": "flow"}
    tweaks |= {"shape": "s-8vcpu-16gb", "timeout_seconds": 5}
    for field, value in tweaks.items():
        with pytest.raises(TweakRefusedError) as refused:
            process_tweaks(flow, {"CreateOSSandbox-1": {field: value}})
        assert refused.value.refused == [field]
        assert refused.value.reason == reference.value.reason
    process_tweaks(flow, {"CreateOSSandbox-1": {"collect_artifacts": True}})  # not protected
    assert flow["nodes"][1]["data"]["node"]["template"]["collect_artifacts"]["value"] is True


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("block_code_interpreter_components", True, "block_code_interpreter_components is True"),
        ("allow_custom_components", False, "allow_custom_components is False"),
        ("custom_component_admin_only", True, "restricted to administrators"),
    ],
)
def test_code_execution_disabled_refuses_before_any_guest(
    component_cls: type, env: LocalControlPlane, lfx_settings: Any, setting: str, value: bool, message: str
) -> None:
    setattr(lfx_settings, setting, value)
    before = all_ids(env)
    with pytest.raises(ComponentBuildError) as failed:
        run_flow(component_cls, python_code="print('ran')")
    assert "Python code execution is" in str(failed.value) and message in str(failed.value)
    assert all_ids(env) == before, "a refused run created a guest"


def test_anonymous_public_build_is_refused_before_any_guest(
    component_cls: type, env: LocalControlPlane
) -> None:
    before = all_ids(env)
    with pytest.raises(ComponentBuildError) as failed:
        run_flow(
            component_cls, python_code="print('ran')", principal=ExecutionPrincipal(kind="anonymous_public")
        )
    assert "Public flows cannot be built without authentication" in str(failed.value)
    assert "CreateOS Sandbox (CreateOSSandbox-t0001)" in str(failed.value)
    assert all_ids(env) == before
    # an authenticated principal runs
    ran = run_flow(
        component_cls, python_code="print('ran')", principal=ExecutionPrincipal(kind="actor", user_id="u")
    )
    assert ran.results["result"] == "ran"
