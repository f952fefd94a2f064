import time

from lfx.custom.custom_component.component import Component
from lfx.io import MessageTextInput, Output
from lfx.schema.message import Message


class Sleeper(Component):
    display_name = "Sleeper"
    inputs = [MessageTextInput(name="input_value", display_name="Input")]
    outputs = [Output(display_name="Message", name="message", method="nap")]

    def nap(self) -> Message:
        time.sleep(120)
        return Message(text="woke")
