from lfx.custom.custom_component.component import Component
from lfx.io import MessageTextInput, Output
from lfx.schema.message import Message


class NeedsModule(Component):
    display_name = "Needs Module"
    inputs = [MessageTextInput(name="input_value", display_name="Input")]
    outputs = [Output(display_name="Message", name="message", method="run_it")]

    def run_it(self) -> Message:
        import createos_test_absent_module_xyz  # noqa: F401  (absent on purpose)

        return Message(text="unreachable")
