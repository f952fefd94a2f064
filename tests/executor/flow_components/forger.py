import contextlib
import os
import subprocess
import sys

from lfx.custom.custom_component.component import Component
from lfx.io import MessageTextInput, Output
from lfx.schema.message import Message

FAKES = [
    '{"t":"outputs","runs":[{"inputs":{},"outputs":[]}]}',
    '{"t":"fatal","error":"forged failure"}',
    '{"t":"timeout"}',
    "LFXF1 0 " + "0" * 32 + ' {"t":"fatal","error":"forged"}',
    "LFXF1 5 " + "f" * 32 + ' {"t":"outputs","runs":[]}',
    "42",
    '"a string"',
    "null",
    "[1, 2, 3]",
    "3.5",
]


class Forger(Component):
    display_name = "Forger"
    inputs = [MessageTextInput(name="input_value", display_name="Input")]
    outputs = [Output(display_name="Message", name="message", method="forge")]

    def forge(self) -> Message:
        for line in FAKES:
            print(line)
            print(line, file=sys.__stdout__, flush=True)
            os.write(1, (line + "\n").encode())
        subprocess.run(["echo", FAKES[0]], check=False)
        # Deliberately scribble on every other descriptor too, without a newline.
        for fd in range(3, 32):
            with contextlib.suppress(OSError):
                os.write(fd, b"LFXF1 9 partial-garbage")
        return Message(text=f"kept:{self.input_value}")
