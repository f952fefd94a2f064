"""Native errors become lfx's in one place (`failures.native_errors`), naming what was being done."""

from __future__ import annotations

import pytest
from lfx.utils.sandbox.base import SandboxExecutionError, SandboxUnavailableError

from langflow_sandbox_createos import _createos as native
from langflow_sandbox_createos.core import failures


def test_the_error_names_the_step_the_body_was_at() -> None:
    with (
        pytest.raises(SandboxUnavailableError) as caught,
        failures.native_errors("reach the control plane") as doing,
    ):
        doing.action = "create a guest"
        raise native.ConflictError("the name is taken")
    assert str(caught.value).startswith("CreateOS: could not create a guest: the name is taken")
    assert caught.value.__cause__ is None and caught.value.__suppress_context__  # never chained


def test_transient_and_refused_errors_map_to_lfx_s_two_classes() -> None:
    with pytest.raises(SandboxExecutionError) as caught, failures.native_errors("run the program"):
        raise native.TransientError("reset")
    assert type(caught.value) is SandboxExecutionError
    with pytest.raises(SandboxUnavailableError), failures.native_errors("run the program"):
        raise native.NotFoundError("gone")


def test_refine_answers_first_and_none_falls_back() -> None:
    mine = SandboxUnavailableError("said my way")
    with (
        pytest.raises(SandboxUnavailableError) as caught,
        failures.native_errors(
            "x", refine=lambda exc: mine if isinstance(exc, native.ProtocolError) else None
        ),
    ):
        raise native.ProtocolError("not json")
    assert caught.value is mine
    with (
        pytest.raises(SandboxExecutionError, match="could not x"),
        failures.native_errors("x", refine=lambda exc: None),
    ):
        raise native.TransientError("reset")


def test_other_exceptions_pass_through() -> None:
    with pytest.raises(KeyError), failures.native_errors("x"):
        raise KeyError("not a native error")
