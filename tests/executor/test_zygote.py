"""The warm runner of a reused executor guest (issue 45), in a real guest of createos-local.

One exec starts the zygote (lfx imported once, a Unix socket in a private directory) and
returns; each run is then an exec of the small connector, whose stdin carries that run's own
boot document (frame secret and spec), as a cold run's does. Each run must get its own
authenticated frames, outputs and exit status, runs may overlap, and a run whose exec goes
away is ended."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from langflow_sandbox_createos.core import connection, guest_spec, settings
from langflow_sandbox_createos.executor import framing
from langflow_sandbox_createos.executor.guest import BOOTSTRAP, runner_source
from langflow_sandbox_createos.executor.guest.zygote import (
    CONNECTOR,
    CONNECTOR_ARGV,
    EXIT_NO_ZYGOTE,
    ZYGOTE_SOCKET,
)
from langflow_sandbox_createos.executor.reader import FrameReader
from langflow_sandbox_createos.executor.spec import encode_runtime, run_spec

from .conftest import EXECUTOR_ROOTFS, chat_graph, middle_graph
from .flow_components.sleeper import Sleeper

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]

SOCKET = ZYGOTE_SOCKET


@pytest.fixture
def guest(executor_env: Any) -> Iterator[tuple[Any, str]]:
    endpoint = connection.endpoints.get()
    client = endpoint.client
    created = client.create(
        guest_spec.GuestSpec(
            endpoint=endpoint,
            shape="s-2vcpu-4gb",
            rootfs=EXECUTOR_ROOTFS,
            egress=("*",),
            auto_pause_seconds=600,
        ).create_request(guest_spec.random_name("lf-xz-"))
    )
    try:
        yield client, created["id"]
    finally:
        client.delete(created["id"])


def _exec(
    client: Any, sandbox_id: str, args: list[str], stdin: str, token: str, timeout: float = 240
) -> tuple[Any, list[dict[str, Any]]]:
    frames: list[dict[str, Any]] = []
    reader = FrameReader(key=bytes.fromhex(token), on_frame=frames.append, on_plain=lambda line: None)
    result = client.exec(
        sandbox_id,
        "python3",
        args,
        stdin=stdin,
        timeout=timeout,
        stream=True,
        on_output=lambda stream, text: reader.feed(text) if stream == "stdout" else None,
    )
    reader.close()
    return result, frames


def _start_zygote(client: Any, sandbox_id: str) -> dict[str, Any]:
    token = framing.new_token()
    stdin = json.dumps(
        {
            "runner": runner_source(),
            "token": token,
            "entry": "zygote_main",
            "zygote": {"socket": SOCKET, "idle_seconds": 120},
        }
    )
    result, frames = _exec(client, sandbox_id, ["-c", BOOTSTRAP], stdin, token)
    assert result.exit_code == 0, (result.exit_code, result.stderr[-2000:])
    started = [f for f in frames if f["t"] == "zygote"]
    assert started and started[0]["socket"] == SOCKET, (frames, result.stdout[-3000:], result.streamed)
    return started[0]


async def _boot(text: str, graph: Any = None) -> tuple[str, str]:
    """A run's boot document (secret + spec), as the host sends a cold run's."""
    from lfx.schema.schema import InputValueRequest

    graph = graph if graph is not None else chat_graph()
    spec, _, _ = await run_spec(graph, [], {"initial_inputs": InputValueRequest(input_value=text)})
    token = framing.new_token()
    wire = {**spec, "runtime": encode_runtime(spec["runtime"])}
    return token, json.dumps({"token": token, "spec": wire})


def _texts(frames: list[dict[str, Any]]) -> list[str]:
    outputs = next(f for f in frames if f["t"] == "outputs")
    return [
        str(result["model"]["results"]["message"]["text"])
        for run in outputs["runs"]
        for result in run["outputs"]
        if result
    ]


async def test_runs_fork_from_one_warm_runner_each_with_its_own_channel(guest: tuple[Any, str]) -> None:
    client, sandbox_id = guest
    started = _start_zygote(client, sandbox_id)
    assert started["lfx"], started
    boots = [await _boot(f"hello {n}") for n in range(3)]
    results: dict[int, tuple[Any, list[dict[str, Any]]]] = {}

    def one(n: int) -> None:
        token, stdin = boots[n]
        results[n] = _exec(client, sandbox_id, [*CONNECTOR_ARGV[:-1], SOCKET], stdin, token)

    threads = [threading.Thread(target=one, args=(n,)) for n in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    pids = set()
    for n in range(3):
        result, frames = results[n]
        assert result.exit_code == 0, (n, result.exit_code, result.stderr[-2000:])
        kinds = [f["t"] for f in frames]
        assert kinds[0] == "hello" and kinds[-1] == "done", kinds
        assert _texts(frames) == [f"hello {n}"], frames
        pids.add(frames[0]["pid"])
    assert len(pids) == 3 and started["pid"] not in pids  # three forks of the warm runner
    # a frame written with another run's secret is not this run's: each run had its own
    assert all(r[1] for r in results.values())


async def test_a_connector_without_a_warm_runner_runs_nothing(guest: tuple[Any, str]) -> None:
    client, sandbox_id = guest
    token, stdin = await _boot("nobody listens")
    result, frames = _exec(client, sandbox_id, [*CONNECTOR_ARGV[:-1], SOCKET], stdin, token)
    assert result.exit_code == EXIT_NO_ZYGOTE and frames == [], (result.exit_code, frames)
    assert "no warm runner" in result.stderr


def test_the_connector_needs_no_settings() -> None:
    """The connector is the standard library only: a guest without lfx could run it."""
    assert "import os,socket,struct,sys" in CONNECTOR and "lfx" not in CONNECTOR
    assert settings.executor_settings({}).timeout_seconds > 0


async def test_a_run_whose_exec_goes_away_is_ended(guest: tuple[Any, str]) -> None:
    """The host gives up on a run (its exec's deadline, or the run was cancelled): the connector
    is killed with its exec, and the warm runner kills the run's process group; the next run is
    served as usual."""
    client, sandbox_id = guest
    _start_zygote(client, sandbox_id)
    token, stdin = await _boot("x", middle_graph(Sleeper, "nap"))
    result, frames = _exec(client, sandbox_id, [*CONNECTOR_ARGV[:-1], SOCKET], stdin, token, timeout=20)
    assert result.timed_out and "graph" in [f["t"] for f in frames], (result.timed_out, frames)
    pid = next(f["pid"] for f in frames if f["t"] == "hello")
    # the run's process is gone once the warm runner saw its connector go: a look, repeated
    # until it is (the verdict is the process table, not a time)
    gone = client.exec(
        sandbox_id,
        "sh",
        ["-c", f"for i in $(seq 600); do [ -d /proc/{pid} ] || exit 0; sleep 0.1; done; exit 1"],
        timeout=120,
        stream=False,
    )
    assert gone.exit_code == 0, f"the run's process {pid} still runs"
    token, stdin = await _boot("after")
    result, frames = _exec(client, sandbox_id, [*CONNECTOR_ARGV[:-1], SOCKET], stdin, token)
    assert result.exit_code == 0 and _texts(frames) == ["after"], (result.exit_code, result.stderr[-1000:])
