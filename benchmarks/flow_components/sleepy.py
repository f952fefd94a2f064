"""S6's middle vertex: sleeps 3 s, then echoes its input. Its source travels with the
serialized graph, so the guest rebuilds it from the flow itself."""

import time

from lfx.custom.custom_component.component import Component
from lfx.io import MessageTextInput, Output
from lfx.schema.message import Message


class Sleepy(Component):
    display_name = "Sleepy"
    inputs = [MessageTextInput(name="input_value", display_name="Input")]
    outputs = [Output(display_name="Message", name="message", method="echo")]

    def echo(self) -> Message:
        time.sleep(3)
        return Message(text=f"slept:{self.input_value}")
