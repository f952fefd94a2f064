"""Whole numbers from settings and the component's timeout: ASCII digits only, bounded, and
always a message that names what is allowed (never a raw int() or OverflowError)."""

from __future__ import annotations

import pytest

from langflow_sandbox_createos.component import engine
from langflow_sandbox_createos.core import settings
from langflow_sandbox_createos.core.settings import SettingsError


@pytest.mark.parametrize("text", ["٣", "\uff13", "1_000", "--5", "+-5", "5.0", "", " ", "0x10", "9" * 40])
def test_not_whole_numbers(text: str) -> None:
    assert settings.whole_number(text) is None


@pytest.mark.parametrize(("text", "number"), [("15", 15), (" 15 ", 15), ("+7", 7), ("-5", -5), ("007", 7)])
def test_whole_numbers(text: str, number: int) -> None:
    assert settings.whole_number(text) == number


@pytest.mark.parametrize("value", ["٣", "--5", "1_0", "three"])
def test_check_timeout_refuses_what_is_not_ascii_digits(value: str) -> None:
    # e8f911e: "٣" was accepted as 3 and "--5" raised int()'s own "invalid literal" message
    with pytest.raises(ValueError) as info:
        engine.check_timeout(value)
    assert str(info.value) == f"Timeout (seconds) must be a whole number of seconds, not {value!r}."


def test_check_timeout_range_message_for_signed_strings() -> None:
    with pytest.raises(ValueError, match="between 1 and 3600; got -5"):
        engine.check_timeout("-5")
    assert engine.check_timeout("+15") == 15


@pytest.mark.parametrize("parse", [settings.backend_settings, settings.executor_settings])
def test_max_output_bytes_has_a_maximum(parse) -> None:
    # e8f911e: accepted, and the native client then raised a raw OverflowError
    with pytest.raises(SettingsError) as info:
        parse({"CREATEOS_SANDBOX_MAX_OUTPUT_BYTES": str(10**20)})
    assert (
        "CREATEOS_SANDBOX_MAX_OUTPUT_BYTES=100000000000000000000 is above the maximum of 1073741824"
        in str(info.value)
    )
    assert parse({"CREATEOS_SANDBOX_MAX_OUTPUT_BYTES": str(2**30)}).max_output_bytes == 2**30
    with pytest.raises(SettingsError, match="is not a whole number"):
        parse({"CREATEOS_SANDBOX_MAX_OUTPUT_BYTES": "١٠٢٤٠"})


def test_component_max_output_bytes_has_a_maximum(monkeypatch: pytest.MonkeyPatch) -> None:
    from lfx.utils.sandbox.base import SandboxUnavailableError

    monkeypatch.setenv("CREATEOS_SANDBOX_MAX_OUTPUT_BYTES", str(2**64))
    with pytest.raises(SandboxUnavailableError, match="above the maximum of 1073741824"):
        engine._max_output_bytes()
