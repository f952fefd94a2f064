import importlib
import os
import sys

from lfx.custom.custom_component.component import Component
from lfx.io import MessageTextInput, Output
from lfx.schema.message import Message

# A module of the image's standard library that nothing lfx loads imports.
LAZY = "tabnanny"


class LazyImporter(Component):
    display_name = "Lazy Importer"
    inputs = [MessageTextInput(name="input_value", display_name="Input")]
    outputs = [Output(display_name="Message", name="message", method="use")]

    def use(self) -> Message:
        """Imports its module only when it runs, as a model component imports its client on first
        use, and says whether its process had the module before (and its pid)."""
        loaded = LAZY in sys.modules
        importlib.import_module(LAZY)
        return Message(text=f"{os.getpid()}:{loaded}")
