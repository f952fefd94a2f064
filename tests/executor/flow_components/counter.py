import urllib.request

from lfx.custom.custom_component.component import Component
from lfx.io import MessageTextInput, Output
from lfx.schema.message import Message


class Counter(Component):
    """Tells a server outside the guest each time it runs: the count proves no run ran twice."""

    display_name = "Counter"
    inputs = [
        MessageTextInput(name="input_value", display_name="Input"),
        MessageTextInput(name="url", display_name="Counter URL"),
    ]
    outputs = [Output(display_name="Message", name="message", method="count")]

    def count(self) -> Message:
        with urllib.request.urlopen(urllib.request.Request(self.url, data=b"1"), timeout=30) as answer:
            return Message(text=f"{self.input_value}#{answer.read().decode()}")
