"""The warm pool's behaviour (not its speed): one execution per guest, refill, deletion at
shutdown and exit, fork children, stale guests, and configuration keys."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from keeper_child import run_child

from langflow_sandbox_createos.backend.engine import CreateOSBackend
from langflow_sandbox_createos.core import warm_pool

from .conftest import sandbox_view, undeleted_guests

WHO = "import os\nprint(os.environ['CREATEOS_SANDBOX_ID'])\n"
FILL_SECONDS = 20.0


@pytest.fixture
def pooled(backend: CreateOSBackend, monkeypatch: pytest.MonkeyPatch) -> CreateOSBackend:
    monkeypatch.setenv("CREATEOS_SANDBOX_WARM_POOL", "2")
    return backend


def warm(backend: CreateOSBackend, code: str = "print('warm-up')", **kwargs: Any) -> None:
    """Create the pool for the current configuration (the first run goes cold) and fill it."""
    assert backend.run(code, **kwargs).exit_code == 0
    assert backend._pool.wait_full(FILL_SECONDS), backend._pool.stats()


def ready(backend: CreateOSBackend) -> set[str]:
    return set(backend._pool.ready_ids())


def run_id(backend: CreateOSBackend, **kwargs: Any) -> str:
    result = backend.run(WHO, **kwargs)
    assert result.exit_code == 0, result.stderr
    return result.stdout.strip()


def api(cp: Any, method: str, path: str) -> httpx.Response:
    return httpx.request(method, f"{cp.url}{path}", headers={"X-Api-Key": cp.api_key}, timeout=10)


def test_pool_is_off_by_default(backend: CreateOSBackend, backend_env: Any) -> None:
    assert backend.run("print(1)").stdout == "1\n"
    assert backend._pool.stats()["pools"] == 0
    assert not [sb for sb in backend_env.live_sandboxes() if sb["name"].startswith(warm_pool.NAME_PREFIX)]


def test_each_pool_guest_runs_once_and_is_deleted(pooled: CreateOSBackend, backend_env: Any) -> None:
    warm(pooled)
    pooled_ids = ready(pooled)
    assert len(pooled_ids) == 2
    for sid in pooled_ids:
        view = sandbox_view(backend_env, sid)
        assert view["name"].startswith(warm_pool.NAME_PREFIX) and len(view["name"]) == 22
        assert view["auto_pause_after_seconds"] >= 60  # the backstop

    used = [run_id(pooled) for _ in range(2)]
    assert set(used) == pooled_ids  # served from the pool...
    assert len(set(used)) == 2  # ...one execution per guest
    assert pooled._pool.stats()["taken"] == 2
    pooled._drain_all()  # the background deletes of both
    for sid in used:
        assert sandbox_view(backend_env, sid)["status"] in ("destroying", "destroyed")


def test_pool_is_refilled_in_the_background(pooled: CreateOSBackend) -> None:
    warm(pooled)
    seen: list[str] = []
    for _ in range(3):
        assert pooled._pool.wait_full(FILL_SECONDS)
        before = ready(pooled)
        sid = run_id(pooled)
        assert sid in before
        seen.append(sid)
    assert pooled._pool.wait_full(FILL_SECONDS)
    assert len(ready(pooled)) == 2
    assert not ready(pooled) & set(seen)  # a used guest never comes back
    assert len(set(seen)) == 3
    assert pooled._pool.stats()["created"] >= 5


def test_shutdown_deletes_the_pool(pooled: CreateOSBackend, backend_env: Any) -> None:
    warm(pooled)
    ids = ready(pooled)
    assert len(ids) == 2
    pooled.shutdown()
    assert ready(pooled) == set()
    assert undeleted_guests(backend_env) == []
    for sid in ids:
        assert sandbox_view(backend_env, sid)["status"] in ("destroying", "destroyed")
    # Still usable afterwards: the next run starts a new pool.
    assert pooled.run("print(2)").stdout == "2\n"


def test_process_exit_deletes_the_pool(backend_env: Any) -> None:
    script = textwrap.dedent(
        """
        import json, os
        from langflow_sandbox_createos.backend.engine import create_backend
        backend = create_backend()
        backend.run("print(1)")
        assert backend._pool.wait_full(20)
        print(json.dumps(sorted(backend._pool.ready_ids())))
        # no shutdown(): the atexit hook must delete the pool
        """
    )
    env = dict(os.environ, CREATEOS_SANDBOX_WARM_POOL="3")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    ids = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(ids) == 3
    for sid in ids:
        assert sandbox_view(backend_env, sid)["status"] in ("destroying", "destroyed")


@pytest.mark.parametrize("how", ["SIGKILL", "SIGQUIT", "os._exit"])
def test_a_process_that_dies_without_shutdown_leaves_no_pooled_guest(backend_env: Any, how: str) -> None:
    """Issue 30: gunicorn's workers end through os._exit (no atexit) or die of SIGQUIT at a quick
    shutdown; every pooled guest survived on the control plane. The keeper deletes them."""
    script = """
    from langflow_sandbox_createos.core import connection, pool_keeper
    from langflow_sandbox_createos.backend.engine import create_backend
    backend = create_backend()
    backend.run("print(1)")
    assert backend._pool.wait_full(20)
    # the cold first run's guest is the run's, deleted in the background: let that finish
    connection.endpoints.get().client.drain_deletes(10.0)
    assert len(pool_keeper.keepers._by_endpoint) == 1
    report(ids=sorted(backend._pool.ready_ids()))
    die(HOW)
    """
    env = dict(os.environ, CREATEOS_SANDBOX_WARM_POOL="2")
    report, stderr = run_child(script, how, env, timeout=60)
    assert len(report["ids"]) == 2, stderr
    deadline = time.monotonic() + 30
    while any(
        sandbox_view(backend_env, sid)["status"] not in ("destroying", "destroyed") for sid in report["ids"]
    ):
        assert time.monotonic() < deadline, [sandbox_view(backend_env, sid) for sid in report["ids"]]
        time.sleep(0.2)
    while _alive(report["keeper"]):  # and then it exits
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_a_clean_exit_leaves_the_keeper_nothing_to_do(backend_env: Any) -> None:
    """shutdown() deletes the pool itself; the keeper sees its owner end holding nothing."""
    script = textwrap.dedent(
        """
        import json
        from langflow_sandbox_createos.core import pool_keeper
        from langflow_sandbox_createos.backend.engine import create_backend
        backend = create_backend()
        backend.run("print(1)")
        assert backend._pool.wait_full(20)
        [keeper] = pool_keeper.keepers._by_endpoint.values()
        ids = sorted(backend._pool.ready_ids())
        backend.shutdown()
        print(json.dumps({"ids": ids, "keeper": keeper.pid}), flush=True)
        """
    )
    env = dict(os.environ, CREATEOS_SANDBOX_WARM_POOL="2")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    deadline = time.monotonic() + 30
    while _alive(report["keeper"]):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert "ended without deleting" not in out.stderr, out.stderr
    for sid in report["ids"]:
        assert sandbox_view(backend_env, sid)["status"] in ("destroying", "destroyed")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (not yet reaped by init) has exited
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX fork")
def test_fork_child_does_not_inherit_the_pool(pooled: CreateOSBackend, backend_env: Any) -> None:
    warm(pooled)
    parent_ids = ready(pooled)
    assert len(parent_ids) == 2
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what it sees, run once, shut down, never touch the parent's
        code = 1
        try:
            inherited = pooled._pool.ready_ids()
            used = run_id(pooled)
            pooled.shutdown()
            os.write(write_fd, json.dumps({"inherited": inherited, "used": used}).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(read_fd) as pipe:
        report = json.loads(pipe.read() or "{}")
    assert os.waitstatus_to_exitcode(status) == 0, report
    assert report["inherited"] == []
    assert report["used"] not in parent_ids
    # The parent's guests are untouched and still serve the parent.
    for sid in parent_ids:
        assert sandbox_view(backend_env, sid)["status"] == "running"
    assert ready(pooled) == parent_ids
    assert run_id(pooled) in parent_ids


@pytest.mark.parametrize("how", ["paused", "deleted"])
def test_a_stale_pool_guest_is_discarded(pooled: CreateOSBackend, backend_env: Any, how: str) -> None:
    warm(pooled)
    ids = ready(pooled)
    for sid in ids:  # behind the pool's back
        if how == "paused":
            assert api(backend_env, "POST", f"/v1/sandboxes/{sid}/pause").status_code == 200
        else:
            assert api(backend_env, "DELETE", f"/v1/sandboxes/{sid}").status_code == 200
    used = run_id(pooled)
    assert used not in ids  # ran on a fresh guest, once
    assert pooled._pool.stats()["stale"] == 1
    taken = ids - ready(pooled)
    assert len(taken) == 1
    pooled._drain_all()  # the stale guest's delete was queued like any other
    for sid in taken:
        assert sandbox_view(backend_env, sid)["status"] in ("destroying", "destroyed")


def test_an_expired_pool_guest_is_not_handed_out(
    pooled: CreateOSBackend, backend_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A guest at the end of its auto-pause window is discarded locally, without a request."""
    warm(pooled)
    ids = ready(pooled)
    with pooled._pool._cond:
        for pool in pooled._pool._pools.values():
            for guest in pool.ready:
                guest.expires = 0.0
    used = run_id(pooled)
    assert used not in ids
    stats = pooled._pool.stats()
    assert stats["expired"] == 2 and stats["stale"] == 0
    assert pooled._pool.wait_full(FILL_SECONDS)
    pooled.shutdown()
    for sid in ids:
        assert sandbox_view(backend_env, sid)["status"] in ("destroying", "destroyed")


