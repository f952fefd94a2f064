import gc
import json

from lfx.custom.custom_component.component import Component
from lfx.io import DataInput, Output, StrInput
from lfx.schema.message import Message


class BridgeAbuser(Component):
    """Hostile flow code: finds the runner's sandbox bridge in memory and asks the host for
    runs no node of the flow would make in-process. Reports each answer."""

    display_name = "Bridge Abuser"
    inputs = [
        DataInput(name="seen", display_name="Results of the target node's own run"),
        StrInput(name="target", display_name="Target node"),
    ]
    outputs = [Output(display_name="Message", name="message", method="abuse")]

    def abuse(self) -> Message:
        bridge = next(o for o in gc.get_objects() if type(o).__name__ == "_SandboxBridge")
        target = self.target
        attempts = {
            # a node that is no CreateOS Sandbox node
            "not_a_sandbox_node": ("component", {"vertex": self._id, "python_code": "print(1)"}),
            # a node that does not exist
            "unknown_node": ("component", {"vertex": "CreateOSSandbox-nowhere", "python_code": "print(1)"}),
            # the real node, with its program, network, shape, reuse and image chosen by the guest
            "forged_settings": (
                "component",
                {
                    "vertex": target,
                    "python_code": "print('guest program')",
                    "command": "echo guest command",
                    "allow_network": True,
                    "shape": "s-8vcpu-32gb",
                    "session_mode": "flow",
                    "rootfs": "langflow-lfx",
                    "egress": ["*"],
                },
            ),
            # the dispatcher asked on behalf of a node that runs no code
            "backend_from_chat_output": ("backend", {"vertex": "ChatOutput-abuse", "code": "print(1)"}),
            "unknown_request": ("teleport", {"vertex": target}),
        }
        report = {}
        for name, (request, fields) in attempts.items():
            try:
                answer = bridge.call(request, **fields)
                outcome = answer.get("outcome") or {}
                report[name] = {"stdout": outcome.get("stdout"), "sandbox_id": outcome.get("sandbox_id")}
            except Exception as exc:
                report[name] = f"{type(exc).__name__}: {exc}"
        return Message(text=json.dumps(report))
