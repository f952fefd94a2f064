"""The shedding test's flow (tests/e2e/test_executor_shedding.py): sleeps as many seconds as
its input says (at most 60), then answers. Its source travels with the flow (Langflow's
custom component, built by the server's own `POST /api/v1/custom_component`)."""

import time

from lfx.custom.custom_component.component import Component
from lfx.io import MessageTextInput, Output
from lfx.schema.message import Message


class ShedNapper(Component):
    display_name = "Shed Napper"
    description = "Sleeps as many seconds as its input says, then answers."
    inputs = [MessageTextInput(name="input_value", display_name="Input")]
    outputs = [Output(display_name="Message", name="message", method="nap")]

    def nap(self) -> Message:
        time.sleep(min(60.0, float(str(self.input_value) or 0)))
        return Message(text=f"napped {self.input_value}")
