"""The component run by lfx inside a real Graph on createos-local: fresh guests (Guest Reuse off)."""

from __future__ import annotations

import base64
import shlex
import sys
import time
from typing import Any

import pytest
from lfx.utils.sandbox.base import SandboxExecutionError, SandboxUnavailableError

from langflow_sandbox_createos.component import artifacts, engine, wrapper
from langflow_sandbox_createos.core import connection, lease
from langflow_sandbox_createos.local.testing import LocalControlPlane, NamespaceHost

from .conftest import all_ids, client, run_flow

WRITE_FILES = """
import os
os.makedirs('/workspace/artifacts/sub', exist_ok=True)
open('/workspace/artifacts/report.txt', 'w').write('héllo\\n')
open('/workspace/artifacts/sub/blob.bin', 'wb').write(bytes(range(256)))
open('/workspace/artifacts/.hidden', 'w').write('dot')
print('  wrote 3 files  ')
"""


def no_live_guests(plane: LocalControlPlane) -> None:
    assert plane.wait_until_no_live(timeout=5.0) == []


def test_python_mode_both_outputs(component_cls: type, env: LocalControlPlane) -> None:
    run = run_flow(component_cls, python_code=WRITE_FILES, collect_artifacts=True)
    res = run.results
    assert res["result"] == "wrote 3 files"
    assert res["exit_code"] == 0 and res["stderr"] == "" and "error" not in res
    assert res["sandbox_id"].startswith("sb-")
    assert res["reused_guest"] is False
    assert res["artifact_count"] == 3 and res["artifacts_truncated"] is False
    rows = {row["path"]: row for row in run.files.to_dict(orient="records")}
    assert set(rows) == {"report.txt", "sub/blob.bin", ".hidden"}
    assert rows["report.txt"]["text"] == "héllo\n" and rows["report.txt"]["size"] == 7
    assert base64.b64decode(rows["sub/blob.bin"]["base64"]) == bytes(range(256))
    assert rows["sub/blob.bin"]["text"] is None
    assert run.component.status.data["result"] == "wrote 3 files"  # the final status shows the result
    no_live_guests(env)


def test_default_program_and_no_files(component_cls: type, env: LocalControlPlane) -> None:
    run = run_flow(component_cls)
    assert run.results["result"] == "hello from a microVM"
    assert run.results["artifact_count"] == 0
    assert list(run.files.columns) == list(artifacts.ROW_COLUMNS) and len(run.files) == 0
    no_live_guests(env)


def test_command_mode_ignores_python_and_reports_failure(component_cls: type, env: LocalControlPlane) -> None:
    run = run_flow(
        component_cls,
        python_code="raise SystemExit('python must not run')",
        command="echo from-shell; echo oops >&2; exit 3",
    )
    res = run.results
    assert res["result"] == "from-shell"
    assert res["stderr"] == "oops"
    assert res["exit_code"] == 3
    assert res["error"] == "Exited with code 3: oops"
    no_live_guests(env)


def test_command_mode_returns_files(component_cls: type, env: LocalControlPlane) -> None:
    run = run_flow(
        component_cls, command="printf 'a,b\\n1,2\\n' > /workspace/artifacts/t.csv", collect_artifacts=True
    )
    assert run.results["artifact_count"] == 1
    assert run.files.to_dict(orient="records") == [
        {"path": "t.csv", "size": 8, "text": "a,b\n1,2\n", "base64": None, "path_escaped": False}
    ]
    no_live_guests(env)


@pytest.mark.parametrize("value", [0, -5, 3601, "abc", 2.5])
def test_bad_timeout_is_refused_before_any_guest(
    component_cls: type, env: LocalControlPlane, value: object
) -> None:
    before = all_ids(env)
    component = component_cls(_id="CreateOSSandbox-bad01", timeout_seconds=value)
    with pytest.raises(ValueError, match="Timeout \\(seconds\\) must be"):
        component.run_sandbox()
    assert all_ids(env) == before


