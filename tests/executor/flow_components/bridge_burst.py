import gc
import json
import os
import time

from lfx.custom.custom_component.component import Component
from lfx.io import DataInput, IntInput, Output, StrInput
from lfx.schema.message import Message


class BridgeBurst(Component):
    """Hostile flow code: finds the runner's sandbox bridge and writes `count` sandbox requests
    for the node `target` in one write (one chunk for the host's reader), then waits for every
    answer. Reports the reply numbers served and those refused (with the refusal), in order."""

    display_name = "Bridge Burst"
    inputs = [
        DataInput(name="seen", display_name="Results of the target node's own run"),
        StrInput(name="target", display_name="Target node"),
        IntInput(name="count", display_name="Requests", value=300),
    ]
    outputs = [Output(display_name="Message", name="message", method="burst")]

    def burst(self) -> Message:
        from langflow_sandbox_createos.executor.framing import frame_body, frame_line
        from langflow_sandbox_createos.executor.guest.frames import _take_reply

        bridge = next(o for o in gc.get_objects() if type(o).__name__ == "_SandboxBridge")
        frames = bridge.frames
        with bridge._lock:
            first = bridge.asked + 1
            bridge.asked += self.count
        numbers = range(first, first + self.count)
        with frames._lock:
            lines = []
            for n in numbers:
                fields = {"request": "backend", "reply": n, "vertex": self.target, "code": f"print({n})"}
                lines.append(frame_line(frames._key, frames._seq, "sandbox", frame_body("sandbox", fields)))
                frames._seq += 1
            view = memoryview(("\n" + "\n".join(lines) + "\n").encode())
            while view:
                view = view[os.write(frames._fd, view) :]
        served, refused = [], {}
        for n in numbers:  # the run's watchdog bounds the wait, as for any reply
            found, answer = _take_reply(f"{bridge.reply_dir}/sandbox-{n}")
            while not found:
                time.sleep(0.005)
                found, answer = _take_reply(f"{bridge.reply_dir}/sandbox-{n}")
            if isinstance(answer, dict) and "result" in answer:
                served.append(n)
            else:
                error = answer.get("error") if isinstance(answer, dict) else answer
                refused[str(n)] = str(error.get("message") if isinstance(error, dict) else error)
        return Message(text=json.dumps({"served": served, "refused": refused}))
