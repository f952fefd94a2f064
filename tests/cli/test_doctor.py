"""`createos-langflow doctor`: one test per verdict, against the real local control plane."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from langflow_sandbox_createos import cli

SURFACE_VARS = (
    "LANGFLOW_SANDBOX_BACKEND",
    "LANGFLOW_SANDBOX_BACKEND_PLUGINS",
    "LANGFLOW_EXECUTOR_KIND",
    "LANGFLOW_SANDBOX_ALLOWED_DOMAINS",
    "LANGFLOW_SANDBOX_ALLOW_NETWORK",
    "LANGFLOW_SANDBOX_MEMORY_MB",
    "CREATEOS_SANDBOX_SHAPE",
    "CREATEOS_API_KEY",
    "CREATEOS_EXECUTOR_EGRESS",
)


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, createos_env, cp):
    for name in SURFACE_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LANGFLOW_SANDBOX_BACKEND_PLUGINS", "createos")
    monkeypatch.setenv("LANGFLOW_SANDBOX_BACKEND", "createos")
    monkeypatch.setenv("LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS", "true")
    monkeypatch.setenv("CREATEOS_SANDBOX_ACCEPT_LOCAL_ISOLATION", "true")  # createos-local
    return monkeypatch


def run_doctor(capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    code = cli.main(["doctor", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is (code == 0)
    return code, report


def check(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in report["checks"] if c["name"] == name)


def test_all_good(env, capsys):
    code, report = run_doctor(capsys)
    assert code == 0, report
    assert report["surfaces"] == {"backend": True, "component": True, "executor": False}
    assert check(report, "API key")["detail"] == "set from CREATEOS_SANDBOX_API_KEY"
    assert "accepted the key" in check(report, "control plane")["detail"]
    assert check(report, "backend shape")["detail"].startswith("s-2vcpu-4gb")
    for group in cli.doctor.ENTRY_POINTS:
        assert check(report, f"entry point {group}:{cli.doctor.ENTRY_POINTS[group]}")["ok"] is True
    assert check(report, "builtin shadowing")["ok"] is True


def test_key_from_fallback_variable(env, capsys, control_plane):
    env.delenv("CREATEOS_SANDBOX_API_KEY")
    env.setenv("CREATEOS_API_KEY", control_plane.api_key)
    code, report = run_doctor(capsys)
    assert code == 0
    assert check(report, "API key")["detail"] == "set from CREATEOS_API_KEY"


def test_missing_key(env, capsys):
    env.delenv("CREATEOS_SANDBOX_API_KEY")
    code, report = run_doctor(capsys)
    assert code == 1
    assert check(report, "API key")["ok"] is False
    assert "CREATEOS_SANDBOX_API_KEY" in check(report, "API key")["detail"]


def test_wrong_key(env, capsys):
    env.setenv("CREATEOS_SANDBOX_API_KEY", "not-the-key")
    code, report = run_doctor(capsys)
    assert code == 1
    detail = check(report, "control plane")["detail"]
    assert "401" in detail and "CREATEOS_SANDBOX_API_KEY" in detail
    assert "not-the-key" not in json.dumps(report)


def test_unreachable_control_plane(env, capsys):
    env.setenv("CREATEOS_SANDBOX_BASE_URL", "http://127.0.0.1:9")  # discard port: nothing listens
    code, report = run_doctor(capsys)
    assert code == 1
    assert check(report, "control plane")["ok"] is False
    assert "could not be reached" in check(report, "control plane")["detail"]


def test_plain_http_to_remote_host_refused(env, capsys):
    env.setenv("CREATEOS_SANDBOX_BASE_URL", "http://api.example.com")
    code, report = run_doctor(capsys)
    assert code == 1
    assert "plain http" in check(report, "base URL")["detail"]


def test_domains_refused(env, capsys):
    env.setenv("LANGFLOW_SANDBOX_ALLOWED_DOMAINS", "pypi.org")
    code, report = run_doctor(capsys)
    assert code == 1
    assert "does not enforce hostname rules" in check(report, "network policy")["detail"]


def test_egress_off_without_acknowledgement(env, capsys):
    env.delenv("LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS")
    code, report = run_doctor(capsys)
    assert code == 1
    policy = check(report, "network policy")
    assert "169.254.0.0/16" in policy["detail"]
    assert "LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS=true" in policy["fix"]
    # the backend's acknowledgement: the component runs with Allow Network off without it
    assert policy["surfaces"] == ["backend"], policy


def test_network_on_needs_no_acknowledgement(env, capsys):
    env.delenv("LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS")
    env.setenv("LANGFLOW_SANDBOX_ALLOW_NETWORK", "true")
    code, report = run_doctor(capsys)
    assert code == 0
    assert check(report, "network policy")["detail"] == "open (unrestricted)"


@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        ({"CREATEOS_SANDBOX_SHAPE": "s-9vcpu-1tb"}, "not in the CreateOS shape catalog"),
        ({"CREATEOS_SANDBOX_SHAPE": "s-1vcpu-1gb", "LANGFLOW_SANDBOX_MEMORY_MB": "2048"}, "below"),
        ({"LANGFLOW_SANDBOX_MEMORY_MB": "100000"}, "No CreateOS shape has at least"),
    ],
)
def test_shape_verdicts(env, capsys, variables, expected):
    for name, value in variables.items():
        env.setenv(name, value)
    code, report = run_doctor(capsys)
    assert code == 1
    assert expected in check(report, "backend shape")["detail"]


def test_memory_floor_picks_bigger_shape(env, capsys):
    env.setenv("LANGFLOW_SANDBOX_MEMORY_MB", "6000")
    code, report = run_doctor(capsys)
    assert code == 0
    assert check(report, "backend shape")["detail"].startswith("s-4vcpu-8gb")


def test_bad_number(env, capsys):
    env.setenv("LANGFLOW_SANDBOX_MEMORY_MB", "lots")
    code, report = run_doctor(capsys)
    assert code == 1
    assert (
        "LANGFLOW_SANDBOX_MEMORY_MB='lots' is not a whole number"
        in check(report, "backend settings")["detail"]
    )


def test_backend_selected_without_trust_gate(env, capsys):
    env.delenv("LANGFLOW_SANDBOX_BACKEND_PLUGINS")
    code, report = run_doctor(capsys)
    assert code == 1
    assert check(report, "backend trust gate")["fix"] == "export LANGFLOW_SANDBOX_BACKEND_PLUGINS=createos"


def test_problem_of_a_surface_that_is_off_does_not_fail(env, capsys):
    env.delenv("LANGFLOW_SANDBOX_BACKEND")
    env.delenv("LANGFLOW_SANDBOX_BACKEND_PLUGINS")
    env.setenv("LANGFLOW_SANDBOX_ALLOWED_DOMAINS", "pypi.org")  # gates only the backend
    code, report = run_doctor(capsys)
    assert report["surfaces"]["backend"] is False
    assert check(report, "network policy")["ok"] is False
    assert code == 0


def test_executor_settings_verdict(env, capsys):
    env.setenv("LANGFLOW_EXECUTOR_KIND", "createos")
    env.setenv("CREATEOS_EXECUTOR_EGRESS", "pypi.org")
    code, report = run_doctor(capsys)
    assert report["surfaces"]["executor"] is True
    assert code == 1
    assert "not an IPv4 address or CIDR" in check(report, "executor settings")["detail"]


def test_console_script_human_output(control_plane, cp):
    env = {k: v for k, v in os.environ.items() if k not in SURFACE_VARS}
    env.update(
        CREATEOS_SANDBOX_API_KEY=control_plane.api_key,
        CREATEOS_SANDBOX_BASE_URL=control_plane.url,
        LANGFLOW_SANDBOX_BACKEND_PLUGINS="createos",
        LANGFLOW_SANDBOX_BACKEND="createos",
    )
    env.pop("LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS", None)
    proc = subprocess.run(
        [sys.executable, "-m", "langflow_sandbox_createos.cli", "doctor"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    assert "[FAIL] network policy" in proc.stdout
    assert "fix: export LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS=true" in proc.stdout
    assert "Verdict: fix the FAIL lines above" in proc.stdout
    assert control_plane.api_key not in proc.stdout + proc.stderr


def test_implementation_names_the_native_client_and_its_libraries(env, capsys):
    from langflow_sandbox_createos import _createos

    code, report = run_doctor(capsys)
    assert code == 0, report
    found = check(report, "implementation")
    assert found["ok"] is True
    assert found["detail"].startswith("langflow-sandbox-createos 0.3.0, native client 0.3.0")
    assert f"libcurl {_createos.curl_version}, jansson {_createos.jansson_version}" in found["detail"]


def test_missing_key_on_createos_local_points_at_its_own_key(env, capsys):
    """On createos-local (a loopback URL) the fix is its own key, not an account on createos.sh."""
    env.delenv("CREATEOS_SANDBOX_API_KEY")
    _, report = run_doctor(capsys)
    detail = check(report, "API key")["detail"]
    assert "createos-local" in detail and "--env-file .run/createos.env" in detail
    assert "createos.sh" not in detail
    env.setenv("CREATEOS_SANDBOX_BASE_URL", "https://api.sb.createos.sh")
    _, report = run_doctor(capsys)
    assert "createos.sh/app/profile" in check(report, "API key")["detail"]


def test_env_file_gives_doctor_what_make_run_gave_langflow(env, capsys, tmp_path, control_plane):
    """`make run` writes .run/createos.env; doctor --env-file reads it (quoting and export allowed)."""
    for name in ("CREATEOS_SANDBOX_API_KEY", "CREATEOS_SANDBOX_BASE_URL", "LANGFLOW_SANDBOX_BACKEND"):
        env.delenv(name, raising=False)
    env_file = tmp_path / "createos.env"
    env_file.write_text(
        "# written by make run\n"
        f"export CREATEOS_SANDBOX_API_KEY='{control_plane.api_key}'\n"
        f"CREATEOS_SANDBOX_BASE_URL={control_plane.url}\n"
        "LANGFLOW_SANDBOX_BACKEND=createos\n"
        "LANGFLOW_EXECUTOR_KIND=createos\n"
    )
    code = cli.main(["doctor", "--json", "--env-file", str(env_file)])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report
    assert report["surfaces"] == {"backend": True, "component": True, "executor": True}
    assert "accepted the key" in check(report, "control plane")["detail"]
    combined = check(report, "executor with the backend and component")["detail"]
    assert "still run with this host's sandbox backend" in combined and "Canvas runs" in combined
    env_file.write_text("not a line\n")
    assert cli.main(["doctor", "--env-file", str(env_file)]) == 2
    assert "expected NAME=value" in capsys.readouterr().err


def test_executor_without_a_backend_says_the_interpreter_is_restricted(env, capsys):
    env.delenv("LANGFLOW_SANDBOX_BACKEND")
    env.setenv("LANGFLOW_EXECUTOR_KIND", "createos")
    _, report = run_doctor(capsys)
    assert (
        "restricted mode inside the guest"
        in check(report, "executor with the backend and component")["detail"]
    )


def test_isolation_is_reported_as_it_is(env, capsys):
    """createos-local's guests are namespaces on a shared kernel: doctor says so, and fails the
    backend until CREATEOS_SANDBOX_ACCEPT_LOCAL_ISOLATION=true accepts it (issue 27)."""
    _, report = run_doctor(capsys)
    accepted = check(report, "isolation")
    assert (
        accepted["ok"] is None and "'namespaces'" in accepted["detail"] and "accepts it" in accepted["detail"]
    )
    env.delenv("CREATEOS_SANDBOX_ACCEPT_LOCAL_ISOLATION")
    code, report = run_doctor(capsys)
    refused = check(report, "isolation")
    assert code == 1 and refused["ok"] is False and "not microVMs" in refused["detail"]
    assert "CREATEOS_SANDBOX_ACCEPT_LOCAL_ISOLATION=true" in refused["fix"]
