import time

from lfx.custom.custom_component.component import Component
from lfx.io import MessageTextInput, Output
from lfx.schema.message import Message


class SlowEcho(Component):
    display_name = "Slow Echo"
    inputs = [MessageTextInput(name="input_value", display_name="Input")]
    outputs = [Output(display_name="Message", name="message", method="echo")]

    def echo(self) -> Message:
        time.sleep(3)
        return Message(text=f"slow:{self.input_value}")
