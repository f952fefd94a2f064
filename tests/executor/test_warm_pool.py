"""CREATEOS_EXECUTOR_WARM_POOL against createos-local: one guest per run, stale guests fall
back to a fresh one without running anything twice, and no pooled guest outlives shutdown,
interpreter exit or (through `reap`) a crashed process."""

from __future__ import annotations

import asyncio
import http.server
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from lfx.execution.types import RunComplete, StepResult, Unit
from lfx.schema.schema import InputValueRequest
from lfx.utils.sandbox.base import SandboxExecutionError

from langflow_sandbox_createos import cli
from langflow_sandbox_createos.core import connection, settings
from langflow_sandbox_createos.executor import CreateOSExecutor, pool
from langflow_sandbox_createos.executor.results import GuestStatus
from langflow_sandbox_createos.local.testing import NamespaceHost

from .conftest import EXECUTOR_ROOTFS, chat_graph, drain, middle_graph
from .flow_components.counter import Counter
from .flow_components.model_probe import ModelProbe
from .flow_components.sleeper import Sleeper

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]

FILL_SECONDS = 240.0  # lfx's import on a loaded 2-core machine


@pytest.fixture
def pooled(executor_env: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("CREATEOS_EXECUTOR_WARM_POOL", "1")
    yield executor_env
    pool.shutdown()


def fill() -> list[str]:
    """Register this configuration's pool without a run and wait until it is full."""
    endpoint = connection.endpoints.get()
    cfg = settings.executor_settings()
    run, _ = pool.take(endpoint, cfg, {})
    assert run is None  # nothing was warm yet
    warm = pool.pool()
    assert warm.wait_full(FILL_SECONDS), warm.stats()
    return warm.ready_ids()


def status(items: list[Any]) -> GuestStatus:
    found = [i.payload for i in items if isinstance(i, StepResult) and isinstance(i.payload, GuestStatus)]
    assert len(found) == 1
    return found[0]


def text(items: list[Any]) -> str:
    assert isinstance(items[-1], RunComplete)
    return items[-1].outputs[0].outputs[0].results["message"].text


def unit(graph: Any, value: str) -> Unit:
    return Unit(graph=graph, runtime_options={"initial_inputs": InputValueRequest(input_value=value)})


def view(cp: Any, sandbox_id: str) -> dict[str, Any]:
    answer = httpx.get(f"{cp.url}/v1/sandboxes/{sandbox_id}", headers={"X-Api-Key": cp.api_key}, timeout=10)
    return answer.json()["data"]


def api(cp: Any, method: str, path: str) -> int:
    return httpx.request(method, f"{cp.url}{path}", headers={"X-Api-Key": cp.api_key}, timeout=10).status_code


@pytest.fixture
def counter() -> Iterator[tuple[str, list[str]]]:
    """A server outside every guest that counts the Counter component's runs: in this process,
    listening in a test host's network namespace, which guests reach through their egress."""
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            hits.append(self.path)
            body = str(len(hits)).encode()
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    with NamespaceHost() as host:
        server = http.server.ThreadingHTTPServer((host.address, 0), Handler, bind_and_activate=False)
        server.socket.close()
        server.socket = host.listen_socket()
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        yield f"http://{host.address}:{server.socket.getsockname()[1]}/count", hits
        server.shutdown()
        server.server_close()


def kill_guest_processes(sandbox_id: str) -> int:
    """SIGKILL every host process of one createos-local guest (found by its environment)."""
    marker = f"CREATEOS_SANDBOX_ID={sandbox_id}".encode()
    killed = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0"):
            try:
                os.kill(int(entry.name), signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
    return killed


async def test_each_run_gets_its_own_pooled_guest(pooled: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    executor = CreateOSExecutor()
    first_pool = set(fill())
    assert len(first_pool) == 1
    name = view(pooled, next(iter(first_pool)))["name"]
    assert name.startswith(pool.NAME_PREFIX) and len(name) == 22

    used = []
    for value in ("one", "two"):
        items = await drain(executor.execute(unit(chat_graph(), value)))
        assert text(items) == value
        guest = status(items)
        assert guest.pooled and guest.lfx_version
        used.append(guest.sandbox_id)
        assert pool.pool().wait_full(FILL_SECONDS)
    assert used[0] in first_pool
    assert used[0] != used[1]  # one guest per run, never reused
    for sandbox_id in used:  # deleted just after its run, off the run's path
        deadline = time.monotonic() + 10
        while view(pooled, sandbox_id)["status"] not in ("destroying", "destroyed"):
            assert time.monotonic() < deadline, view(pooled, sandbox_id)
            time.sleep(0.02)
    assert len(set(used) & first_pool) == 1


async def test_a_pooled_run_logs_its_timeline_at_debug(pooled: Any, caplog: pytest.LogCaptureFixture) -> None:
    fill()
    logger = "langflow_sandbox_createos.executor.timeline"
    with caplog.at_level(logging.INFO, logger=logger):  # off: nothing noted, nothing logged
        assert text(await drain(CreateOSExecutor().execute(unit(chat_graph(), "quiet")))) == "quiet"
    assert not [r for r in caplog.records if r.name == logger]
    assert pool.pool().wait_full(FILL_SECONDS)
    with caplog.at_level(logging.DEBUG, logger=logger):
        items = await drain(CreateOSExecutor().execute(unit(chat_graph(), "timed")))
        assert text(items) == "timed"
        deadline = time.monotonic() + 10
        while not any(getattr(r, "timeline", {}).get("what") == "deleted" for r in caplog.records):
            assert time.monotonic() < deadline, caplog.records
            await asyncio.sleep(0.01)
    # two lines: the run's own when it ends, and the delete thread's when the delete returned,
    # in either order (under load the delete can return before the run has logged)
    records = [r.timeline for r in caplog.records if r.name == logger]
    assert sorted(r["what"] for r in records) == ["deleted", "ok"], records
    record = next(r for r in records if r["what"] == "ok")
    assert record["sandbox_id"] == status(items).sandbox_id
    names = [name for name, _ in record["marks"]]
    steps = ["spec", "line", "take", "delivered", "accepted", "graph", "outputs", "done", "complete"]
    assert [n for n in names if n in steps] == steps, names
    times = [at for _, at in record["marks"]]
    assert times == sorted(times)
    assert list(record["guest"])[:2] == ["spec", "accepted"]
    assert {"seams", "build", "run", "outputs"} <= set(record["guest"]), record["guest"]
    assert all(isinstance(v, float) and v >= 0 for v in record["guest"].values())


async def test_a_pooled_runner_completes_lfx_models_while_it_waits(pooled: Any) -> None:
    """pydantic completes a model left incomplete at import on its first use (lfx's content
    blocks: ~0.1-0.3 s of a run's first message); a waiting runner has done it already."""
    from lfx.components.input_output import ChatOutput
    from lfx.graph import Graph

    fill()
    probe = ModelProbe(_id="probe")
    chat_out = ChatOutput(_id="chat-out")
    chat_out.set(input_value=probe.probe)
    items = await drain(CreateOSExecutor().execute(unit(Graph(probe, chat_out), "x")))
    assert status(items).pooled
    assert json.loads(text(items)) == []


async def test_a_pooled_runs_deadline_counts_from_its_spec(
    pooled: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watchdog's thread starts at warm-up, its deadline when the spec arrived: a guest
    that waited in the pool longer than the run's timeout still runs, and a run that takes
    longer than it times out. The timeout is 10 s, so the quick run has 10 s (it takes well
    under one) and the guest's wait (at least 11 s) is over it whatever the load: only a
    deadline counted from the warm-up fails the first run. The second run's nap (120 s) is
    what the timeout cuts short, no earlier than 10 s after the run began (was: a 4 s timeout,
    which a loaded machine's pooled run could outlast)."""
    timeout = 10
    monkeypatch.setenv("CREATEOS_EXECUTOR_TIMEOUT_SECONDS", str(timeout))
    fill()
    await asyncio.sleep(timeout + 1)  # at least this long in the pool: a lower bound, not a verdict
    items = await drain(CreateOSExecutor().execute(unit(chat_graph(), "in time")))
    assert text(items) == "in time" and status(items).pooled
    assert pool.pool().wait_full(FILL_SECONDS)
    started = time.monotonic()
    with pytest.raises(SandboxExecutionError, match="timed out"):
        await drain(CreateOSExecutor().execute(unit(middle_graph(Sleeper, "nap"), "x")))
    assert time.monotonic() - started >= timeout


@pytest.mark.parametrize("how", ["killed", "paused", "deleted"])
async def test_a_stale_pooled_guest_falls_back_without_a_double_run(
    pooled: Any, counter: tuple[str, list[str]], how: str
) -> None:
    url, hits = counter
    (stale,) = fill()
    stale_before = pool.pool().stats()["stale"]
    if how == "killed":
        assert kill_guest_processes(stale) >= 1
    elif how == "paused":
        assert api(pooled, "POST", f"/v1/sandboxes/{stale}/pause") == 200
    else:
        assert api(pooled, "DELETE", f"/v1/sandboxes/{stale}") == 200

    items = await drain(CreateOSExecutor().execute(unit(middle_graph(Counter, "count", url=url), "x")))
    assert text(items) == "x#1"
    guest = status(items)
    assert not guest.pooled and guest.sandbox_id != stale  # a fresh guest ran it
    assert len(hits) == 1  # ...and only it
    assert pool.pool().stats()["stale"] == stale_before + 1
    pool.shutdown()
    assert view(pooled, stale)["status"] in ("destroying", "destroyed")


def test_shutdown_deletes_pooled_guests(pooled: Any) -> None:
    ids = fill()
    CreateOSExecutor.shutdown()
    assert pool.pool().ready_ids() == []
    for sandbox_id in ids:
        assert view(pooled, sandbox_id)["status"] in ("destroying", "destroyed")


CHILD = textwrap.dedent(
    """
    import json, os, sys
    from langflow_sandbox_createos.executor import pool
    from langflow_sandbox_createos.core import connection, settings
    pool.take(connection.endpoints.get(), settings.executor_settings(), {})
    assert pool.pool().wait_full(240), pool.pool().stats()
    print(json.dumps(pool.pool().ready_ids()), flush=True)
    if sys.argv[1] == "lost":  # the keeper dies too (a lost machine): the guests stay behind
        import signal
        from langflow_sandbox_createos.core import pool_keeper
        for keeper in pool_keeper.keepers._by_endpoint.values():
            os.kill(keeper.pid, signal.SIGKILL)
            os.waitpid(keeper.pid, 0)
    if sys.argv[1] in ("crash", "lost"):
        os._exit(1)  # no atexit, as gunicorn's workers end: the pool keeper deletes the guests
    """
)


@pytest.mark.parametrize("ending", ["exit", "crash", "lost"])
def test_interpreter_exit_deletes_and_reap_finds_a_crash(
    executor_env: Any, ending: str, capsys: pytest.CaptureFixture[str]
) -> None:
    env = dict(os.environ, CREATEOS_EXECUTOR_WARM_POOL="1", CREATEOS_EXECUTOR_ROOTFS=EXECUTOR_ROOTFS)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, ending], env=env, capture_output=True, text=True, timeout=280
    )
    assert done.returncode == (0 if ending == "exit" else 1), done.stderr
    ids = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(ids) == 1
    if ending == "exit":
        assert view(executor_env, ids[0])["status"] in ("destroying", "destroyed")
        return
    if ending == "crash":  # os._exit: the process's pool keeper deletes what it pooled
        deadline = time.monotonic() + 30
        while view(executor_env, ids[0])["status"] not in ("destroying", "destroyed"):
            assert time.monotonic() < deadline, view(executor_env, ids[0])
            time.sleep(0.2)
        return
    assert view(executor_env, ids[0])["status"] == "running"
    # The default reap leaves pools alone (a running Langflow's); a crash's are reaped by prefix.
    assert cli.main(["reap", "--json", "--include-active"]) == 0
    listed = {row["id"] for row in json.loads(capsys.readouterr().out)["guests"]}
    assert ids[0] not in listed
    warm = ["--prefix", pool.NAME_PREFIX, "--include-active"]
    assert cli.main(["reap", "--json", *warm]) == 0
    listed = {row["id"]: row["name"] for row in json.loads(capsys.readouterr().out)["guests"]}
    assert ids[0] in listed and listed[ids[0]].startswith(pool.NAME_PREFIX)
    assert cli.main(["reap", "--yes", "--json", *warm]) == 0
    assert view(executor_env, ids[0])["status"] in ("destroying", "destroyed")


def test_a_pooled_guest_that_never_accepts_fails_the_run_on_python_3_10(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """asyncio.wait_for raises asyncio.TimeoutError, which on Python 3.10 is not the builtin
    TimeoutError (simulated here with a class of its own): the run still fails with the
    executor's message, and the guest is closed."""
    import types

    from langflow_sandbox_createos.executor import engine as executor_module
    from langflow_sandbox_createos.executor.timeline import Timeline

    class AsyncioTimeout(Exception):  # what asyncio.TimeoutError is on 3.10
        pass

    closed: list[bool] = []

    class NeverAccepts:
        sandbox_id = "sb-never"
        queue: asyncio.Queue[Any]

        def attach(self) -> list[Any]:
            self.queue = asyncio.Queue()
            return [("frame", {"t": "waiting"})]

        async def deliver(self, spec: Any) -> bool:
            return True

        async def close(self) -> None:
            closed.append(True)

    async def never(awaitable: Any, timeout: float) -> Any:
        awaitable.close()
        raise AsyncioTimeout

    monkeypatch.setattr(pool, "take", lambda *args: (NeverAccepts(), None))
    monkeypatch.setattr(executor_module.asyncio, "TimeoutError", AsyncioTimeout)
    monkeypatch.setattr(executor_module.asyncio, "wait_for", never)
    cfg = types.SimpleNamespace(env_allowlist=())
    with pytest.raises(SandboxExecutionError, match="did not pick up the run"):
        asyncio.run(executor_module._take_warm(None, cfg, {}, Timeline()))  # type: ignore[arg-type]
    assert closed == [True]


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("CREATEOS_EXECUTOR_WARM_POOL", "-1", "below the minimum of 0"),
        ("CREATEOS_EXECUTOR_WARM_POOL", "17", "above the maximum of 16"),
        ("CREATEOS_EXECUTOR_WARM_POOL", "two", "not a whole number"),
        ("CREATEOS_EXECUTOR_WARM_POOL_IDLE_SECONDS", "5", "below the minimum of 30"),
    ],
)
def test_pool_settings_are_validated(name: str, value: str, says: str) -> None:
    with pytest.raises(settings.SettingsError, match=f"{name}.*{says}"):
        settings.executor_settings({name: value})
    assert settings.executor_settings({}).warm_pool == 0  # off by default