def test_timeout_kill_still_returns_the_files_written(component_cls: type, env: LocalControlPlane) -> None:
    started = time.monotonic()
    run = run_flow(
        component_cls,
        command="echo started; echo partial > /workspace/artifacts/progress.txt; sleep 60; echo never",
        timeout_seconds=2,
        collect_artifacts=True,
    )
    assert time.monotonic() - started < 20
    res = run.results
    assert res["timed_out"] is True
    assert res["exit_code"] == 124
    assert res["error"] == "Timed out after 2 s"
    assert res["result"] == "started"
    assert run.files.to_dict(orient="records") == [
        {"path": "progress.txt", "size": 8, "text": "partial\n", "base64": None, "path_escaped": False}
    ]
    no_live_guests(env)


def test_file_count_limit(component_cls: type, env: LocalControlPlane) -> None:
    code = "for i in range(300):\n    open(f'/workspace/artifacts/f{i:03}.txt', 'w').write(str(i))\n"
    run = run_flow(component_cls, python_code=code, collect_artifacts=True)
    assert run.results["artifact_count"] == 256 == len(run.files)
    assert run.results["artifacts_truncated"] is True
    assert "only the first 256 are returned" in run.results["artifacts_message"]
    no_live_guests(env)


def test_size_limit_binds_during_the_transfer(component_cls: type, env: LocalControlPlane) -> None:
    # 8 MiB that does not compress: the archive is cut at 5 MiB in the guest, and the files
    # before the cut come back
    code = (
        "import os\n"
        "for i in range(8):\n"
        "    open(f'/workspace/artifacts/r{i}.bin', 'wb').write(os.urandom(1024 * 1024))\n"
    )
    run = run_flow(component_cls, python_code=code, collect_artifacts=True)
    res = run.results
    assert res["artifacts_truncated"] is True
    assert 1 <= res["artifact_count"] < 8
    assert sum(run.files["size"]) <= artifacts.MAX_TOTAL_BYTES
    assert "ends early" in res["artifacts_message"] or "do not fit" in res["artifacts_message"]
    no_live_guests(env)


def test_files_output_never_runs_twice_after_a_failure(component_cls: type, env: LocalControlPlane) -> None:
    env.set_faults({"rules": [{"route": "exec_stream", "status": 500}, {"route": "exec", "status": 500}]})
    before = all_ids(env)
    component = component_cls(_id="CreateOSSandbox-fail1")
    with pytest.raises(SandboxExecutionError) as first:
        component.run_sandbox()
    with pytest.raises(SandboxExecutionError) as second:
        component.collected_files()
    assert second.value is first.value
    assert len(all_ids(env) - before) == 1  # one guest, created once
    assert "CreateOS: could not run the program" in str(first.value)
    env.clear_faults()
    no_live_guests(env)


def test_files_output_alone_runs_once(component_cls: type, env: LocalControlPlane) -> None:
    before = all_ids(env)
    component = component_cls(
        _id="CreateOSSandbox-once1", command="echo x > /workspace/artifacts/x", collect_artifacts=True
    )
    files = component.collected_files()
    results = component.run_sandbox()
    assert len(files) == 1 and results.data["artifact_count"] == 1
    assert len(all_ids(env) - before) == 1
    no_live_guests(env)


REACH_TEST_HOST = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5) as conn:
        print("ok:" + conn.recv(64).decode().strip())
except OSError as exc:
    print("refused:" + type(exc).__name__)
"""


def test_network_off_runs_without_the_acknowledgement_and_says_so(
    component_cls: type, env: LocalControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The product page: Allow Network off blocks egress. The component's default runs with no
    LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS (that acknowledgement is the backend's),
    its guest cannot reach a test host that an open guest reaches, and its Results name the
    link-local range that CreateOS leaves reachable."""
    monkeypatch.delenv("LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS")
    with NamespaceHost() as host:
        command = f"python3 -c {shlex.quote(REACH_TEST_HOST)} {host.address} {host.port}"
        closed = run_flow(component_cls, command=command).results
        opened = run_flow(component_cls, command=command, allow_network=True).results
    assert closed["exit_code"] == 0 and closed["result"].startswith("refused:"), closed
    assert opened["result"] == f"ok:{NamespaceHost.BANNER}", opened
    assert "169.254.0.0/16" in closed["network_notice"] and "Allow Network is off" in closed["network_notice"]
    assert "network_notice" not in opened
    no_live_guests(env)


