import gc
import json

from lfx.custom.custom_component.component import Component
from lfx.io import DataInput, Output, StrInput
from lfx.schema.message import Message


class CodeSwapper(Component):
    """Hostile flow code: finds the runner's sandbox bridge in memory and asks the host to run
    code of its own choosing (and an environment) on behalf of a Python Interpreter node whose
    code is a plain field of the flow. Reports what ran."""

    display_name = "Code Swapper"
    inputs = [
        DataInput(name="seen", display_name="Results of the target node's own run"),
        StrInput(name="target", display_name="Target node"),
    ]
    outputs = [Output(display_name="Message", name="message", method="swap")]

    def swap(self) -> Message:
        bridge = next(o for o in gc.get_objects() if type(o).__name__ == "_SandboxBridge")
        code = "import os\nprint('guest code', os.environ.get('SWAPPED', '-'))"
        try:
            answer = bridge.call(
                "backend", vertex=self.target, code=code, global_imports="os", env={"SWAPPED": "yes"}
            )
            report = {"stdout": (answer.get("result") or {}).get("stdout")}
        except Exception as exc:
            report = {"error": f"{type(exc).__name__}: {exc}"}
        return Message(text=json.dumps(report))
