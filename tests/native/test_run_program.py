"""run_program: a whole throwaway execution in C, with the delete attempted on every path."""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time

import pytest

from langflow_sandbox_createos import _createos
from langflow_sandbox_createos.local.testing import LocalControlPlane

from .conftest import SHAPE, route_count

SPEC = {"shape": SHAPE}


def state_of(cp: LocalControlPlane, sandbox_id: str) -> str:
    return next(sb["status"] for sb in cp.sandboxes() if sb["id"] == sandbox_id)


def test_success_deletes_the_guest(client: _createos.Client, cp: LocalControlPlane) -> None:
    seen: list[str] = []
    r = client.run_program(
        SPEC,
        "python3",
        ["/workspace/main.py"],
        files=[
            ("/workspace/main.py", b"import data\nprint(data.X * 2)\n"),
            ("/workspace/data.py", b"X = 21\n"),
        ],
        timeout=30,
        on_output=lambda s, t: seen.append(t),
    )
    assert (r.stdout, r.exit_code, r.streamed) == ("42\n", 0, True)
    assert seen == ["42\n"]
    assert r.sandbox_id and state_of(cp, r.sandbox_id) in ("destroying", "destroyed")


def test_failing_program_still_deletes(client: _createos.Client, cp: LocalControlPlane) -> None:
    r = client.run_program(SPEC, "bash", ["-c", "echo bad >&2; exit 7"], timeout=30)
    assert r.exit_code == 7 and r.stderr == "bad\n"
    assert state_of(cp, r.sandbox_id) in ("destroying", "destroyed")


def test_exec_failure_deletes_and_names_the_guest(client: _createos.Client, cp: LocalControlPlane) -> None:
    cp.set_faults({"rules": [{"route": "exec_stream", "status": 500, "times": 1}]})
    with pytest.raises(_createos.TransientError) as info:
        client.run_program(SPEC, "echo", ["x"], timeout=30)
    sid = info.value.sandbox_id
    assert sid and sid.startswith("sb-") and info.value.status == 500
    assert state_of(cp, sid) in ("destroying", "destroyed")


def test_upload_failure_deletes(client: _createos.Client, cp: LocalControlPlane) -> None:
    cp.set_faults({"rules": [{"route": "files_put", "status": 503, "times": 1}]})
    with pytest.raises(_createos.TransientError) as info:
        client.run_program(SPEC, "echo", files=[("/workspace/a", b"a")], timeout=30)
    assert state_of(cp, info.value.sandbox_id) in ("destroying", "destroyed")


def test_create_failure_has_no_guest(client: _createos.Client, cp: LocalControlPlane) -> None:
    cp.set_faults({"rules": [{"route": "create", "status": 402, "times": 1}]})
    before = cp.stats()["requests"].get("delete", 0)
    with pytest.raises(_createos.UnavailableError) as info:
        client.run_program(SPEC, "echo", timeout=30)
    assert info.value.status == 402 and info.value.sandbox_id is None
    assert cp.stats()["requests"].get("delete", 0) == before


def test_deadline_deletes_and_keeps_partial_output(client: _createos.Client, cp: LocalControlPlane) -> None:
    t0 = time.monotonic()
    r = client.run_program(SPEC, "bash", ["-c", "echo started; sleep 60"], timeout=1.5)
    assert time.monotonic() - t0 < 5
    assert r.timed_out and r.stdout == "started\n" and r.exit_code == -1
    assert state_of(cp, r.sandbox_id) in ("destroying", "destroyed")


def test_deadline_before_stream_raises_and_deletes(client: _createos.Client, cp: LocalControlPlane) -> None:
    cp.set_faults({"rules": [{"route": "exec_stream", "hang": True, "times": 1}]})
    with pytest.raises(_createos.DeadlineError) as info:
        client.run_program(SPEC, "echo", timeout=1.0)
    assert state_of(cp, info.value.sandbox_id) in ("destroying", "destroyed")


def test_failed_delete_is_retried_in_the_background(client: _createos.Client, cp: LocalControlPlane) -> None:
    cp.set_faults({"rules": [{"route": "delete", "status": 503, "times": 1}]})
    r = client.run_program(SPEC, "echo", ["ok"], timeout=30)
    assert r.stdout == "ok\n"
    outcomes = client.drain_deletes(timeout=10)
    assert (r.sandbox_id, 200, None) in outcomes
    assert state_of(cp, r.sandbox_id) in ("destroying", "destroyed")


@pytest.mark.parametrize(
    ("delete", "status", "requests"),
    [("wait", 503, 2), ("wait", 403, 2), ("background", 503, 2), ("background", 403, 1)],
)
def test_a_failed_delete_is_retried_once_at_most(
    client: _createos.Client, cp: LocalControlPlane, delete: str, status: int, requests: int
) -> None:
    """One retry, never more (docs/native-client.md): a transient failure of a background delete
    is retried once; a failed synchronous delete is handed to the background, and that is its
    retry (it was retried twice on 828da60: three DELETEs for a persistent 503)."""
    cp.set_faults({"rules": [{"route": "delete", "status": status}]})
    before = route_count(cp, "delete")
    r = client.run_program(SPEC, "echo", timeout=30, delete=delete)
    ((sid, got, error),) = client.drain_deletes(timeout=10)
    time.sleep(0.5)  # a further retry, if one were made, would be on the wire by now
    assert sid == r.sandbox_id and got == status and f"HTTP {status}" in error
    assert route_count(cp, "delete") - before == requests
    cp.clear_faults()
    client.delete(sid)


