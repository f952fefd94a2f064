import json
import os

from lfx.custom.custom_component.component import Component
from lfx.io import MessageTextInput, Output
from lfx.schema.message import Message


class KeyScanner(Component):
    """Looks for a needle (sent reversed, so the flow itself never holds it) in every process's
    environment and command line the guest can see and in the files a guest owns."""

    display_name = "Key Scanner"
    inputs = [MessageTextInput(name="input_value", display_name="Reversed needle")]
    outputs = [Output(display_name="Message", name="message", method="scan")]

    def scan(self) -> Message:
        needle = str(self.input_value)[::-1].encode()
        hits = []
        procs = 0
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            procs += 1
            for name in ("environ", "cmdline"):
                try:
                    with open(f"/proc/{pid}/{name}", "rb") as fh:
                        if needle in fh.read():
                            hits.append(f"/proc/{pid}/{name}")
                except OSError:
                    pass
        files = 0
        for top in ("/workspace", "/tmp", "/dev/shm", "/var/tmp", "/run", "/etc"):
            for root, _dirs, names in os.walk(top):
                for name in names:
                    path = os.path.join(root, name)
                    try:
                        if (
                            os.path.islink(path)
                            or not os.path.isfile(path)
                            or os.path.getsize(path) > 50_000_000
                        ):
                            continue
                        files += 1
                        with open(path, "rb") as fh:
                            if needle in fh.read():
                                hits.append(path)
                    except OSError:
                        pass
        env_names = sorted(k for k in os.environ if "API_KEY" in k or k.startswith("CREATEOS_SANDBOX_B"))
        return Message(
            text=json.dumps({"hits": hits, "procs": procs, "files": files, "env_names": env_names})
        )
