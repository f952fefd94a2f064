"""One execution end to end on createos-local: output, env, exit codes, caps, timing, deletes."""

from __future__ import annotations

import concurrent.futures
import logging
import os
import time
from typing import Any

import pytest
from lfx.utils.sandbox.base import SandboxExecutionError, SandboxResult, SandboxUnavailableError

from langflow_sandbox_createos.backend import engine as backend_module
from langflow_sandbox_createos.backend.engine import CreateOSBackend
from langflow_sandbox_createos.core import budget, lease, pool_keeper

from .conftest import sandbox_ids, undeleted_guests

PRINT_GUEST = (
    "import os\nprint(os.environ['CREATEOS_SANDBOX_ID'])\nprint(os.environ['CREATEOS_SANDBOX_NAME'])\n"
)


def test_runs_on_a_fresh_guest_and_deletes_it(backend: CreateOSBackend, backend_env: Any) -> None:
    before = sandbox_ids(backend_env)
    result = backend.run(PRINT_GUEST)
    assert isinstance(result, SandboxResult)
    assert result.exit_code == 0, result.stderr
    guest_id, guest_name = result.stdout.split()
    assert guest_id in sandbox_ids(backend_env) - before
    assert guest_name.startswith("lf-") and len(guest_name) == 22
    backend.shutdown()  # waits for the background delete
    assert undeleted_guests(backend_env) == []


def test_each_run_gets_its_own_guest(backend: CreateOSBackend) -> None:
    first = backend.run(PRINT_GUEST).stdout.split()[0]
    second = backend.run(PRINT_GUEST).stdout.split()[0]
    assert first != second


def test_code_runs_as_a_file_under_workspace(backend: CreateOSBackend) -> None:
    result = backend.run("import os, sys\nprint(os.path.abspath(__file__))\nprint(sys.argv[0])\n")
    path, argv0 = result.stdout.split()
    assert path.startswith("/workspace/main_") and path.endswith(".py")
    assert argv0 == path


def test_session_keyword_is_accepted_and_ignored(backend: CreateOSBackend) -> None:
    assert backend.run("print(1)", env=None, session=object()).stdout == "1\n"


def test_env_reaches_the_guest(backend: CreateOSBackend) -> None:
    code = "import os\nprint(os.environ['LF_TOKEN'], os.environ['LF_OTHER'])\n"
    result = backend.run(code, env={"LF_TOKEN": "s3cret value", "LF_OTHER": "two"})
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "s3cret value two\n"


def test_user_code_failure_is_a_result_not_an_exception(backend: CreateOSBackend) -> None:
    result = backend.run("print('partial')\nraise NameError('nope')\n")
    assert result.exit_code == 1
    assert result.stdout == "partial\n"
    assert "NameError: nope" in result.stderr
    assert "NameError" in result.error_message()


