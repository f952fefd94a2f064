"""The session's chat history reaches the guest only when a component reads it (issue 27):
every executor run once shipped the session's newest 1,000 messages, so code in the guest,
LLM-written code included, could read history it would never have seen in-process."""

from __future__ import annotations

from typing import Any

import pytest

from langflow_sandbox_createos.executor import CreateOSExecutor

from .flow_components.history_snoop import HistorySnoop
from .parity.test_parity import FLOW_ID, HostMemory, live_values_graph, memory, middle, run_flow

__all__ = ["memory"]
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(240)]


async def test_a_flow_that_reads_no_history_carries_none(executor_env: Any, memory: HostMemory) -> None:
    session = "s-private"
    for secret in ("secret-one", "secret-two"):  # earlier runs of the session leave messages
        await run_flow(CreateOSExecutor(), live_values_graph(), memory, session, [{"input_value": secret}])
    assert {"secret-one", "secret-two"} <= {m.text for m in memory.messages}

    def snoop() -> Any:
        graph = middle(HistorySnoop, "snoop")
        graph.flow_id = FLOW_ID
        return graph

    # (in-process, this process holds the host's own memory, so only the guest can be asked)
    ours = await run_flow(CreateOSExecutor(), snoop(), memory, session, [{"input_value": "marker:secret"}])
    assert ours.outputs[0][0]["message"][1] == "seen:0", ours.outputs  # d5bde57: seen:2
