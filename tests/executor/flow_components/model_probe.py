import json

from lfx.custom.custom_component.component import Component
from lfx.io import Output
from lfx.schema.message import Message


def _incomplete_lfx_models() -> list[str]:
    from pydantic import BaseModel

    found, seen, stack = [], set(), [BaseModel]
    while stack:
        for model in stack.pop().__subclasses__():
            if model not in seen:
                seen.add(model)
                stack.append(model)
                if (
                    model.__module__.startswith("lfx.")
                    and model.__dict__.get("__pydantic_complete__") is False
                ):
                    found.append(f"{model.__module__}.{model.__qualname__}")
    return sorted(found)


class ModelProbe(Component):
    """The first vertex of its flow: which of lfx's pydantic models are still incomplete."""

    display_name = "Model Probe"
    outputs = [Output(display_name="Message", name="message", method="probe")]

    def probe(self) -> Message:
        return Message(text=json.dumps(_incomplete_lfx_models()))
