"""Run Flow, Sub Flow and Flow as Tool under the whole-flow executor.

In-process, these components load their target flow from Langflow's database while the
flow runs, under the calling user, through `langflow.helpers.flow`: the target is
authorized for that user (`scoped_model_provider_policy_for_target_flow`), read
(`get_flow_by_id_or_name`), and put through the custom-component policy
(`prepare_flow_build_for_user` with the caller's superuser flag). A guest has no database.

So before the guest starts, the host does those same steps, with Langflow's own functions,
for every flow the run can reach: the targets named in the flow's loader nodes, then the
targets of those flows, and so on. Each answer (the flow, already sanitized, or the error
the lookup raised) travels in the run spec. In the guest, the same lookups answer from
these shipped flows only (`guest/flow_api.py`, `_install_flows`). A refused flow's payload is
never shipped, only its error.

A loader whose target is not a plain value in the flow (connected from another node, or
chosen by custom code that calls the flow API itself) cannot be resolved ahead of the run,
so such a flow is refused before any guest is made, naming the node.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("langflow_sandbox_createos.executor")

# The most flows one run may reach through loaders (the run's own flow not counted).
MAX_FLOWS = 32

# A loader component (recognised by its code) and the fields that name its target:
# (by id, by name). Run Flow's `flow_id_selected` wins over its name, as in-process.
_LOADERS: tuple[tuple[str, str | None, str], ...] = (
    ("RunFlowBaseComponent", "flow_id_selected", "flow_name_selected"),
    ("class SubFlowComponent", None, "flow_name"),
    ("class FlowToolComponent", None, "flow_name"),
)
# Code that reaches the flow database by itself, with a target no field of the node names.
_FLOW_API = (
    "list_flows",
    "load_flow(",
    "run_flow(",
    "get_flow_by_id_or_name",
    "find_flow(",
)


class FlowReferenceError(ValueError):
    """A loader whose target cannot be known before the run."""


@dataclass(frozen=True)
class Reference:
    node: str
    flow_id: str | None
    flow_name: str | None

    @property
    def key(self) -> str:
        """The lookup a loader makes: by id when it has one, else by name (as Langflow does)."""
        return f"id:{self.flow_id}" if self.flow_id else f"name:{self.flow_name}"


def _field_value(template: Mapping[str, Any], name: str | None) -> str | None:
    if name is None:
        return None
    fld = template.get(name)
    value = fld.get("value") if isinstance(fld, Mapping) else None
    return value.strip() if isinstance(value, str) and value.strip() else None


def node_templates(payload: Mapping[str, Any]) -> Iterator[tuple[Mapping[str, Any], Mapping[str, Any]]]:
    """(node, its template) for every node of a flow's JSON that has a template."""
    for node in payload.get("nodes") or []:
        try:
            template = node["data"]["node"]["template"]
        except (KeyError, TypeError):
            continue
        if isinstance(template, Mapping):
            yield node, template


def connected_fields(payload: Mapping[str, Any]) -> set[tuple[str, str]]:
    """(node id, field name) of every field fed by an edge."""
    found = set()
    for edge in payload.get("edges") or []:
        try:
            handle = edge["data"]["targetHandle"]
            found.add((str(edge["target"]), str(handle["fieldName"])))
        except (KeyError, TypeError):
            continue
    return found


def references(payload: Mapping[str, Any]) -> list[Reference]:
    """The flows a payload's nodes load at run time. Raises FlowReferenceError for a loader
    whose target is not a value in the flow."""
    refs: list[Reference] = []
    problems: list[str] = []
    connected = connected_fields(payload)
    for node in payload.get("nodes") or []:
        try:
            template = node["data"]["node"]["template"]
            code = template["code"]["value"]
        except (KeyError, TypeError):
            continue
        if not isinstance(code, str) or not isinstance(template, Mapping):
            continue
        node_id = str(node.get("id"))
        loader = next((entry for entry in _LOADERS if entry[0] in code), None)
        if loader is None:
            if any(marker in code for marker in _FLOW_API):
                problems.append(f"{node_id} (its code looks flows up in Langflow's database itself)")
            continue
        _, id_field, name_field = loader
        fed = [f for f in (id_field, name_field) if f and (node_id, f) in connected]
        flow_id = _field_value(template, id_field)
        flow_name = _field_value(template, name_field)
        if fed or not (flow_id or flow_name):
            problems.append(
                f"{node_id} (its target flow is {'connected from another node' if fed else 'not set'})"
            )
            continue
        refs.append(Reference(node_id, flow_id, flow_name))
    if problems:
        raise FlowReferenceError(
            f"node(s) {', '.join(problems)} load a flow that can only be known while the flow runs. "
            "The CreateOS executor resolves the flows a run loads (Run Flow, Sub Flow, Flow as "
            "Tool) on the server before the guest starts, so the target must be chosen in the "
            "node itself. Choose the flow in the node, or run this flow in-process (unset "
            "LANGFLOW_EXECUTOR_KIND)."
        )
    return refs


