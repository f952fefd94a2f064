"""What the stored-message answer costs: a run whose flow stores many messages, through the
whole executor against createos-local, with the host's answers on (what ships) and off.

    .venv/bin/python benchmarks/executor_replies.py [--rounds 5] [--chain 20]

The flow is ChatInput -> `chain` Chat Outputs in a row, so one run stores chain + 1
messages, and each waits for the host's answer (its id in the host's memory) before the
next vertex runs. Rounds alternate on/off on the same control plane; medians are printed
with the per-message difference and the machine's load.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from langflow_sandbox_createos.executor import CreateOSExecutor
from langflow_sandbox_createos.executor import spec as executor_spec
from langflow_sandbox_createos.local.images import TEMPLATE_NAME
from langflow_sandbox_createos.local.testing import LocalControlPlane


def chain_graph(length: int) -> Any:
    from lfx.components.input_output import ChatInput, ChatOutput
    from lfx.graph import Graph

    chat_in = ChatInput(_id="chat-in")
    previous: Any = chat_in.message_response
    out = None
    for index in range(length):
        out = ChatOutput(_id=f"chat-out-{index:02d}")
        out.set(input_value=previous)
        previous = out.message_response
    return Graph(chat_in, out, flow_id="00000000-0000-0000-0000-00000000002a", user_id="u")


async def one_run(length: int) -> tuple[float, int]:
    from lfx.execution.types import RunComplete, Unit

    unit = Unit(
        graph=chain_graph(length),
        inputs=[{"input_value": "hi"}],
        runtime_options={"session_id": "bench", "outputs": [], "_use_arun_legacy": True},
    )
    started = time.monotonic()
    items = [item async for item in CreateOSExecutor().execute(unit)]
    elapsed = time.monotonic() - started
    assert isinstance(items[-1], RunComplete)
    return elapsed, length + 1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--chain", type=int, default=20)
    args = parser.parse_args()
    shipped = executor_spec.REPLY_DIR
    times: dict[str, list[float]] = {"answers on": [], "answers off": []}
    with LocalControlPlane() as plane:
        os.environ.update(
            CREATEOS_SANDBOX_API_KEY=plane.api_key,
            CREATEOS_SANDBOX_BASE_URL=plane.url,
            CREATEOS_EXECUTOR_ROOTFS=TEMPLATE_NAME,  # createos-local's image with lfx
        )
        asyncio.run(one_run(2))  # warm: imports, connections
        for _ in range(args.rounds):
            for label, reply_dir in (("answers on", shipped), ("answers off", None)):
                executor_spec.REPLY_DIR = reply_dir  # type: ignore[assignment]
                elapsed, stored = asyncio.run(one_run(args.chain))
                times[label].append(elapsed)
    executor_spec.REPLY_DIR = shipped
    on, off = statistics.median(times["answers on"]), statistics.median(times["answers off"])
    print(
        f"flow: ChatInput -> {args.chain} Chat Outputs ({stored} stored messages), {args.rounds} rounds each"
    )
    for label, values in times.items():
        print(
            f"  {label:12s} median {statistics.median(values):.3f} s  ({', '.join(f'{v:.2f}' for v in values)})"
        )
    print(
        f"  difference   {on - off:+.3f} s per run, {(on - off) / stored * 1000:+.1f} ms per stored message"
    )
    print(f"  load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
