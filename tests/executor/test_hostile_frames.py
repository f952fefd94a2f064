"""Flow code that learnt the frame secret (it shares the runner's process) cannot make the
host decode or keep more than the frame limits allow, nor change state beyond its own run
(issue 27). Measured on the host's peak RSS, four hostile runs at once."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from lfx.utils.sandbox.base import SandboxExecutionError

from langflow_sandbox_createos.executor import CreateOSExecutor, framing
from langflow_sandbox_createos.executor import reader as executor_reader
from langflow_sandbox_createos.executor import spec as executor_spec

from .conftest import drain, middle_graph
from .flow_components.frame_flooder import FrameFlooder
from .flow_components.frame_sizer import FrameSizer

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(600)]
MIB = 1024 * 1024
KEY = bytes(range(32))


def _unit(attack: str) -> Any:
    from lfx.execution.types import Unit

    return Unit(graph=middle_graph(FrameFlooder, "flood", attack=attack), inputs=[{"input_value": "x"}])


def _status(field: str) -> int:
    with open("/proc/self/status") as fh:
        line = next(line for line in fh if line.startswith(field + ":"))
    return int(line.split()[1]) * 1024


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as fh:  # 5: reset the peak RSS (VmHWM) to now
        fh.write("5")


async def _outcome(attack: str) -> str:
    try:
        items = await drain(CreateOSExecutor().execute(_unit(attack)))
    except SandboxExecutionError as exc:
        return str(exc)
    return f"completed with {type(items[-1]).__name__}"


async def test_four_hostile_runs_at_once_keep_host_memory_bounded(executor_env: Any) -> None:
    """One run of a dense 6 MiB frame once cost the host about +350 MiB (16 MiB: +354 MiB;
    four runs: +916 MiB). The frame is refused before json.loads: its estimated decode cost
    is over DECODE_FACTOR x its size."""
    await _outcome("ready")  # warm caches and imports, so the peak below is the attack's
    _reset_peak()
    before = _status("VmRSS")
    outcomes = await asyncio.gather(*(_outcome(a) for a in ("dense", "dense", "huge", "unknown")))
    growth = _status("VmHWM") - before
    assert "would take more than" in outcomes[0] and "'outputs' frame" in outcomes[0], outcomes[0]
    assert "would take more than" in outcomes[1]
    # a line over every limit is never buffered whole: refused as it grows past the cap
    assert "a frame line over the" in outcomes[2], outcomes[2]
    assert "a frame of unknown type 'mystery'" in outcomes[3], outcomes[3]
    # per run: a frame line being read (at most MAX_FRAME_LINE: its chunks, the joined bytes,
    # the text, and the native client's buffer) and no decode (every frame here is refused):
    # 4 x 4 x MAX_FRAME_LINE, plus 64 MiB for the four runs' threads, allocator arenas and
    # fixed costs. Measured: +81 to +118 MiB alone, +129 MiB once in a loaded make test (over
    # the 128 MiB this bound was before); +2,932 MiB on d5bde57 (same flooder, same four
    # runs), and one dense frame decoded costs ~+350 MiB alone.
    limit = 4 * 4 * executor_reader.MAX_FRAME_LINE + 64 * MIB
    assert growth < limit, f"host peak RSS grew {growth / MIB:.0f} MiB for four hostile runs"


async def test_a_forged_ready_frame_changes_nothing_beyond_its_run(executor_env: Any) -> None:
    executor_spec.guest_knowledge.clear()
    outcome = await _outcome("ready")
    assert "second 'ready' frame" in outcome, outcome
    # the real ready (written before any flow code ran) recorded the real version, not 9.9.9
    recorded = executor_spec.guest_knowledge._lfx  # type: ignore[attr-defined]
    assert all(version is None or "9.9.9" not in version for version in recorded.values()), recorded


def test_each_frame_type_has_a_limit_and_the_line_cap_follows() -> None:
    limits = executor_reader.FRAME_LIMITS
    assert max(limits.values()) <= 8 * MIB
    assert executor_reader.MAX_FRAME_LINE < 9 * MIB
    dense = "[" + ",".join(["{}"] * 1000) + "]"
    assert executor_reader.decode_cost(dense) > executor_reader.DECODE_FACTOR * len(dense)
    prose = '{"text": "' + "plain words, with commas, and: colons. " * 2000 + '"}'
    assert executor_reader.decode_cost(prose) <= executor_reader.decode_budget(prose)


def _nested_frame(key: bytes, depth: int) -> str:
    """An authentic `outputs` frame whose runs nest `depth` lists deep (written by hand:
    json.dumps itself would recurse)."""
    body = '{"t":"outputs","runs":' + "[" * depth + "]" * depth + "}"
    return framing.frame_line(key, 0, "outputs", body) + "\n"


def test_a_frame_nested_past_the_depth_limit_is_refused_by_the_reader() -> None:
    """A 10 kB "[[[...]]]" frame with a valid MAC passes the decode-cost bound. Fails on ac8509d:
    json.loads raised RecursionError out of FrameReader.feed; now the reader refuses it, undecoded,
    with its own FrameRefused. A frame at the limit is decoded as before."""
    key = framing.new_token().encode()
    refused: list[executor_reader.FrameRefused] = []
    frames: list[dict[str, Any]] = []
    reader = executor_reader.FrameReader(key, frames.append, lambda line: None, on_refused=refused.append)
    deep = _nested_frame(key, 5000)
    assert len(deep) > 10_000
    body = deep.split(" ", 4)[4].rstrip("\n")
    assert executor_reader.decode_cost(body) <= executor_reader.decode_budget(body)  # not dense
    reader.feed(deep)
    assert frames == [] and len(refused) == 1, (frames, refused)
    assert f"nested deeper than {executor_reader.MAX_FRAME_DEPTH} levels" in str(refused[0])
    # the deepest frame allowed: the object, then MAX_FRAME_DEPTH - 1 lists
    ok = executor_reader.FrameReader(key, frames.append, lambda line: None, on_refused=refused.append)
    ok.feed(_nested_frame(key, executor_reader.MAX_FRAME_DEPTH - 1))
    assert len(frames) == 1 and len(refused) == 1


def test_nesting_depth_reads_brackets_in_strings_as_text() -> None:
    """The depth scan drops strings, escaped quotes and backslashes included, before it counts."""
    depth = executor_reader.nesting_depth
    assert depth("1") == 0 and depth("[]") == 1 and depth('{"a":[[{}]]}') == 4
    assert depth(json.dumps({"t": "x", "a": "[[[{{{" * 500, "b": [[1]]})) == 3
    assert depth(json.dumps({"t": "x", "a": 'he said "[[[" \\ [[ \\" {{', "b": {}})) == 2
    assert depth('{"a":"\\\\","b":[[["[[["]]]}') == 4  # an escaped backslash ends no string


async def test_a_deeply_nested_frame_fails_the_run_with_the_readers_refusal(executor_env: Any) -> None:
    """The same frame written by flow code in a real executor run: the run fails with the
    reader's refusal. Fails on ac8509d, where a RecursionError came out of the executor itself."""
    outcome = await _outcome("nested")
    assert f"nested deeper than {executor_reader.MAX_FRAME_DEPTH} levels" in outcome, outcome
    assert "'outputs' frame" in outcome, outcome


