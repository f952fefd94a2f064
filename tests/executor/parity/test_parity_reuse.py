"""The parity suite again with CREATEOS_EXECUTOR_REUSE=true (issue 45): every run of a test's
flow and owner is forked from a reused guest's warm runner, and must still match lfx's
in-process executor in texts, events, stored messages and errors. Each test must have run on a
reused guest (checked after it), so a reuse that quietly falls back to throwaway guests fails
here."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ..conftest import served_by_reused_guests
from .test_parity import *  # noqa: F403  (the same tests, collected again under reuse)
from .test_parity import memory  # noqa: F401  (its fixture)


@pytest.fixture(autouse=True)
def _reusing(executor_env: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("CREATEOS_EXECUTOR_REUSE", "true")
    yield
    assert served_by_reused_guests() > 0, "no run of this test was served by a reused guest"
