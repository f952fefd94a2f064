from lfx.custom.custom_component.component import Component
from lfx.io import MessageTextInput, Output
from lfx.schema.message import Message


class Raiser(Component):
    display_name = "Raiser"
    inputs = [MessageTextInput(name="input_value", display_name="Input")]
    outputs = [Output(display_name="Message", name="message", method="boom")]

    def boom(self) -> Message:
        msg = f"parity-boom on {self.input_value}"
        raise RuntimeError(msg)
