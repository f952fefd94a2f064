"""What the guest runner's frames become on the host: lfx-shaped results (a vertex's
`RemoteVertexResult`, the run's `RunOutputs`) and the `GuestStatus` progress event. Nothing
the guest sends is unpickled: results are rebuilt from JSON with lfx's own models.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("langflow_sandbox_createos.executor")


@dataclass(frozen=True)
class GuestStatus:
    """A progress event that is not a vertex: the guest is up and has lfx (`status="ready"`).
    Consumers that look for `.vertex` (lfx run, Loop) skip it, as they skip `Finish`."""

    status: str
    sandbox_id: str | None
    rootfs: str
    lfx_version: str | None
    installed: bool
    pooled: bool = False  # the guest came from CREATEOS_EXECUTOR_WARM_POOL
    reused: bool = False  # a reused guest of the run's trust domain (CREATEOS_EXECUTOR_REUSE)
    standby: bool = False  # on it, the run's process was forked ahead of the run and waited for it


@dataclass(frozen=True)
class RemoteComponent:
    """Stands in for `vertex.custom_component`: consumers read its display name."""

    display_name: str | None


@dataclass(frozen=True)
class RemoteVertex:
    """The parts of an lfx Vertex that survive the trip out of the guest."""

    id: str
    display_name: str | None
    base_name: str | None
    is_output: bool
    custom_component: RemoteComponent | None


@dataclass(frozen=True)
class RemoteVertexResult:
    """A vertex built in the guest, shaped like lfx's VertexBuildResult (result_dict,
    params, valid, artifacts, vertex), so `lfx run`, Loop and other consumers that read
    those attributes work unchanged."""

    vertex: RemoteVertex
    result_dict: Any
    params: str
    valid: bool
    artifacts: Any
    omitted: str | None = None

    def to_dict(self) -> dict[str, Any]:
        result = self.result_dict
        dump = getattr(result, "model_dump", None)
        return {
            "id": self.vertex.id,
            "display_name": self.vertex.display_name,
            "component": self.vertex.custom_component.display_name if self.vertex.custom_component else None,
            "valid": self.valid,
            "params": self.params,
            "result": dump(mode="json") if callable(dump) else result,
            "artifacts": self.artifacts,
        }


def decode_result(encoded: Any) -> Any:
    """A ResultData rebuilt from the guest's encoding, with Message/Data values restored."""
    if encoded is None:
        return None
    if not isinstance(encoded, Mapping) or not isinstance(encoded.get("model"), Mapping):
        raise ValueError("a result is not {'model': {...}, 'typed': {...}}")
    from lfx.graph.schema import ResultData

    result = ResultData.model_validate(dict(encoded["model"]))
    typed = encoded.get("typed") or {}
    if isinstance(result.results, dict) and isinstance(typed, Mapping):
        for key, item in typed.items():
            if not isinstance(item, Mapping) or key not in result.results:
                continue
            try:
                if item.get("type") == "Message":
                    from lfx.schema.message import Message

                    result.results[key] = Message.model_validate(item.get("value"))
                elif item.get("type") == "Data":
                    from lfx.schema.data import Data

                    result.results[key] = Data.model_validate(item.get("value"))
            except Exception:  # keep the plain JSON form
                logger.debug("could not rebuild %s result %r", item.get("type"), key, exc_info=True)
    return result


def decode_vertex(frame: Mapping[str, Any]) -> RemoteVertexResult:
    vertex_id = frame.get("id")
    if not isinstance(vertex_id, str):
        raise ValueError("a vertex frame has no id")
    component = frame.get("component")
    vertex = RemoteVertex(
        id=vertex_id,
        display_name=frame.get("display_name") if isinstance(frame.get("display_name"), str) else None,
        base_name=frame.get("base_name") if isinstance(frame.get("base_name"), str) else None,
        is_output=bool(frame.get("is_output")),
        custom_component=RemoteComponent(component) if isinstance(component, str) else None,
    )
    return RemoteVertexResult(
        vertex=vertex,
        result_dict=decode_result(frame.get("result")),
        params=str(frame.get("params") or ""),
        valid=bool(frame.get("valid", True)),
        artifacts=frame.get("artifacts"),
        omitted=frame.get("omitted") if isinstance(frame.get("omitted"), str) else None,
    )


def decode_outputs(frame: Mapping[str, Any]) -> list[Any]:
    """list[RunOutputs] from the final outputs frame."""
    from lfx.graph.schema import RunOutputs

    runs = frame.get("runs")
    if not isinstance(runs, list):
        raise ValueError("the outputs frame has no 'runs' list")
    decoded = []
    for run in runs:
        if not isinstance(run, Mapping):
            raise ValueError("an outputs entry is not an object")
        inputs = run.get("inputs")
        outputs = [decode_result(item) for item in run.get("outputs") or []]
        decoded.append(
            RunOutputs(inputs=dict(inputs) if isinstance(inputs, Mapping) else {}, outputs=outputs)
        )
    return decoded