def _frame_of(kind: str, size: int) -> str:
    """An authentic frame line (seq 0, the test's key) whose JSON is exactly `size` bytes."""
    bare = framing.frame_body(kind, {"pad": ""})
    body = framing.frame_body(kind, {"pad": "x" * (size - len(bare))})
    assert len(body) == size
    return framing.frame_line(KEY, 0, kind, body) + "\n"


def _read(line: str) -> tuple[list[dict[str, Any]], list[str]]:
    """What a reader makes of one line: the frames it passed on, the refusals it reported."""
    frames: list[dict[str, Any]] = []
    refused: list[str] = []
    reader = executor_reader.FrameReader(
        KEY,
        frames.append,
        lambda text: refused.append(f"plain: {text[:60]}"),
        on_refused=lambda e: refused.append(str(e)),
    )
    reader.feed(line)
    reader.close()
    return frames, refused


@pytest.mark.parametrize("kind", sorted(executor_reader.FRAME_LIMITS))
def test_each_frame_type_is_read_at_its_limit_and_refused_one_byte_over(kind: str) -> None:
    """Every type of the reader's table (so a new type is tested by construction): a frame of
    exactly its limit is decoded, one byte more is refused undecoded, naming the limit. Fails
    on ac8509d with the per-type size check off (issue 43: a 1 MiB `history` frame, limit
    64 KiB, was accepted and decoded, and this file passed)."""
    limit = executor_reader.FRAME_LIMITS[kind]
    frames, refused = _read(_frame_of(kind, limit))
    assert refused == [] and [f["t"] for f in frames] == [kind] and len(frames[0]["pad"]) > limit - 64
    frames, refused = _read(_frame_of(kind, limit + 1))
    decoded = [frame["t"] for frame in frames]
    assert decoded == [], f"a {kind!r} frame of {limit + 1} bytes was decoded"
    assert refused == [f"a {kind!r} frame of {limit + 1} bytes, over its {limit}-byte limit"], refused


async def test_a_history_frame_one_byte_over_its_limit_fails_the_run(executor_env: Any) -> None:
    """Flow code that writes an authentic `history` request of 64 KiB + 1 (the smallest limit a
    request has) fails its run, in a real guest. Fails on ac8509d with the per-type size check
    off: the request is decoded, the host reads the history and answers it, the run completes."""
    from lfx.execution.types import Unit

    size = executor_reader.FRAME_LIMITS["history"] + 1
    graph = middle_graph(FrameSizer, "write", kind="history", extra='{"reply": 999}', size=size)
    try:
        items = await drain(CreateOSExecutor().execute(Unit(graph=graph, inputs=[{"input_value": "x"}])))
    except SandboxExecutionError as exc:
        assert f"a 'history' frame of {size} bytes, over its {size - 1}-byte limit" in str(exc), exc
    else:
        pytest.fail(f"the run completed with {type(items[-1]).__name__}")