def test_guest_timeout_keeps_partial_output_and_reports_minus_one(
    backend: CreateOSBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LANGFLOW_SANDBOX_TIMEOUT_SECONDS", "2")
    started = time.monotonic()
    result = backend.run("import time\nprint('before the deadline')\ntime.sleep(60)\nprint('never')\n")
    assert time.monotonic() - started < 20
    assert result.exit_code == -1
    assert result.stdout == "before the deadline\n"
    assert "timed out" in result.error_message()


def test_client_deadline_keeps_streamed_output(
    backend: CreateOSBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The guest clock (20 s) is set past the host's deadline (20 - 18 = 2 s), so the host
    # gives up first: the output streamed before then is kept, and the run reports -1.
    monkeypatch.setenv("LANGFLOW_SANDBOX_TIMEOUT_SECONDS", "20")
    monkeypatch.setattr(budget, "BACKEND_GRACE_SECONDS", -18.0)
    started = time.monotonic()
    result = backend.run("import sys, time\nprint('streamed', flush=True)\ntime.sleep(60)\n")
    assert time.monotonic() - started < 15
    assert result.exit_code == -1
    assert result.stdout == "streamed\n"
    assert "[createos: no exit status within" in result.stderr


def test_sigkill_is_137_not_a_timeout(backend: CreateOSBackend) -> None:
    result = backend.run("import os\nprint('dying', flush=True)\nos.kill(os.getpid(), 9)\n")
    assert result.exit_code == 137
    assert result.stdout == "dying\n"
    assert "exit code 137" in result.error_message()


def test_output_is_capped_with_a_visible_note(
    backend: CreateOSBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CREATEOS_SANDBOX_MAX_OUTPUT_BYTES", "4096")
    code = "import sys\nsys.stdout.write('x' * 1_000_000)\nsys.stderr.write('e' * 1_000_000)\n"
    result = backend.run(code)
    assert result.exit_code == 0
    assert 0 < len(result.stdout.encode()) <= 4096
    assert set(result.stdout) == {"x"}
    assert "[createos: stdout truncated at 4 KiB; set CREATEOS_SANDBOX_MAX_OUTPUT_BYTES]" in result.stderr
    assert "[createos: stderr truncated at 4 KiB; set CREATEOS_SANDBOX_MAX_OUTPUT_BYTES]" in result.stderr


def test_large_program_is_uploaded_and_runs_the_same(backend: CreateOSBackend, backend_env: Any) -> None:
    padding = "# " + "p" * 1000 + "\n"
    code = padding * (backend_module.STDIN_PROGRAM_MAX_BYTES // len(padding) + 8) + (
        "import os\nprint(os.path.getsize(__file__), __file__.startswith('/workspace/main_'))\n"
    )
    size = len(code.encode())
    assert size > backend_module.STDIN_PROGRAM_MAX_BYTES
    uploads = _route_count(backend_env, "files_put")
    result = backend.run(code)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == f"{size} True\n"
    assert _route_count(backend_env, "files_put") == uploads + 1


def test_small_program_needs_no_upload(backend: CreateOSBackend, backend_env: Any) -> None:
    uploads = _route_count(backend_env, "files_put")
    assert backend.run("print('inline')").stdout == "inline\n"
    assert _route_count(backend_env, "files_put") == uploads


def test_execution_time_is_the_programs_own(backend: CreateOSBackend, backend_env: Any) -> None:
    backend.run("print(0)")  # preflight and catalog out of the way
    backend_env.set_faults({"boot_delay_ms": 1500})
    started = time.monotonic()
    result = backend.run("import time\ntime.sleep(0.3)\n")
    wall_ms = (time.monotonic() - started) * 1000
    assert result.exit_code == 0
    assert result.execution_time_ms is not None
    assert 300 <= result.execution_time_ms < wall_ms - 1000


def test_twenty_threads_at_once(backend: CreateOSBackend) -> None:
    code = "import os\nprint(os.environ['N'], os.environ['CREATEOS_SANDBOX_ID'])\n"

    def one(n: int) -> tuple[int, SandboxResult]:
        return n, backend.run(code, env={"N": str(n)})

    with concurrent.futures.ThreadPoolExecutor(max_workers=20) as pool:
        results = list(pool.map(one, range(20)))
    guests = set()
    for n, result in results:
        assert result.exit_code == 0, result.stderr
        seen_n, guest = result.stdout.split()
        assert seen_n == str(n)
        guests.add(guest)
    assert len(guests) == 20


def test_reset_after_fork_in_a_forked_child(backend: CreateOSBackend) -> None:
    assert backend.run("print('parent')").stdout == "parent\n"  # the parent's client is live
    pid = os.fork()
    if pid == 0:  # child: exit code 0 only if the run worked, never return into pytest
        status = 1
        try:
            backend.reset_after_fork()
            result = backend.run("print('child')")
            backend.shutdown()
            status = 0 if (result.exit_code, result.stdout) == (0, "child\n") else 2
        finally:
            os._exit(status)
    deadline = time.monotonic() + 120
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("forked child hung")
        time.sleep(0.05)
    assert os.waitstatus_to_exitcode(status) == 0
    assert backend.run("print('parent again')").stdout == "parent again\n"


def test_delete_is_off_the_critical_path_and_shutdown_waits_for_it(
    backend: CreateOSBackend, backend_env: Any
) -> None:
    backend.run("print(0)")
    backend.shutdown()
    backend_env.set_faults({"rules": [{"route": "delete", "latency_ms": 2000}]})
    started = time.monotonic()
    assert backend.run("print(1)").stdout == "1\n"
    assert time.monotonic() - started < 1.5, "run waited for the delete"
    assert len(undeleted_guests(backend_env)) == 1  # the delete is still in flight
    backend.shutdown()
    assert undeleted_guests(backend_env) == []
    backend.shutdown()  # idempotent


def test_delete_failure_is_logged_and_does_not_fail_the_run(
    backend: CreateOSBackend, backend_env: Any, caplog: pytest.LogCaptureFixture
) -> None:
    backend.run("print(0)")
    backend.shutdown()
    # Every DELETE fails (the native client retries a failed background delete once).
    backend_env.set_faults({"rules": [{"route": "delete", "status": 500}]})
    with caplog.at_level(logging.WARNING, logger="langflow_sandbox_createos"):
        result = backend.run("print('fine')")
        assert result.stdout == "fine\n"
        backend.shutdown()
    warnings = [r.getMessage() for r in caplog.records if "could not delete guest" in r.getMessage()]
    assert len(warnings) == 1, caplog.text
    assert "HTTP 500" in warnings[0]
    assert backend_env.api_key not in caplog.text
    backend_env.clear_faults()
    (left,) = undeleted_guests(backend_env)  # the guest whose delete failed
    assert left["id"] in pool_keeper.keepers.held_ids()  # still held: the keeper tries at exit
    backend_env.delete_sandbox(left["id"])  # so the cp fixture's check holds
    pool_keeper.release(left["id"])


def test_infrastructure_faults_mid_run_are_execution_errors(
    backend: CreateOSBackend, backend_env: Any
) -> None:
    backend.run("print(0)")
    for route, status in (("create", 503), ("create", 429), ("exec_stream", 500)):
        backend_env.set_faults({"rules": [{"route": route, "status": status, "retry_after": 2, "times": 1}]})
        with pytest.raises(SandboxExecutionError) as info:
            backend.run("print(1)")
        assert type(info.value) is SandboxExecutionError, (route, status)
        assert str(status) in str(info.value)
        backend.shutdown()
        assert undeleted_guests(backend_env) == [], (route, status)


def test_connection_reset_during_exec_is_an_execution_error(
    backend: CreateOSBackend, backend_env: Any
) -> None:
    backend.run("print(0)")
    reset = {"route": "exec_stream", "reset": True, "after_bytes": 20, "times": 1}
    backend_env.set_faults({"rules": [reset]})
    with pytest.raises(SandboxExecutionError) as info:
        backend.run("print(1)")
    assert type(info.value) is SandboxExecutionError
    backend.shutdown()
    assert undeleted_guests(backend_env) == []


def _route_count(cp: Any, route: str) -> int:
    return int(cp.stats()["requests"].get(route, 0))


def test_buffered_exec_fallback_behaves_the_same(backend: CreateOSBackend, backend_env: Any) -> None:
    # A control plane without streaming exec (404): the native client falls back to the
    # buffered exec, which does report exec_ms.
    backend.run("print(0)")
    backend_env.set_faults({"streaming": False})
    result = backend.run("import sys, time\nprint('out')\nsys.stderr.write('err\\n')\ntime.sleep(0.2)\n")
    assert (result.exit_code, result.stdout, result.stderr) == (0, "out\n", "err\n")
    assert result.execution_time_ms is not None and result.execution_time_ms >= 200


def test_buffered_exec_fallback_timeout(
    backend: CreateOSBackend, backend_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend.run("print(0)")
    backend_env.set_faults({"streaming": False})
    monkeypatch.setenv("LANGFLOW_SANDBOX_TIMEOUT_SECONDS", "1")
    result = backend.run("import time\nprint('early')\ntime.sleep(60)\n")
    assert (result.exit_code, result.stdout) == (-1, "early\n")


def test_stream_without_exit_frame_is_a_clear_execution_error(
    backend: CreateOSBackend, backend_env: Any
) -> None:
    """A guest agent that dies mid-command ends the stream cleanly but without an exit status:
    the run fails with that reason instead of reporting the program exited -1."""
    backend_env.set_faults({"rules": [{"route": "exec_stream", "drop_exit": True, "times": 1}]})
    with pytest.raises(SandboxExecutionError, match="ended without an exit status") as info:
        backend.run("print(1)")
    assert "retry the run" in str(info.value) and "which is being deleted" in str(info.value)
    backend.shutdown()
    assert undeleted_guests(backend_env) == []


def test_a_changed_setting_takes_effect_on_the_next_run(
    backend: CreateOSBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The settings are parsed once per change of the environment, not once per process."""
    code = "print('x' * 5000)"
    assert "truncated" not in backend.run(code).stderr
    monkeypatch.setenv("CREATEOS_SANDBOX_MAX_OUTPUT_BYTES", "1024")
    assert "[createos: stdout truncated at 1 KiB" in backend.run(code).stderr
    monkeypatch.setenv("CREATEOS_SANDBOX_MAX_WAIT_SECONDS", "soon")
    with pytest.raises(SandboxUnavailableError, match="CREATEOS_SANDBOX_MAX_WAIT_SECONDS"):
        backend.run(code)
    monkeypatch.delenv("CREATEOS_SANDBOX_MAX_WAIT_SECONDS")
    monkeypatch.delenv("CREATEOS_SANDBOX_MAX_OUTPUT_BYTES")
    assert "truncated" not in backend.run(code).stderr


def test_runs_reuse_the_spec_until_what_it_is_made_from_changes(
    backend: CreateOSBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guest spec, shape and budget are built once for the same settings, endpoint and env;
    a changed setting or env builds them again, and each run still gets its own name."""
    creates: list[dict[str, Any]] = []
    built: list[int] = []
    real_create, real_build = lease.Lease.create, backend_module._Plan.build

    def create(cls: Any, endpoint: Any, guest: Any, name: str, **kwargs: Any) -> Any:
        creates.append(guest.create_request(name))
        return real_create(endpoint, guest, name, **kwargs)

    def build(cls: Any, *args: Any) -> Any:
        built.append(1)
        return real_build(*args)

    monkeypatch.setattr(lease.Lease, "create", classmethod(create))
    monkeypatch.setattr(backend_module._Plan, "build", classmethod(build))
    for _ in range(3):
        assert backend.run("print(1)").stdout == "1\n"
    assert len(built) == 1 and len({c.pop("name") for c in creates}) == 3
    assert creates[0] == creates[1] == creates[2]
    monkeypatch.setenv("LANGFLOW_SANDBOX_MEMORY_MB", "6000")  # past the smallest shape
    backend.run("print(1)")
    assert len(built) == 2 and creates[-1]["shape"] != creates[0]["shape"]
    backend.run("import os; print(os.environ['LF_X'])", env={"LF_X": "1"})
    assert len(built) == 3 and creates[-1]["envs"] == {"LF_X": "1"}
    backend.run("print(1)", env={"LF_X": "2"})  # another value: another guest env
    assert len(built) == 4 and creates[-1]["envs"] == {"LF_X": "2"}