def test_shape_is_checked_against_the_catalog(
    component_cls: type, env: LocalControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SandboxUnavailableError, match="'s-9vcpu-nope' is not in the CreateOS shape catalog"):
        component_cls(_id="CreateOSSandbox-shape", shape="s-9vcpu-nope").run_sandbox()
    monkeypatch.setenv("CREATEOS_SANDBOX_SHAPE", "s-env-missing")
    with pytest.raises(SandboxUnavailableError, match="'s-env-missing'"):
        component_cls(_id="CreateOSSandbox-shape").run_sandbox()
    assert engine.resolve_shape(" s-1vcpu-1gb ") == "s-1vcpu-1gb"


def test_control_plane_errors_map_to_lfx_errors(component_cls: type, env: LocalControlPlane) -> None:
    env.set_faults({"rules": [{"route": "create", "status": 403}]})
    with pytest.raises(SandboxUnavailableError, match="CreateOS: could not"):
        component_cls(_id="CreateOSSandbox-err01", collect_artifacts=True).run_sandbox()
    env.set_faults({"rules": [{"route": "create", "status": 500}]})
    with pytest.raises(SandboxExecutionError, match="CreateOS: could not") as exc:
        component_cls(_id="CreateOSSandbox-err02", collect_artifacts=True).run_sandbox()
    assert not isinstance(exc.value, SandboxUnavailableError)
    env.clear_faults()


