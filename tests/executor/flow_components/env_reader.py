import json
import os

from lfx.custom.custom_component.component import Component
from lfx.io import MessageTextInput, Output
from lfx.schema.message import Message


class EnvReader(Component):
    display_name = "Env Reader"
    inputs = [MessageTextInput(name="input_value", display_name="Input")]
    outputs = [Output(display_name="Message", name="message", method="read")]

    def read(self) -> Message:
        names = ["EXECUTOR_TEST_FORWARDED", "EXECUTOR_TEST_NOT_FORWARDED", "CREATEOS_SANDBOX_API_KEY"]
        return Message(text=json.dumps({name: os.environ.get(name) for name in names}))
