"""The backend's shape as lfx sees it, and the guest script, without a control plane."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from lfx.utils.sandbox.base import Capabilities, SandboxBackend

from langflow_sandbox_createos.backend import engine as backend_module
from langflow_sandbox_createos.backend.engine import (
    TRAILER_PREFIX,
    CreateOSBackend,
    create_backend,
    run_script,
    split_trailer,
)


def test_factory_does_no_io_and_reads_no_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    # Nothing usable in the environment: building the backend must still succeed.
    for name in ("CREATEOS_SANDBOX_API_KEY", "CREATEOS_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CREATEOS_SANDBOX_BASE_URL", "not a url")
    monkeypatch.setenv("LANGFLOW_SANDBOX_TIMEOUT_SECONDS", "nonsense")
    instance = create_backend()
    assert isinstance(instance, CreateOSBackend)
    assert isinstance(instance, SandboxBackend)  # lfx's runtime-checkable protocol
    assert instance.name == "createos"
    instance.shutdown()
    instance.shutdown()  # idempotent


def test_capabilities_are_lfx_capabilities(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS", "true")
    monkeypatch.setenv("CREATEOS_SANDBOX_ACCEPT_LOCAL_ISOLATION", "true")  # createos-local
    caps = create_backend().capabilities()
    assert type(caps) is Capabilities
    assert caps.isolation == "hardware-virtualized"
    assert caps.supports_deny_all_egress is True
    assert caps.supports_domain_allowlist is False
    assert caps.max_timeout_seconds == backend_module.settings.MAX_TIMEOUT_SECONDS


@pytest.mark.parametrize("value", [None, "false", "0", "maybe"])
def test_deny_all_is_not_claimed_while_169_254_is_reachable(
    monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    # Without the acknowledgement, "egress off" leaves 169.254.0.0/16 open: not deny-all.
    # A malformed value is read as "not acknowledged" (fail closed).
    if value is None:
        monkeypatch.delenv("LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS", raising=False)
    else:
        monkeypatch.setenv("LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS", value)
    assert create_backend().capabilities().supports_deny_all_egress is False


def _run_guest_script(tmp_path: Path, program: str, timeout: int) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "main.py"
    path.write_text(program)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").symlink_to(sys.executable)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    return subprocess.run(
        ["/bin/sh", "-c", run_script(str(path), timeout)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout + 20,
        check=False,
    )


def test_guest_script_reports_a_timeout_as_124_not_137(tmp_path: Path) -> None:
    # GNU timeout --signal=KILL exits 137 on a timeout; the script must say 124.
    done = _run_guest_script(tmp_path, "print('before', flush=True)\nimport time\ntime.sleep(30)\n", 1)
    # the literal, not the constant the script embeds: a constant changed to 137 must fail here
    assert done.returncode == 124
    assert backend_module.GUEST_TIMEOUT_STATUS == 124
    assert done.stdout == "before\n"
    stderr, program_ms = split_trailer(done.stderr)
    assert stderr == ""
    assert program_ms is not None and 1000 <= program_ms < 5000


def test_guest_script_keeps_a_real_sigkill_as_137(tmp_path: Path) -> None:
    done = _run_guest_script(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", 30)
    assert done.returncode == 137


def test_guest_script_passes_the_exit_status_through(tmp_path: Path) -> None:
    done = _run_guest_script(tmp_path, "import sys, time\nprint('x')\ntime.sleep(0.2)\nsys.exit(3)\n", 30)
    assert (done.returncode, done.stdout) == (3, "x\n")
    stderr, program_ms = split_trailer(done.stderr)
    assert stderr == ""
    assert program_ms is not None and 200 <= program_ms < 5000


def test_the_timing_trailer_is_stripped_exactly() -> None:
    trailer = f"{TRAILER_PREFIX}42\n"
    assert split_trailer(f"warning: x{trailer}") == ("warning: x", 42)
    assert split_trailer("plain\n") == ("plain\n", None)
    # A program that prints a fake trailer first cannot hide the real one or its own text.
    assert split_trailer(f"{TRAILER_PREFIX}1\nmine\n{trailer}") == (f"{TRAILER_PREFIX}1\nmine\n", 42)


def test_unbuffered_output_survives_a_kill(tmp_path: Path) -> None:
    # No flush in the program: python3 -u is what keeps the line.
    done = _run_guest_script(tmp_path, "print('unflushed')\nimport time\ntime.sleep(30)\n", 1)
    assert done.returncode == 124
    assert done.stdout == "unflushed\n"


def test_a_missing_interpreter_is_reported_on_stderr(tmp_path: Path) -> None:
    path = tmp_path / "main.py"
    path.write_text("print(1)\n")
    env = {**os.environ, "PATH": "/usr/bin:/bin"}  # coreutils, but no python3 of ours
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "timeout").symlink_to("/usr/bin/timeout")
    env["PATH"] = str(bindir)
    done = subprocess.run(
        ["/bin/sh", "-c", run_script(str(path), 5)], capture_output=True, text=True, env=env, check=False
    )
    assert done.returncode == 127
    assert "python3" in done.stderr
