"""NUL in the program or an env value is refused before any guest exists, whatever the
program's length (a short one travels on stdin, a long one is uploaded)."""

from __future__ import annotations

from typing import Any

import pytest
from lfx.utils.sandbox.base import SandboxExecutionError

from langflow_sandbox_createos.backend.engine import CreateOSBackend

from .conftest import sandbox_ids


@pytest.mark.parametrize(
    ("code", "env", "what"),
    [
        ("print(1)\x00print(2)\n", None, "The program contains a NUL"),
        ("x = 1\n" * (300 * 1024 // 6) + "print(1)\x00\n", None, "The program contains a NUL"),
        ("import os; print(os.environ['V'])", {"V": "x\x00y"}, "environment variable V contains a NUL"),
    ],
)
def test_nul_is_refused_before_any_guest(
    backend: CreateOSBackend, backend_env: Any, code: str, env: dict[str, str] | None, what: str
) -> None:
    before = sandbox_ids(backend_env)
    # e8f911e: the env value arrived as "x"; the short program exited 0, the long one failed
    with pytest.raises(SandboxExecutionError) as info:
        backend.run(code, env=env)
    assert what in str(info.value)
    assert sandbox_ids(backend_env) == before