def test_configuration_change_never_hands_out_the_wrong_policy(
    pooled: CreateOSBackend, backend_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    warm(pooled)  # network off
    closed = ready(pooled)
    for sid in closed:
        assert sandbox_view(backend_env, sid)["egress"] == ["240.0.0.0/4"]

    monkeypatch.setenv("LANGFLOW_SANDBOX_ALLOW_NETWORK", "true")
    first_open = run_id(pooled)
    assert first_open not in closed
    assert sandbox_view(backend_env, first_open)["egress"] == ["*"]
    assert pooled._pool.wait_full(FILL_SECONDS)
    open_ids = ready(pooled) - closed
    second_open = run_id(pooled)
    assert second_open in open_ids
    assert sandbox_view(backend_env, second_open)["egress"] == ["*"]

    monkeypatch.setenv("LANGFLOW_SANDBOX_ALLOW_NETWORK", "false")
    back = run_id(pooled)
    assert back in closed
    assert sandbox_view(backend_env, back)["egress"] == ["240.0.0.0/4"]

    # A pinned shape and a rootfs are part of the key too.
    monkeypatch.setenv("CREATEOS_SANDBOX_SHAPE", "s-4vcpu-8gb")
    other_shape = run_id(pooled)
    assert other_shape not in closed | open_ids
    assert sandbox_view(backend_env, other_shape)["shape"] == "s-4vcpu-8gb"


def test_env_keys_select_the_pool_and_values_arrive_at_exec(
    pooled: CreateOSBackend, backend_env: Any
) -> None:
    warm(pooled)
    plain = ready(pooled)
    code = "import os\nprint(os.environ['CREATEOS_SANDBOX_ID'], os.environ['LF_TOKEN'])\n"

    first = pooled.run(code, env={"LF_TOKEN": "one"}).stdout.split()
    assert first[0] not in plain and first[1] == "one"  # different declared keys: not the plain pool
    assert pooled._pool.wait_full(FILL_SECONDS)
    keyed = ready(pooled) - plain
    assert len(keyed) == 2
    for sid in keyed:  # the key is declared at create; its value travels with the exec
        assert sandbox_view(backend_env, sid)["envs"] == ["LF_TOKEN"]
    for sid in plain:
        assert sandbox_view(backend_env, sid)["envs"] == []

    second = pooled.run(code, env={"LF_TOKEN": "two"}).stdout.split()
    assert second[0] in keyed and second[1] == "two"
    assert run_id(pooled) in plain  # no env: the plain pool, whose guests lack LF_TOKEN
