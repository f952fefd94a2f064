from lfx.custom.custom_component.component import Component
from lfx.io import MessageTextInput, Output
from lfx.schema.message import Message


class GlobalReader(Component):
    """A field backed by a global variable (load_from_db), resolved from the environment when
    the run passes fallback_to_env_vars, as /api/v1/run does."""

    display_name = "Global Reader"
    inputs = [
        MessageTextInput(name="input_value", display_name="Input"),
        MessageTextInput(
            name="greeting", display_name="Greeting", value="PARITY_GLOBAL_GREETING", load_from_db=True
        ),
    ]
    outputs = [Output(display_name="Message", name="message", method="read")]

    def read(self) -> Message:
        return Message(text=f"{self.input_value}:{self.greeting}")
