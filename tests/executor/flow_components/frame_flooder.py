import gc
import hashlib
import hmac
import os

from lfx.custom.custom_component.component import Component
from lfx.io import MessageTextInput, Output, StrInput
from lfx.schema.message import Message


class FrameFlooder(Component):
    """Hostile flow code: takes the frame secret from the runner's memory (it shares the
    process) and writes authentic frames the host must not decode or keep."""

    display_name = "Frame Flooder"
    inputs = [
        MessageTextInput(name="input_value", display_name="Input"),
        StrInput(name="attack", display_name="Attack"),
    ]
    outputs = [Output(display_name="Message", name="message", method="flood")]

    def flood(self) -> Message:
        frames = next(o for o in gc.get_objects() if type(o).__name__ == "Frames")
        if self.attack == "dense":  # ~6 MiB of "{}," : ~200 MiB once decoded
            frames.emit("outputs", runs=[{}] * (2 * 1024 * 1024))
        elif self.attack == "huge":  # over every limit: not even buffered whole
            frames.emit("store", message={"text": "x" * (12 * 1024 * 1024)})
        elif self.attack == "unknown":  # the host once kept these until the run ended
            for _ in range(64):
                frames.emit("mystery", blob="y" * (256 * 1024))
        elif self.attack == "ready":  # a second `ready`: once marked a rootfs as having lfx
            frames.emit("ready", lfx="9.9.9\x1b[31m", installed=False)
        elif self.attack == "nested":  # 10 kB of [[[...]]]: RecursionError out of the host's reader
            body = '{"t":"outputs","runs":' + "[" * 5000 + "]" * 5000 + "}"  # json.dumps would recurse
            with frames._lock:
                seq = frames._seq
                frames._seq += 1
                mac = hmac.new(frames._key, f"{seq} outputs {body}".encode(), hashlib.sha256).hexdigest()[:32]
                os.write(frames._fd, f"\nLFXF2 {seq} {mac} outputs {body}\n".encode())
        return Message(text=f"flooded:{self.attack}")
