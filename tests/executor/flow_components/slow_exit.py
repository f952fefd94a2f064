import sys
import time

from lfx.custom.custom_component.component import Component
from lfx.io import MessageTextInput, Output
from lfx.schema.message import Message


class _SlowFlush:
    """stderr whose flush takes a minute: the runner flushes it between `done` and its exit."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        return self._stream.write(text)

    def flush(self):
        self._stream.flush()
        time.sleep(60)

    def __getattr__(self, name):
        return getattr(self._stream, name)


class SlowExit(Component):
    display_name = "Slow Exit"
    inputs = [MessageTextInput(name="input_value", display_name="Input")]
    outputs = [Output(display_name="Message", name="message", method="leave_slowly")]

    def leave_slowly(self) -> Message:
        sys.stderr = _SlowFlush(sys.stderr)
        return Message(text=f"slow-exit:{self.input_value}")