def test_unreachable_control_plane_is_an_lfx_error(
    component_cls: type, env: LocalControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CREATEOS_SANDBOX_BASE_URL", "http://127.0.0.1:9")
    with pytest.raises(SandboxExecutionError):
        component_cls(_id="CreateOSSandbox-down1").run_sandbox()


def test_download_cap_backstop_and_hostile_archive(env: LocalControlPlane) -> None:
    """The guest normally caps its archive; if the archive is bigger anyway, or hostile, the
    transfer cap and the bounded reader decide, and the Results say so."""
    import gzip
    import io
    import tarfile

    c = client()
    sandbox_id = c.create({"shape": engine.resolve_shape(None), "egress": ["*"]})["id"]
    try:
        req = engine.RunRequest("x", "command", False, True, True, 5, "s", "f", "c")
        program = wrapper.build_program(req, lock=False)
        guest = lease.Lease.kept(connection.endpoints.get(), sandbox_id)

        c.upload(sandbox_id, program.archive_path, b"\0" * (artifacts.MAX_ARCHIVE_BYTES + 1))
        outcome = engine.RunOutcome("", "", 0, sandbox_id, False, 5)
        engine._collect(guest, program, outcome, lambda fn: fn())
        assert outcome.files == [] and outcome.artifacts_truncated
        assert "max_bytes" in outcome.artifacts_message

        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w") as tar:
            for name, kind in (
                ("../escape", tarfile.REGTYPE),
                ("./link", tarfile.SYMTYPE),
                ("./ok", tarfile.REGTYPE),
            ):
                info = tarfile.TarInfo(name)
                info.type = kind
                info.linkname = "/etc/passwd" if kind == tarfile.SYMTYPE else ""
                info.size = 2 if kind == tarfile.REGTYPE else 0
                tar.addfile(info, io.BytesIO(b"ok") if kind == tarfile.REGTYPE else None)
            bomb = tarfile.TarInfo("./bomb")
            bomb.size = 1024**3
            raw.write(bomb.tobuf())
        body = gzip.compress(raw.getvalue()) + gzip.compress(b"\0" * (64 * 1024 * 1024)) * 4
        c.upload(sandbox_id, program.archive_path, body)
        outcome = engine.RunOutcome("", "", 0, sandbox_id, False, 5)
        engine._collect(guest, program, outcome, lambda fn: fn())
        assert [f.path for f in outcome.files] == ["ok"]
        assert outcome.artifacts_truncated
        assert "absolute or '..' path" in outcome.artifacts_message
        assert "not regular files" in outcome.artifacts_message
    finally:
        c.delete(sandbox_id)


def test_backslash_n_in_code_reaches_the_guest_verbatim(component_cls: type, env: LocalControlPlane) -> None:
    # lfx turns the two characters \ n of a text field into a newline; the program must not change
    run = run_flow(component_cls, python_code='print("a\\nb")\nprint(len("\\n"))')
    assert run.results["result"] == "a\nb\n1", run.results
    run = run_flow(component_cls, command="printf 'x\\ny\\n'")
    assert run.results["result"] == "x\ny"
    no_live_guests(env)


def test_progress_is_shown_while_output_streams(
    component_cls: type, env: LocalControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    progress_cls = sys.modules[component_cls.__module__].engine.Progress  # the one the node uses
    statuses: list[tuple[float, str]] = []
    original = progress_cls.on_output

    def watch(self: Any, stream: str, chunk: str) -> None:
        original(self, stream, chunk)
        statuses.append((time.monotonic(), self._component.status))

    monkeypatch.setattr(progress_cls, "on_output", watch)
    component = component_cls(
        _id="CreateOSSandbox-prog1",
        python_code="import time\nfor i in range(3):\n    print(f'step {i}')\n    time.sleep(1)\n",
    )
    result = component.run_sandbox()
    ended = time.monotonic()
    assert result.data["result"] == "step 0\nstep 1\nstep 2"
    first_at, first_status = statuses[0]
    assert first_status.startswith("step 0") and ended - first_at > 1.5  # shown while the program still ran
    logs = [log for log in component._logs if log.name == "progress"]
    assert logs and "step 0" in str(logs[0].message)
    assert component.status.data["result"] == result.data["result"]  # the final status is the result
    no_live_guests(env)


def _requests_during(plane: LocalControlPlane, fn: Any) -> tuple[Any, dict[str, int]]:
    before = dict(plane.stats()["requests"])
    out = fn()
    after = plane.stats()["requests"]
    delta = {k: n - before.get(k, 0) for k, n in after.items() if not k.startswith("local_")}
    return out, {k: n for k, n in delta.items() if n}


def test_programs_travel_on_stdin_and_large_ones_as_files(
    component_cls: type, env: LocalControlPlane
) -> None:
    """Up to 256 KiB the program is the exec's stdin (no upload); above, or when it cannot be
    UTF-8 (lone surrogates), it is uploaded first; either way the guest runs it from a file,
    so tracebacks show its lines."""
    run, calls = _requests_during(env, lambda: run_flow(component_cls, python_code="print('small')\n1/0\n"))
    assert run.results["exit_code"] == 1 and run.results["result"] == "small"
    assert 'main.py", line 2' in run.results["stderr"] and "1/0" in run.results["stderr"]
    assert "files_put" not in calls and calls.get("exec_stream", 0) + calls.get("exec", 0) == 1, calls

    big = "x = 1\n" * (300 * 1024 // 6) + "print('big', x)\n"
    run, calls = _requests_during(env, lambda: run_flow(component_cls, python_code=big))
    assert run.results["result"] == "big 1" and calls.get("files_put") == 1, calls

    long_command = "printf %s " + "a" * (100 * 1024)  # over the argv limit, under the stdin one
    run, calls = _requests_during(env, lambda: run_flow(component_cls, command=long_command))
    assert run.results["result"] == "a" * (100 * 1024) and "files_put" not in calls, calls

    run, calls = _requests_during(env, lambda: run_flow(component_cls, python_code="print('x')\n# \ud800\n"))
    assert run.results["exit_code"] != 0 and "SyntaxError" in run.results["stderr"], run.results
    assert calls.get("files_put") == 1, calls
    no_live_guests(env)
