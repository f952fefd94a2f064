import gc

from lfx.custom.custom_component.component import Component
from lfx.io import MessageTextInput, Output
from lfx.schema.message import Message


class HistorySnoop(Component):
    """Flow code that reads no history through lfx, but looks for chat messages anywhere in the
    guest's memory: whatever the host shipped, it finds."""

    display_name = "History Snoop"
    inputs = [MessageTextInput(name="input_value", display_name="Marker")]
    outputs = [Output(display_name="Message", name="message", method="snoop")]

    def snoop(self) -> Message:
        marker = str(self.input_value).split(":", 1)[-1]
        found = [o for o in gc.get_objects() if isinstance(o, Message) and marker in str(o.text or "")]
        texts = sorted({str(m.text) for m in found if str(m.text) != str(self.input_value)})
        return Message(text=f"seen:{len(texts)}")
