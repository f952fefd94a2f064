"""Langflow's flow lookups in the guest (Run Flow, Sub Flow and Flow as Tool nodes), answered
from the flows the host resolved and shipped for this run (`executor/flows.py` on the host).
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any

_FLOW_MODULES = (
    "lfx.helpers",
    "lfx.helpers.flow",
    "lfx.custom.custom_component.custom_component",
    "langflow.helpers.flow",
    "langflow.helpers",
    "lfx.base.tools.run_flow",
)
_REFUSED = "createos_refused"  # marks the stand-in payload of a flow the policy refused


def _recorded_error(error: dict[str, Any]) -> BaseException:
    """The exception the host's lookup raised, raised again here with its message."""
    from lfx.utils.flow_validation import CustomComponentValidationError

    kinds: dict[str, type[BaseException]] = {
        "ValueError": ValueError,
        "CustomComponentValidationError": CustomComponentValidationError,
    }
    kind = kinds.get(str(error.get("type")))
    message = str(error.get("message"))
    return kind(message) if kind else RuntimeError(f"{error.get('type')}: {message}")


def _as_data(entry: dict[str, Any]) -> Any:
    from lfx.schema.data import Data

    payload = entry.get("payload")
    if payload is None:  # refused by the policy: get_graph's policy check raises its error
        payload = {"nodes": [], "edges": [], _REFUSED: f"id:{entry['id']}"}
    return Data(data={**entry.get("meta", {}), "id": entry["id"], "name": entry["name"], "data": payload})


def _build(entry: dict[str, Any], user_id: Any, tweaks: Any) -> Any:
    import copy

    from lfx.graph import Graph

    if "policy_error" in entry:
        raise _recorded_error(entry["policy_error"])
    payload = copy.deepcopy(entry["payload"])
    if tweaks:
        from lfx.processing.process import process_tweaks

        payload = process_tweaks(graph_data=payload, tweaks=tweaks, caller_supplied=False)
    return Graph.from_payload(payload, flow_id=entry["id"], user_id=str(user_id))


def _output_ids(graph: Any, output_type: Any) -> list[str]:
    """The vertices langflow.helpers.flow.run_flow asks for with `output_type`."""
    return [
        vertex.id
        for vertex in graph.vertices
        if output_type == "debug"
        or (vertex.is_output and (output_type == "any" or str(output_type) in vertex.id.lower()))
    ]


def _refuse_nested_hitl(graph: Any) -> None:
    try:
        from lfx.run.hitl import raise_if_nested_hitl_unsupported
    except ImportError:  # an lfx without human-in-the-loop
        return
    raise_if_nested_hitl_unsupported(graph)


async def _by_folder(**_: Any) -> list[Any]:
    raise RuntimeError(
        "listing the flows of a folder needs Langflow's database, which a CreateOS executor guest "
        "does not have; run this flow in-process (unset LANGFLOW_EXECUTOR_KIND)"
    )


