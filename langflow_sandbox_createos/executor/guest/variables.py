"""Global variables in the guest: lfx resolves each `load_from_db` field as in-process, with
what the host's variable service answered for the run's user (`executor/variables.py`).

lfx's own code does the resolving (`update_params_with_load_from_db_fields`: request
variables first, then the variable service, then the environment fallback, with its errors
and messages); three of its seams answer from the host's lookups instead of a database the
guest does not have: the session it opens (a database session where the host had one), the
variable service's `get_variable`, and `safe_getenv` (the host's environment fallback for the
names the host sent). A name the host did not send falls back to the guest's own environment
(the variables `CREATEOS_EXECUTOR_ENV` forwards), never over a value the user stored.
"""

from __future__ import annotations

import contextlib
from typing import Any

from langflow_sandbox_createos.executor.guest.sandbox_bridge import _replace_everywhere

_NOT_SENT = (
    "CreateOS executor: the global variable {name!r} (field {field!r}) was not resolved for this "
    "run: the host sends a guest only the variables its flow's fields load from the database "
    "(docs/executor.md, Global variables)"
)
_VARIABLE_ERRORS: dict[str, type[Exception]] = {
    "ValueError": ValueError,
    "TypeError": TypeError,
    "KeyError": KeyError,
    "AttributeError": AttributeError,
}


class _HostSession:
    """The session lfx opens around its lookups, standing for the host's database session (the
    lookups themselves were made on the host): lfx takes its database path, not the noop one."""

    async def commit(self) -> None:
        return None

    async def rollback(self) -> None:
        return None

    async def close(self) -> None:
        return None


class _HostVariables:
    """The variable service as the guest's components see it: `get_variable` answers what the
    host's service answered for (name, field), raising the same class and message."""

    def __init__(self, values: list[Any]) -> None:
        self._answers: dict[tuple[str, str], dict[str, Any]] = {}
        for item in values:
            if isinstance(item, list) and len(item) == 3 and isinstance(item[2], dict):
                self._answers[(str(item[0]), str(item[1]))] = item[2]

    async def get_variable(
        self, user_id: Any = None, name: str = "", field: str = "", session: Any = None
    ) -> Any:
        answer = self._answers.get((str(name), str(field)))
        if answer is None:
            raise ValueError(_NOT_SENT.format(name=name, field=field))
        if "error" in answer:
            raise _variable_error(answer["error"])
        value = answer.get("value")
        if answer.get("secret") and value is not None:
            from pydantic import SecretStr

            return SecretStr(value)
        return value

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"CreateOS executor: the variable service's {name!r} is not available in the guest; a flow "
            "under the executor reads only the variables its fields load (docs/executor.md, Global variables)"
        )


def _variable_error(error: Any) -> BaseException:
    kind = error.get("type") if isinstance(error, dict) else None
    message = str(error.get("message")) if isinstance(error, dict) else str(error)
    if kind == "VariableNotFoundError":
        try:
            from lfx.services.variable.exceptions import VariableNotFoundError

            return VariableNotFoundError(message)
        except ImportError:  # an lfx without the class: its base, which lfx's checks catch
            return ValueError(message)
    return _VARIABLE_ERRORS.get(str(kind), ValueError)(message)


def _install_environ(environ: Any) -> None:
    """The host's environment values that reached this run, under their names there, and the
    host's egress policy settings: lfx's checks that read the environment (a credential the
    server environment holds may go only to a sanctioned endpoint) judge here as there."""
    import os

    if isinstance(environ, dict):
        os.environ.update({str(k): str(v) for k, v in environ.items() if isinstance(v, str)})


def _install_variables(resolved: Any) -> None:
    """Point lfx's variable seams at what the host resolved (nothing when the run names none)."""
    if not isinstance(resolved, dict):
        return
    import lfx.interface.initialize.loading as loading

    sent = resolved.get("env")
    env: dict[str, Any] = sent if isinstance(sent, dict) else {}
    original_getenv = loading.safe_getenv

    def safe_getenv(name: str) -> Any:
        if name in env:  # the host's fallback (None where the host has none, or refuses the name)
            value = env[name]
            return value if isinstance(value, str) else None
        return original_getenv(name)

    loading.safe_getenv = safe_getenv
    if resolved.get("mode") != "db":
        return
    service = _HostVariables(resolved.get("values") or [])

    @contextlib.asynccontextmanager
    async def session_scope() -> Any:
        yield _HostSession()

    loading.session_scope = session_scope
    _replace_everywhere("lfx.services.deps", "get_variable_service", lambda: service)
