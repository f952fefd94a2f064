"""The run spec and the frame channel, without a guest: what crosses, what stays, and that the
host only believes lines the runner authenticated."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from lfx.schema.schema import InputValueRequest

from langflow_sandbox_createos.executor import CreateOSExecutor, flows
from langflow_sandbox_createos.executor.framing import encode_frame, new_token
from langflow_sandbox_createos.executor.guest import BOOTSTRAP, runner_source
from langflow_sandbox_createos.executor.reader import FrameReader
from langflow_sandbox_createos.executor.spec import SpecError, build_spec, inline_secrets

from .conftest import REPO, chat_graph

FLOW = {"data": {"nodes": [], "edges": []}}


def test_executor_shape() -> None:
    executor = CreateOSExecutor()
    assert CreateOSExecutor.kind == "createos"
    assert vars(executor) == {}  # no per-run state on the shared instance


def test_import_is_cheap_and_reads_no_settings() -> None:
    # lfx.execution itself is already loaded by lfx's ExecutorService before any plugin;
    # importing our module on top of it must pull in nothing but this package.
    code = (
        "import sys, lfx.execution, lfx.utils.sandbox.base; before = set(sys.modules);"
        "import langflow_sandbox_createos.executor as m; m.CreateOSExecutor();"
        "print(sorted(n for n in set(sys.modules) - before if not n.startswith('langflow_sandbox_createos')"
        " or n == 'langflow_sandbox_createos._createos'))"
    )
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(REPO),
        "CREATEOS_EXECUTOR_TIMEOUT_SECONDS": "not-a-number",  # would raise if read
        "CREATEOS_SANDBOX_BASE_URL": "http://example.com",  # would be refused if read
    }
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_inputs_come_from_the_unit_first() -> None:
    spec, _ = build_spec(FLOW, [{"input_value": "a"}], {"initial_inputs": InputValueRequest(input_value="b")})
    assert (spec["mode"], spec["inputs"]) == ("runs", [{"input_value": "a"}])


def test_initial_inputs_when_the_unit_has_none() -> None:
    spec, _ = build_spec(FLOW, [], {"initial_inputs": InputValueRequest(input_value="b")})
    assert spec["mode"] == "start"
    assert spec["inputs"][0]["input_value"] == "b"
    bare, _ = build_spec(FLOW, [], {"initial_inputs": {"input_value": "c"}})
    assert bare["inputs"] == [{"input_value": "c"}]


def test_options_forwarded_dropped_and_ignored() -> None:
    options: dict[str, Any] = {
        "max_iterations": 7,
        "config": {"output": {"cache": False}},
        "reset_output_values": False,
        "fallback_to_env_vars": True,
        "outputs": ["x"],
        "event_manager": object(),
        "session_id": "s",
        "open_flow_span": False,
        "_use_arun_legacy": True,
        "types": [object()],  # not JSON: dropped
        "unknown_key": object(),  # unknown: ignored
    }
    spec, dropped = build_spec(FLOW, [], options)
    assert spec["options"] == {
        "max_iterations": 7,
        "config": {"output": {"cache": False}},
        "reset_output_values": False,
        "fallback_to_env_vars": True,
        "outputs": ["x"],
    }
    assert sorted(dropped) == ["_use_arun_legacy", "open_flow_span", "types"]
    # session_id crosses (the in-process legacy path honours it); the event manager crosses
    # as the names of its callbacks, which the guest relays back to it
    assert spec["session_id"] == "s"
    assert spec["events"] == []
    json.dumps({k: v for k, v in spec.items() if k != "runtime"})


def test_graph_forms() -> None:
    graph = chat_graph()
    spec, _ = build_spec(graph, [], {})
    assert [n["id"] for n in spec["graph"]["nodes"]] == ["chat-in", "chat-out"]
    assert build_spec(json.dumps(graph.dump()), [], {})[0]["graph"] == spec["graph"]
    assert build_spec(graph.dump()["data"], [], {})[0]["graph"] == spec["graph"]
    with pytest.raises(SpecError):
        build_spec(object(), [], {})
    with pytest.raises(SpecError):
        build_spec({"data": {"edges": []}}, [], {})


def test_inline_secrets_are_named_not_shown() -> None:
    payload = {
        "nodes": [
            {
                "id": "llm",
                "data": {
                    "node": {
                        "template": {
                            "api_key": {"password": True, "value": "sk-secret"},
                            "from_var": {"password": True, "load_from_db": True, "value": "OPENAI_API_KEY"},
                        }
                    }
                },
            }
        ]
    }
    assert inline_secrets(payload) == ["llm.api_key"]


def _reader(key: bytes) -> tuple[FrameReader, list[dict[str, Any]], list[str]]:
    frames: list[dict[str, Any]] = []
    plain: list[str] = []
    return FrameReader(key=key, on_frame=frames.append, on_plain=plain.append), frames, plain


def test_frames_survive_any_chunking() -> None:
    key = os.urandom(32)
    text = "".join(encode_frame(key, i, "vertex", id=f"v{i}", note="x" * 300) for i in range(5))
    for size in (1, 7, 64, len(text)):
        reader, frames, plain = _reader(key)
        for at in range(0, len(text), size):
            reader.feed(text[at : at + size])
        reader.close()
        assert [f["id"] for f in frames] == [f"v{i}" for i in range(5)] and plain == []


def test_unauthenticated_lines_are_plain_output() -> None:
    key = os.urandom(32)
    reader, frames, plain = _reader(key)
    other = os.urandom(32)
    lines = [
        "42",
        "null",
        '"text"',
        "[1, 2]",
        '{"t": "outputs", "runs": []}',
        encode_frame(other, 0, "fatal", error="wrong key").rstrip("\n"),
        encode_frame(key, 3, "fatal", error="wrong sequence").rstrip("\n"),
        "LFXF1 0 short {}",
        "LFXF1 garbage",
    ]
    reader.feed("\n".join(lines) + "\n")
    reader.feed(encode_frame(key, 0, "done"))
    assert frames == [{"t": "done"}]
    assert plain == lines
    # a replayed frame (same sequence number) is not accepted twice
    reader.feed(encode_frame(key, 0, "done"))
    assert frames == [{"t": "done"}]


def test_runner_frames_are_accepted_by_the_host() -> None:
    """The two halves agree: the real runner's Frames writes what FrameReader accepts."""
    namespace: dict[str, Any] = {"__name__": "runner_under_test"}
    exec(compile(runner_source(), "runner.py", "exec"), namespace)
    key = os.urandom(32)
    read_fd, write_fd = os.pipe()
    try:
        writer = namespace["Frames"](write_fd, key)
        writer.emit("hello", python="3")
        writer.emit("vertex", id="a", value=float("nan"))
    finally:
        os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        data = pipe.read()
    reader, frames, plain = _reader(key)
    reader.feed(data)
    assert [f["t"] for f in frames] == ["hello", "vertex"] and plain == []