def _error(exc: BaseException) -> dict[str, str]:
    return {"type": type(exc).__name__, "message": str(exc)}


def _flow_data(data: Any) -> dict[str, Any]:
    """The fields of the `Data` Langflow's lookup returns (`Flow.to_data()`), minus the payload."""
    inner = getattr(data, "data", None)
    if not isinstance(inner, Mapping):
        return {}
    return {k: v for k, v in inner.items() if k != "data"}


async def _resolve_one(lf: Any, ref: Reference, user_id: str | None, is_superuser: bool) -> dict[str, Any]:
    """What the in-process loader would get for `ref`: the flow (sanitized) or its error."""
    from lfx.utils.flow_validation import prepare_flow_build_for_user

    try:
        async with lf.scoped_model_provider_policy_for_target_flow(
            user_id=user_id, flow_id=ref.flow_id, flow_name=ref.flow_name
        ) as row:
            found = await lf.get_flow_by_id_or_name(
                user_id=user_id, flow_id=ref.flow_id, flow_name=ref.flow_name
            )
    except Exception as exc:  # what the in-process lookup raises, raised again in the guest
        return {"error": _error(exc)}
    if found is None:
        return {"missing": True}
    meta = _flow_data(found)
    payload = (found.data or {}).get("data") or {}
    entry: dict[str, Any] = {
        "id": str(getattr(row, "id", None) or meta.get("id")),
        "name": getattr(row, "name", None) or meta.get("name"),
        "meta": meta,
    }
    try:
        sanitized = await prepare_flow_build_for_user(payload, is_superuser=is_superuser)
    except Exception as exc:  # the policy refused it: only the refusal is shipped
        entry["policy_error"] = _error(exc)
        return entry
    entry["payload"] = sanitized if sanitized is not None else payload
    return entry


async def resolve(payload: Mapping[str, Any], user_id: str | None) -> dict[str, Any] | None:
    """The flows this run can load, looked up on the host as in-process. None when the flow
    loads none. Raises FlowReferenceError (see `references`)."""
    pending = references(payload)
    if not pending:
        return None
    catalogue: dict[str, Any] = {"user_id": user_id, "lookups": {}}
    try:
        from langflow.helpers import flow as lf
    except ImportError:
        # No Langflow on this host, so in-process has no flow database either: the guest's
        # lookups find nothing, as lfx's own stubs would.
        return catalogue
    from lfx.utils.flow_validation import admin_only_build_required, custom_component_admin_only_enabled

    enabled = custom_component_admin_only_enabled()
    is_superuser = bool(await lf.get_user_is_superuser(user_id)) if enabled is not False else False
    catalogue["superuser"] = is_superuser
    catalogue["admin_only_enabled"] = enabled
    catalogue["admin_only"] = (
        admin_only_build_required(is_superuser=is_superuser) if enabled is not False else False
    )
    catalogue["fallback_to_env_var"] = _fallback_to_env_var()
    lookups: dict[str, Any] = catalogue["lookups"]
    while pending:
        ref = pending.pop(0)
        if ref.key in lookups:
            continue
        if len(lookups) >= MAX_FLOWS:
            raise FlowReferenceError(
                f"this flow reaches more than {MAX_FLOWS} flows through Run Flow, Sub Flow or Flow as "
                "Tool; the CreateOS executor ships at most that many to one guest. Run it in-process."
            )
        entry = await _resolve_one(lf, ref, user_id, is_superuser)
        lookups[ref.key] = entry
        if entry.get("id"):  # a Sub Flow finds its target by name, then loads it by id
            lookups.setdefault(f"id:{entry['id']}", entry)
        if "payload" in entry:
            pending += references(entry["payload"])
    logger.debug("CreateOS executor: resolved %d flow lookup(s) on the host", len(lookups))
    return catalogue


def _fallback_to_env_var() -> bool:
    """Langflow's `fallback_to_env_var` setting, which its `run_flow` passes to a subflow."""
    try:
        from lfx.services.deps import get_settings_service

        service = get_settings_service()
        return bool(service.settings.fallback_to_env_var) if service is not None else False
    except Exception:  # settings that cannot be read: lfx's own run_flow passes False
        return False


def flow_ids(catalogue: Mapping[str, Any] | None) -> set[str]:
    """Ids of the flows a run was given: messages stored under them are the run's own."""
    if not catalogue:
        return set()
    return {
        str(e["id"]) for e in catalogue.get("lookups", {}).values() if isinstance(e, Mapping) and e.get("id")
    }
