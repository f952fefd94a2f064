"""The run's global variables, resolved on the host, where the database is.

In-process, a field that loads from the database (`load_from_db`: a Credential or Generic
global variable chosen on the canvas) is resolved while its component builds, for the run's
user, by Langflow's variable service (`CustomComponent.get_variable`), with lfx's rules around
it: request variables first, the environment as a fallback when the run allows it
(`fallback_to_env_vars`, never for a served flow with `no_env_fallback`), the error when
neither has it (lfx's `update_params_with_load_from_db_fields`). A guest has no database.

So before a run the host resolves, with the same service and for the same user, exactly the
variables the run's `load_from_db` fields name (its own flow and the flows its Run Flow /
Sub Flow / Flow as Tool nodes load, see `flows.py`), and sends what it found with the run
spec: each (name, field) with its value or the error the service raised, and for the names
the user lacks, what the host's environment fallback would give (`safe_getenv`, which
refuses the server's reserved names). The guest's lfx then resolves each field as
in-process (`guest/variables.py`). Values are never logged.

Where this process has no database (lfx run, a noop session), in-process reads the process's
environment instead (`load_from_env_vars`); the host sends what that would read, so the
guest gives every field the value it would have had here.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from langflow_sandbox_createos.core import settings
from langflow_sandbox_createos.executor.flows import connected_fields, node_templates

logger = logging.getLogger("langflow_sandbox_createos.executor")

# lfx's row-level marker of which cells of a table load from the database
# (lfx.interface.initialize.loading.TABLE_LOAD_FROM_DB_FIELDS).
TABLE_ROW_MARKER = "__load_from_db_fields"
# The most (variable, field) pairs one run resolves: far above any real flow.
MAX_LOOKUPS = 4096


class VariableLimitError(ValueError):
    """The run names more variables than one spec carries, or a value that may not cross."""


def _cell_loads(row_marker: Any, column: str) -> bool:
    """Whether a table cell names a variable (lfx's cell_load_from_db: an explicit False skips it)."""
    if isinstance(row_marker, Mapping):
        return bool(row_marker[column]) if column in row_marker else True
    if isinstance(row_marker, list):
        return column in row_marker
    return True


def _table_pairs(table: str, rows: Any, columns: list[str]) -> Iterator[tuple[str, str]]:
    for row in rows if isinstance(rows, list) else []:
        if not isinstance(row, Mapping):
            continue
        marker = row.get(TABLE_ROW_MARKER)
        for column in columns:
            name = row.get(column)
            if isinstance(name, str) and name and _cell_loads(marker, column):
                yield name, f"{table}.{column}"


def _live_pairs(graph: Any) -> Iterator[tuple[str, str]]:
    """(variable name, field) for every load_from_db field of a live Graph's vertices, as lfx
    computed them (tweaks included: a tweak with a plain value takes a field out of the list)."""
    for vertex in getattr(graph, "vertices", None) or []:
        params = getattr(vertex, "raw_params", None)
        if not isinstance(params, Mapping):
            params = getattr(vertex, "params", None) or {}
        for field in list(getattr(vertex, "load_from_db_fields", None) or []):
            if not isinstance(field, str):
                continue
            if field.startswith("table:"):
                table = field[len("table:") :]
                columns = params.get(f"{table}_load_from_db_columns") or []
                yield from _table_pairs(table, params.get(table), [c for c in columns if isinstance(c, str)])
                continue
            name = params.get(field)
            if isinstance(name, str) and name:
                yield name, field


def _json_pairs(payload: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """The same, read from a flow's JSON (a flow shipped for Run Flow, or a unit given as a dict):
    fields flagged `load_from_db` that no edge feeds."""
    fed = connected_fields(payload)
    for node, template in node_templates(payload):
        node_id = str(node.get("id"))
        for field, spec in template.items():
            if not isinstance(spec, Mapping) or (node_id, field) in fed:
                continue
            if spec.get("type") == "table":
                columns = [
                    str(c.get("name"))
                    for c in spec.get("table_schema") or []
                    if isinstance(c, Mapping) and c.get("load_from_db")
                ]
                yield from _table_pairs(field, spec.get("value"), columns)
            elif spec.get("load_from_db") and isinstance(spec.get("value"), str) and spec["value"]:
                yield spec["value"], field


def named(graph: Any, payload: Mapping[str, Any], flows: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """Every (variable name, field) the run's load_from_db fields name, in its flow and in every
    flow the host shipped for it, each once."""
    live = graph is not None and not isinstance(graph, (str, bytes, Mapping))
    pairs: list[Iterator[tuple[str, str]]] = [_live_pairs(graph) if live else _json_pairs(payload)]
    for entry in (flows or {}).get("lookups", {}).values():
        if isinstance(entry, Mapping) and isinstance(entry.get("payload"), Mapping):
            pairs.append(_json_pairs(entry["payload"]))
    seen: dict[tuple[str, str], None] = {}
    for source in pairs:
        for pair in source:
            seen.setdefault(pair, None)
            if len(seen) > MAX_LOOKUPS:
                raise VariableLimitError(
                    f"the flow names more than {MAX_LOOKUPS} global variables; the CreateOS executor "
                    "resolves at most that many per run. Run it in-process."
                )
    return list(seen)


def _error(exc: BaseException) -> dict[str, str]:
    return {"type": type(exc).__name__, "message": str(exc)}


def _user_uuid(user_id: Any) -> Any:
    """What CustomComponent.get_variable hands the service (a UUID), or the TypeError it raises."""
    if isinstance(user_id, uuid.UUID):
        return user_id
    if isinstance(user_id, str):
        return uuid.UUID(user_id)
    raise TypeError(f"Invalid user id: {user_id}")


async def resolve(
    graph: Any,
    payload: Mapping[str, Any],
    flows: Mapping[str, Any] | None,
    options: Mapping[str, Any],
    context: Mapping[str, Any],
) -> dict[str, Any] | None:
    """What the run's guest needs to resolve its load_from_db fields as this process would: None
    when the run names no variable, else {"mode": "db" | "env", "values": [[name, field, answer],
    ...], "env": {name: value or None}}. `answer` is {"value": ..., "secret": bool} or
    {"error": {"type", "message"}}, exactly what the variable service answered for the run's
    user; `env` holds what this process's environment fallback gives for the names the guest
    may fall back on (none when the run does not allow the fallback)."""
    pairs = named(graph, payload, flows)
    if not pairs:
        return None
    from lfx.services.deps import get_settings_service, session_scope
    from lfx.services.session import NoopSession
    from lfx.utils.env_var_security import safe_getenv

    no_env_fallback = bool(context.get("no_env_fallback"))
    values: list[list[Any]] = []
    async with session_scope() as session:
        settings_service = get_settings_service()
        noop = isinstance(session, NoopSession) or bool(
            settings_service and settings_service.settings.use_noop_database
        )
        if noop:  # in-process reads this process's environment (load_from_env_vars)
            names = {name for name, _ in pairs}
            env = {} if no_env_fallback else {name: _getenv(safe_getenv, name) for name in sorted(names)}
            return _checked({"mode": "env", "values": [], "env": env})
        missing = await _from_service(graph, pairs, session, values)
    fallback = bool(options.get("fallback_to_env_vars")) and not no_env_fallback
    env = {name: _getenv(safe_getenv, name) for name in sorted(missing)} if fallback else {}
    logger.debug(
        "CreateOS executor: resolved %d variable lookup(s) on the host (%d without a stored value)",
        len(values),
        len(missing),
    )
    return _checked({"mode": "db", "values": values, "env": env})


def _getenv(safe_getenv: Callable[[str], str | None], name: str) -> str | None:
    """lfx's environment fallback for `name`, never a variable that holds a control-plane key."""
    return None if name in settings.CREDENTIAL_VARIABLES else safe_getenv(name)


def _sent_values(resolved: Mapping[str, Any] | None) -> list[str]:
    """Every value a resolution hands the guest."""
    if not resolved:
        return []
    found = [v for v in (resolved.get("env") or {}).values() if isinstance(v, str) and v]
    for _, _, answer in resolved.get("values") or []:
        if isinstance(answer, Mapping) and isinstance(answer.get("value"), str) and answer["value"]:
            found.append(answer["value"])
    return found


def _checked(resolved: dict[str, Any]) -> dict[str, Any]:
    """Refuses a run whose variables would carry the CreateOS API key into its guest."""
    if any(settings.holds_the_key(value) for value in _sent_values(resolved)):
        raise VariableLimitError(
            "a global variable this flow loads holds the CreateOS API key (CREATEOS_SANDBOX_API_KEY / "
            "CREATEOS_API_KEY), which never enters a guest. Store the provider's own key in that variable."
        )
    return resolved


# --- the guest's process environment ---------------------------------------------------

# lfx's model-provider and connector egress policy, read from the environment at call time
# (lfx.utils.ssrf_protection, lfx.base.models.provider_ssrf): (variable, how the host reads it).
_POLICY: tuple[tuple[str, str, str], ...] = (
    ("LANGFLOW_SSRF_PROTECTION_ENABLED", "lfx.utils.ssrf_protection", "is_ssrf_protection_enabled"),
    ("LANGFLOW_SSRF_ALLOWED_HOSTS", "lfx.utils.ssrf_protection", "get_allowed_hosts"),
    (
        "LANGFLOW_CONNECTOR_SSRF_VALIDATION_ENABLED",
        "lfx.utils.ssrf_protection",
        "is_connector_ssrf_validation_enabled",
    ),
    ("LANGFLOW_CONNECTOR_SSRF_ALLOW_LOOPBACK", "lfx.utils.ssrf_protection", "is_connector_loopback_allowed"),
    (
        "LANGFLOW_PROVIDER_CREDENTIAL_ALLOWED_HOSTS",
        "lfx.base.models.provider_ssrf",
        "get_provider_credential_allowed_hosts",
    ),
)


def _policy_environ() -> dict[str, str]:
    """This process's effective egress policy for components, as the variables lfx reads it
    from: the guest's components then refuse (or allow) the endpoints these refuse (or allow)."""
    import importlib

    found: dict[str, str] = {}
    for name, module, function in _POLICY:
        try:
            value = getattr(importlib.import_module(module), function)()
        except Exception:  # an lfx without this policy: the guest's lfx has its own defaults
            continue
        if isinstance(value, bool):
            found[name] = "true" if value else "false"
        elif isinstance(value, (list, tuple)):
            found[name] = ",".join(str(v) for v in value)
    return found


def guest_environ(resolved: Mapping[str, Any] | None) -> dict[str, str]:
    """What the guest's process environment must hold so its components judge as they would here.

    In-process, a model component refuses to send a credential whose value is held in the server
    environment to an endpoint the operator did not sanction (lfx's `is_env_sourced_credential`
    compares against every value of os.environ). A value that reaches the guest from this
    environment (the environment fallback, or a stored variable whose value equals one here, as
    Langflow's seeded credential variables do) therefore travels with the name it has here, and
    the guest's environment holds it too; so do the egress policy settings. Never a variable
    that holds a control-plane key."""
    environ = _policy_environ()
    sent = set(_sent_values(resolved))
    for name, value in os.environ.items():
        if value in sent and name not in settings.CREDENTIAL_VARIABLES and not settings.holds_the_key(value):
            environ[name] = value
    return environ


async def _from_service(
    graph: Any, pairs: list[tuple[str, str]], session: Any, values: list[list[Any]]
) -> set[str]:
    """Each pair through the variable service for the run's user (appended to `values`); the
    names the user has no value for. No user: nothing is looked up (the guest's component
    raises lfx's own "User id is not set" before it would ask)."""
    from lfx.services.deps import get_variable_service

    missing: set[str] = set()
    user_id = getattr(graph, "user_id", None) if not isinstance(graph, Mapping) else None
    if not user_id:
        return {name for name, _ in pairs}
    service: Any = get_variable_service()
    for name, field in pairs:
        try:
            value = await service.get_variable(
                user_id=_user_uuid(user_id), name=name, field=field, session=session
            )
        except Exception as exc:  # the guest raises the same, where in-process would
            values.append([name, field, {"error": _error(exc)}])
            missing.add(name)
            continue
        secret = hasattr(value, "get_secret_value")
        plain = value.get_secret_value() if secret else value
        values.append([name, field, {"value": plain, "secret": secret}])
        if plain is None:
            missing.add(name)
    return missing