def test_bootstrap_runs_the_runner_from_stdin_only() -> None:
    """With a python lacking lfx, the runner still frames its answer; nothing is in argv or env."""
    token = new_token()
    document = json.dumps({"runner": runner_source(), "token": token, "spec": {"timeout": 30}})
    done = subprocess.run(
        [sys.executable, "-S", "-c", BOOTSTRAP],  # -S: no site-packages, so no lfx
        input=document,
        capture_output=True,
        text=True,
        env={"PATH": os.environ.get("PATH", "")},
        check=False,
    )
    reader, frames, _ = _reader(bytes.fromhex(token))
    reader.feed(done.stdout)
    assert [f["t"] for f in frames] == ["hello", "missing_lfx"]
    assert done.returncode == 3
    assert token not in done.stdout and token not in done.stderr


def test_a_line_in_tiny_pieces_costs_about_its_own_size() -> None:
    """e8f911e kept a newline-less line as a list of the pieces it came in (10 MB in 2-byte
    pieces: 363 MiB RSS, ~60 bytes a piece). Measured with tracemalloc: 200,000 new 2-character
    pieces (the list would hold ~11 MiB for a 0.4 MB line)."""
    import tracemalloc

    key = os.urandom(32)
    reader, frames, plain = _reader(key)
    pieces = 200_000
    tracemalloc.start()
    try:
        for i in range(pieces):
            reader.feed(chr(97 + i % 26) * 2)  # a new string object each time, as decoded chunks are
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * 1024 * 1024, f"{peak / 2**20:.1f} MiB for a {2 * pieces / 2**20:.2f} MiB line"
    reader.feed("\n" + encode_frame(key, 0, "done"))
    assert len(plain) == 1 and len(plain[0]) == 2 * pieces and frames == [{"t": "done"}]


