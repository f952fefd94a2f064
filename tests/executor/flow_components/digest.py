import hashlib

from lfx.custom.custom_component.component import Component
from lfx.io import MessageTextInput, MultilineInput, Output
from lfx.schema.message import Message


class Digest(Component):
    """Answers with the size and hash of a (large) parameter, not the parameter itself."""

    display_name = "Digest"
    inputs = [
        MessageTextInput(name="input_value", display_name="Input"),
        MultilineInput(name="payload", display_name="Payload", value=""),
    ]
    outputs = [Output(display_name="Message", name="message", method="digest")]

    def digest(self) -> Message:
        data = self.payload.encode()
        return Message(text=f"{self.input_value}:{len(data)}:{hashlib.sha256(data).hexdigest()}")