class _ShippedFlows:
    """Langflow's flow lookups, answered from the flows the host resolved for this run
    (executor/flows.py, resolve), with the validation and errors of `langflow.helpers.flow`. Each
    public method stands in for the function of the same name (see `api`)."""

    def __init__(self, catalogue: dict[str, Any]) -> None:
        self.catalogue = catalogue
        self.lookups: dict[str, Any] = catalogue.get("lookups") or {}
        self.owner = catalogue.get("user_id")
        self.superuser = bool(catalogue.get("superuser"))

    def api(self) -> dict[str, Any]:
        """Each function name of Langflow's flow helpers, with what answers it here."""
        return {
            "scoped_model_provider_policy_for_target_flow": self.scoped_model_provider_policy_for_target_flow,
            "get_flow_by_id_or_name": self.get_flow_by_id_or_name,
            "get_user_is_superuser": self.get_user_is_superuser,
            "list_flows": self.list_flows,
            "find_flow": self.find_flow,
            "load_flow": self.load_flow,
            "run_flow": self.run_flow,
            "list_flows_by_flow_folder": _by_folder,
            "list_flows_by_folder_id": _by_folder,
            "list_a2a_agents_by_flow_folder": _by_folder,
            "prepare_flow_build_for_user": self.prepare_flow_build_for_user,
            "custom_component_admin_only_enabled": self.custom_component_admin_only_enabled,
            "admin_only_build_required": self.admin_only_build_required,
        }

    # -- the host's answers ---------------------------------------------------------------
    def shipped(self, user_id: Any, flow_id: Any, flow_name: Any) -> dict[str, Any]:
        """The host's answer for this lookup, after Langflow's own checks of its arguments."""
        if not user_id:
            raise ValueError("Session is invalid")
        if not (flow_id or flow_name):
            raise ValueError("Flow ID or Flow Name is required")
        key = f"id:{flow_id}" if flow_id else f"name:{flow_name}"
        if str(user_id) != str(self.owner) or key not in self.lookups:
            raise RuntimeError(
                f"flow {flow_id or flow_name!r} was not resolved on the server before this run: the "
                "CreateOS executor gives a guest only the flows its Run Flow, Sub Flow and Flow as "
                "Tool nodes name, for the user running it"
            )
        return self.lookups[key]

    def entry_for(self, user_id: Any, flow_id: Any, flow_name: Any) -> dict[str, Any]:
        """The shipped flow, or the error its lookup raised on the host, raised again."""
        entry = self.shipped(user_id, flow_id, flow_name)
        if "error" in entry:
            raise _recorded_error(entry["error"])
        if entry.get("missing"):
            raise ValueError(f"Flow {flow_id or flow_name} not found")
        return entry

    # -- Langflow's functions -------------------------------------------------------------
    @asynccontextmanager
    async def scoped_model_provider_policy_for_target_flow(
        self, *, user_id: Any, flow_id: Any = None, flow_name: Any = None
    ):
        from types import SimpleNamespace
        from uuid import UUID

        entry = self.entry_for(user_id, flow_id, flow_name)
        yield SimpleNamespace(
            id=UUID(entry["id"]), name=entry["name"], user_id=self.owner, data=entry.get("payload")
        )

    async def get_flow_by_id_or_name(
        self, *, user_id: Any = None, flow_id: Any = None, flow_name: Any = None
    ) -> Any:
        entry = self.shipped(user_id, flow_id, flow_name)
        if "error" in entry:  # a lookup that found nothing; anything else is raised again
            error = _recorded_error(entry["error"])
            if not isinstance(error, ValueError):
                raise error
            return None
        return None if entry.get("missing") else _as_data(entry)

    async def get_user_is_superuser(self, user_id: Any) -> bool:
        return self.superuser and bool(user_id) and str(user_id) == str(self.owner)

    async def list_flows(self, *, user_id: Any = None) -> list[Any]:
        if not user_id:
            raise ValueError("Session is invalid")
        if str(user_id) != str(self.owner):
            return []
        unique = {entry["id"]: entry for entry in self.lookups.values() if entry.get("id")}
        return [_as_data(entry) for entry in unique.values()]

    async def find_flow(self, flow_name: str, user_id: str) -> Any:
        from uuid import UUID

        entry = self.lookups.get(f"name:{flow_name}") if str(user_id) == str(self.owner) else None
        return UUID(entry["id"]) if entry and entry.get("id") else None

    async def load_flow(
        self, user_id: Any, flow_id: Any = None, flow_name: Any = None, tweaks: Any = None
    ) -> Any:
        return _build(self.entry_for(user_id, flow_id, flow_name), user_id, tweaks)

    async def run_flow(
        self,
        inputs: Any = None,
        tweaks: Any = None,
        flow_id: Any = None,
        flow_name: Any = None,
        output_type: Any = "chat",
        user_id: Any = None,
        run_id: Any = None,
        session_id: Any = None,
        graph: Any = None,
        execution_principal: Any = None,
    ) -> Any:
        """langflow.helpers.flow.run_flow, with the target from the shipped flows."""
        from lfx.schema.schema import INPUT_FIELD_NAME

        graph = self._target_graph(graph, flow_id, flow_name, user_id, tweaks)
        if run_id:
            from uuid import UUID

            graph.set_run_id(UUID(str(run_id)))
        if session_id:
            graph.session_id = session_id
        graph.user_id = str(user_id)
        if execution_principal is not None:
            graph.execution_principal = execution_principal
        items = [] if inputs is None else [inputs] if isinstance(inputs, dict) else list(inputs)
        outputs = _output_ids(graph, output_type)
        _refuse_nested_hitl(graph)
        return await graph.arun(
            [{INPUT_FIELD_NAME: item.get("input_value")} for item in items],
            outputs=outputs,
            inputs_components=[item.get("components", []) for item in items],
            types=[item.get("type", "chat") for item in items],
            fallback_to_env_vars=bool(self.catalogue.get("fallback_to_env_var")),
        )

    def _target_graph(self, graph: Any, flow_id: Any, flow_name: Any, user_id: Any, tweaks: Any) -> Any:
        """The graph run_flow runs: the caller's, else the shipped flow's, built here."""
        if user_id is None:
            raise ValueError("Session is invalid")
        graph_flow_id = getattr(graph, "flow_id", None) if graph is not None else None
        if flow_id is not None and graph_flow_id is not None and str(flow_id) != str(graph_flow_id):
            raise ValueError("Provided flow ID does not match the graph's target flow")
        target_id = flow_id or graph_flow_id
        target_name = flow_name or (getattr(graph, "flow_name", None) if graph is not None else None)
        entry = self.entry_for(user_id, target_id, target_name)
        return graph if graph is not None else _build(entry, user_id, tweaks)

    async def prepare_flow_build_for_user(self, target: Any, *, is_superuser: bool) -> Any:
        """The host already applied the policy to every shipped flow: a refused one raises
        the host's refusal here, where in-process it would have raised."""
        key = target.get(_REFUSED) if isinstance(target, dict) else None
        if key:
            raise _recorded_error(self.lookups[key]["policy_error"])
        return None

    def custom_component_admin_only_enabled(self) -> Any:
        return self.catalogue.get("admin_only_enabled")

    def admin_only_build_required(self, *, is_superuser: Any) -> bool:
        return bool(self.catalogue.get("admin_only")) if bool(is_superuser) == self.superuser else True


# Langflow's policy hooks, replaced in the Run Flow module only: elsewhere they keep lfx's own.
_POLICY_HOOKS = (
    "prepare_flow_build_for_user",
    "custom_component_admin_only_enabled",
    "admin_only_build_required",
)


def _install_flows(catalogue: dict[str, Any]) -> None:
    """Point every module that bound Langflow's flow lookups at the shipped flows."""
    import importlib

    api = _ShippedFlows(catalogue).api()
    for name in _FLOW_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:  # no Langflow in this guest (Run Flow then fails to import, as in-process)
            continue
        for attr, function in api.items():
            if attr in _POLICY_HOOKS and name != "lfx.base.tools.run_flow":
                continue
            if hasattr(module, attr):
                setattr(module, attr, function)
