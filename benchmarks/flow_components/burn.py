"""S8's work flow: about 50 ms of CPU per run in the process that runs the flow (the Langflow
worker in-process, the guest under the executor), then its input unchanged. The CPU is counted
on the thread's own clock (`time.thread_time`), so a loaded machine makes the run slower, not
cheaper or dearer. Its source travels with the flow (Langflow's custom component)."""

import time

from lfx.custom.custom_component.component import Component
from lfx.io import MessageTextInput, Output
from lfx.schema.message import Message

CPU_SECONDS = 0.05


class S8Burn(Component):
    display_name = "S8 Burn"
    description = "Spends about 50 ms of CPU, then passes its input on."
    inputs = [MessageTextInput(name="input_value", display_name="Input")]
    outputs = [Output(display_name="Message", name="message", method="burn")]

    def burn(self) -> Message:
        began = time.thread_time()
        spins = 0
        while time.thread_time() - began < CPU_SECONDS:
            spins += sum(i * i for i in range(500)) & 1
        return Message(text=str(self.input_value))
