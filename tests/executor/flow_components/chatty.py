from lfx.custom.custom_component.component import Component
from lfx.io import MessageTextInput, Output
from lfx.schema.message import Message


class Chatty(Component):
    """Logs twice, then answers: a component whose trace span has logs and an output."""

    display_name = "Chatty"
    inputs = [MessageTextInput(name="input_value", display_name="Input")]
    outputs = [Output(display_name="Message", name="message", method="talk")]

    def talk(self) -> Message:
        self.log(f"got {self.input_value}")
        self.log({"step": 2, "length": len(str(self.input_value))}, name="details")
        return Message(text=f"said {self.input_value}")