def test_an_endless_line_is_passed_on_as_plain_output_at_the_cap() -> None:
    key = os.urandom(32)
    frames: list[dict[str, Any]] = []
    plain: list[str] = []
    reader = FrameReader(key=key, on_frame=frames.append, on_plain=plain.append, max_line=1000)
    for _ in range(30):
        reader.feed("x" * 100)
    assert [len(p) for p in plain] == [1100, 1100] and reader.rejected == 2
    reader.feed("\n" + encode_frame(key, 0, "done"))
    assert plain[-1] == "x" * 800 and frames == [{"t": "done"}]


def test_runtime_state_of_a_live_graph_crosses() -> None:
    """What Graph.from_payload alone loses: live-component values (a handle field here),
    graph.context, the session and the start component."""
    import pickle

    from lfx.components.input_output import ChatInput, ChatOutput
    from lfx.graph import Graph

    from langflow_sandbox_createos.executor.spec import encode_runtime

    chat_in = ChatInput(_id="chat_input")
    chat_out = ChatOutput(input_value="test", _id="chat_output")
    chat_out.set(sender_name=chat_in.message_response)
    graph = Graph(chat_in, chat_out, user_id="u-1")
    graph.context = {"request_variables": {"GREETING": "hello"}}
    spec, dropped = build_spec(graph, [], {"session_id": "s-42"})
    vertices = spec["runtime"]["vertices"]
    assert vertices["chat_output"]["input_value"] == "test"
    assert "sender_name" not in vertices["chat_output"]  # an edge: the guest wires it itself
    assert spec["runtime"]["context"] == {"request_variables": {"GREETING": "hello"}}
    assert (spec["session_id"], spec["user_id"], spec["start_component_id"]) == ("s-42", "u-1", "chat_input")
    assert dropped == []
    import base64

    decoded = pickle.loads(base64.b64decode(encode_runtime(spec["runtime"])))
    assert decoded["vertices"]["chat_output"]["input_value"] == "test"


@pytest.mark.anyio
async def test_guest_events_reach_only_registered_callbacks() -> None:
    from lfx.events.event_manager import create_default_event_manager
    from lfx.utils.sandbox.base import SandboxExecutionError

    from langflow_sandbox_createos.executor.replay import HostReplay
    from langflow_sandbox_createos.executor.spec import event_names

    seen: list[Any] = []
    manager = create_default_event_manager(None)
    manager.events["on_end_vertex"] = lambda *, data: seen.append(data)
    spec = {"events": event_names(manager), "flow_id": None}
    replay = HostReplay(manager, None, spec)
    assert await replay.handle({"t": "event", "name": "on_end_vertex", "data": {"build_data": {"id": "x"}}})
    assert seen == [{"build_data": {"id": "x"}}]
    with pytest.raises(SandboxExecutionError, match="nobody registered"):
        await replay.handle({"t": "event", "name": "__class__", "data": {}})
    assert not await replay.handle({"t": "vertex"})  # not a host-side effect: left to the executor