def test_background_delete_and_drain(client: _createos.Client, cp: LocalControlPlane) -> None:
    cp.set_faults({"rules": [{"route": "delete", "latency_ms": 300}]})
    ids = []
    for _ in range(3):
        t0 = time.monotonic()
        r = client.run_program(SPEC, "echo", ["bg"], timeout=30, delete="background")
        assert time.monotonic() - t0 < 0.3 + 0.25 * 3  # did not wait for the slow delete
        ids.append(r.sandbox_id)
    assert client.pending_deletes() >= 1
    assert client.stats()["deletes_queued"] == 3
    outcomes = client.drain_deletes(timeout=10)
    assert sorted(o[0] for o in outcomes) == sorted(ids)
    assert all(status == 200 and error is None for _, status, error in outcomes)
    assert client.pending_deletes() == 0 and client.drain_deletes() == []
    assert all(state_of(cp, i) in ("destroying", "destroyed") for i in ids)


def test_background_delete_failure_is_reported(client: _createos.Client, cp: LocalControlPlane) -> None:
    cp.set_faults({"rules": [{"route": "delete", "status": 403}]})
    r = client.run_program(SPEC, "echo", timeout=30, delete="background")
    ((sid, status, error),) = client.drain_deletes(timeout=10)
    assert sid == r.sandbox_id and status == 403 and "delete failed: HTTP 403" in error
    cp.clear_faults()
    client.delete(sid)


def test_adopted_guest_is_used_and_deleted(client: _createos.Client, cp: LocalControlPlane) -> None:
    view = client.create(SPEC)
    r = client.run_program({}, "hostname", timeout=30, sandbox_id=view["id"])
    assert r.sandbox_id == view["id"] and r.exit_code == 0
    assert cp.stats()["requests"]["create"] >= 1
    assert state_of(cp, view["id"]) in ("destroying", "destroyed")


def test_close_waits_for_background_deletes(cp: LocalControlPlane) -> None:
    c = _createos.Client(cp.url, cp.api_key)
    cp.set_faults({"rules": [{"route": "delete", "latency_ms": 500}]})
    r = c.run_program(SPEC, "true", timeout=30, delete="background")
    c.close()
    assert state_of(cp, r.sandbox_id) in ("destroying", "destroyed")


# 640 executions (64 x 10) in make test; 64 x 20 took 60-80 s there. With 10 each, every
# thread still overlaps every other for the whole run.
# make sanitize runs 64 x 5 (STRESS_PER_THREAD=5): there the control plane runs under the ASan
# preload too, and 64 x 20 took ~6 min (358 s at load average 10); 320 executions from 64
# threads still cross every concurrent path.
@pytest.mark.timeout(900)
def test_64_threads_10_executions_each(cp: LocalControlPlane) -> None:
    """64 threads share one Client; each completes 10 full run_program executions."""
    client = _createos.Client(cp.url, cp.api_key, control_timeout=120)
    threads, per_thread = 64, int(os.environ.get("STRESS_PER_THREAD", "10"))
    errors: list[BaseException] = []
    outputs: list[str] = []
    lock = threading.Lock()
    before = cp.stats()

    def worker(n: int) -> None:
        for i in range(per_thread):
            try:
                r = client.run_program(SPEC, "echo", [f"{n}-{i}"], timeout=120)
                with lock:
                    outputs.append(r.stdout)
            except BaseException as exc:
                with lock:
                    errors.append(exc)

    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(worker, range(threads)))
    elapsed = time.monotonic() - t0
    after = cp.stats()
    requests = sum(after["requests"].values()) - sum(before["requests"].values())
    connections = after["connections_opened"] - before["connections_opened"]
    stats = client.stats()
    print(
        f"\n{threads}x{per_thread} run_program: {elapsed:.1f} s, {threads * per_thread / elapsed:.1f} executions/s, "
        f"server saw {requests} requests on {connections} new connections; client stats {stats}"
    )
    assert errors == []
    assert sorted(outputs) == sorted(f"{n}-{i}\n" for n in range(threads) for i in range(per_thread))
    assert stats["requests"] == threads * per_thread * 3  # create, exec stream, delete
    assert connections <= 2 * threads and connections * 10 < requests
    client.close()


def test_env_reaches_the_exec(client: _createos.Client, cp: LocalControlPlane) -> None:
    r = client.run_program(
        {"shape": SHAPE, "envs": {"K": "declared"}}, "printenv", ["K"], env={"K": "override"}, timeout=30
    )
    assert r.stdout == "override\n"
    assert state_of(cp, r.sandbox_id) in ("destroying", "destroyed")
