from lfx.custom.custom_component.component import Component
from lfx.io import MessageTextInput, Output
from lfx.schema.message import Message


class RequestReader(Component):
    """Reads a request variable the way components do: graph.context["request_variables"]."""

    display_name = "Request Reader"
    inputs = [MessageTextInput(name="input_value", display_name="Input")]
    outputs = [Output(display_name="Message", name="message", method="read")]

    def read(self) -> Message:
        variables = self.graph.context.get("request_variables") or {}
        return Message(text=f"{self.input_value}:{variables.get('GREETING', 'fallback')}")