def _loader(node_id: str, code: str, **values: str) -> dict[str, Any]:
    template: dict[str, Any] = {"code": {"value": code}}
    template.update({name: {"value": value} for name, value in values.items()})
    return {"id": node_id, "data": {"node": {"template": template}}}


RUN_FLOW_CODE = "from lfx.base.tools.run_flow import RunFlowBaseComponent\nclass RunFlowComponent(RunFlowBaseComponent): ..."


def test_run_flow_and_sub_flow_targets_are_read_from_the_flow() -> None:
    """The flows a run loads are named in its loader nodes: by id (Run Flow) or by name."""
    flow = {
        "nodes": [
            _loader("RunFlow-a", RUN_FLOW_CODE, flow_id_selected="f-1", flow_name_selected="one"),
            _loader("RunFlow-b", RUN_FLOW_CODE, flow_name_selected="two"),
            _loader(
                "SubFlow-c", "class SubFlowComponent(Component): ... self.alist_flows()", flow_name="three"
            ),
            _loader("ChatOutput-d", "class ChatOutput(Component): ..."),
        ],
        "edges": [],
    }
    refs = flows.references(flow)
    assert [(r.node, r.key) for r in refs] == [
        ("RunFlow-a", "id:f-1"),
        ("RunFlow-b", "name:two"),
        ("SubFlow-c", "name:three"),
    ]
    build_spec(flow, [], {})  # accepted: the host resolves them before the guest starts


@pytest.mark.parametrize(
    ("node", "edges", "why"),
    [
        (_loader("RunFlow-x", RUN_FLOW_CODE), [], "not set"),
        (
            _loader("RunFlow-x", RUN_FLOW_CODE, flow_name_selected="one"),
            [{"target": "RunFlow-x", "data": {"targetHandle": {"fieldName": "flow_name_selected"}}}],
            "connected from another node",
        ),
        (
            _loader(
                "Custom-x", "class Mine(Component):\n    async def go(self): return await self.alist_flows()"
            ),
            [],
            "looks flows up",
        ),
    ],
)
def test_a_target_only_the_run_decides_is_refused_by_name(node: Any, edges: Any, why: str) -> None:
    """A flow the host cannot resolve before the run is refused, never run wrong."""
    flow = {"nodes": [node], "edges": edges}
    with pytest.raises(SpecError, match=rf"{node['id']} \(.*{why}.*LANGFLOW_EXECUTOR_KIND"):
        build_spec(flow, [], {})


@pytest.mark.anyio
async def test_without_langflow_the_catalogue_is_empty() -> None:
    """lfx alone has no flow database: the guest's lookups find nothing, as lfx's stubs."""
    flow = {"nodes": [_loader("RunFlow-a", RUN_FLOW_CODE, flow_name_selected="one")], "edges": []}
    assert await flows.resolve({"nodes": [], "edges": []}, "u") is None
    assert await flows.resolve(flow, "u") == {"user_id": "u", "lookups": {}}


def test_the_host_reads_its_lfx_version_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every run's `ready` frame compares the guest's lfx with the host's; importlib.metadata
    scans every distribution on sys.path, so the host's is read once per process."""
    import importlib.metadata

    from langflow_sandbox_createos.executor import spec as executor_spec

    reads: list[str] = []
    monkeypatch.setattr(importlib.metadata, "version", lambda name: reads.append(name) or "1.2.3")
    executor_spec._host_lfx_version.cache_clear()
    try:
        for _ in range(3):
            executor_spec.guest_knowledge.record("http://cp.test", "rootfs-a", "1.2.3")
        assert executor_spec._host_lfx_version() == "1.2.3"
        assert reads == ["lfx"]
    finally:
        executor_spec.guest_knowledge.clear()
        executor_spec._host_lfx_version.cache_clear()
