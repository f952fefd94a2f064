"""A real Langflow server (from PyPI, in .venv-langflow) started the way users start it:
``scripts/run-langflow.sh`` (what ``make run`` runs), on free ports, with its own
createos-local. One server for the whole session: Langflow takes 30-90 s to start on 2 cores.

Authentication is on (``LANGFLOW_AUTO_LOGIN=false`` and a superuser), as on a shared or
production Langflow: the script's starter import logs in with the superuser's credentials,
REST clients log in the same way, and the browser goes through Langflow's login page.

Teardown stops it with SIGINT (Ctrl-C) and checks what ``make run`` promises: both servers
gone, no guest left behind. The Langflow and createos-local logs are attached to any failing
test that used the server.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from langflow_sandbox_createos.starter import LangflowClient

from .model_server import ModelServer

ROOT = Path(__file__).resolve().parents[2]
VENV_LANGFLOW = ROOT / os.environ.get("VENV_LANGFLOW", ".venv-langflow")
START_TIMEOUT = float(os.environ.get("LANGFLOW_E2E_START_TIMEOUT", "420"))
ARTIFACTS = ROOT / "tests" / "artifacts"
# The plugin's settings must come from the script, never from the test process.
_SCRUB = (
    "CREATEOS_SANDBOX_API_KEY",
    "CREATEOS_API_KEY",
    "CREATEOS_SANDBOX_BASE_URL",
    "CREATEOS_LOCAL_API_KEY",
    "LANGFLOW_",
)
SUPERUSER = "createos-e2e"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LangflowServer:
    """``make run`` as a subprocess: Langflow, createos-local and the imported starter flow."""

    run_dir: Path
    port: int
    process: subprocess.Popen[str] | None = None
    output: list[str] = field(default_factory=list)
    starter_flow_id: str | None = None
    control_plane_url: str | None = None
    control_plane_key: str = field(default_factory=lambda: secrets.token_urlsafe(18))
    start_seconds: float | None = None
    reuse_idle_seconds: int = 2  # the server's CREATEOS_SANDBOX_REUSE_IDLE_SECONDS
    username: str = SUPERUSER
    password: str = field(default_factory=lambda: secrets.token_urlsafe(16))
    extra_env: dict[str, str] = field(default_factory=dict)  # e.g. EXECUTOR=createos
    _pump: threading.Thread | None = None
    _token: str | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``createos-langflow`` of the server's venv, pointed at its createos-local."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUB)}
        env.update(
            CREATEOS_SANDBOX_BASE_URL=str(self.control_plane_url),
            CREATEOS_SANDBOX_API_KEY=self.control_plane_key,
        )
        command = [str(VENV_LANGFLOW / "bin" / "createos-langflow"), *args]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=False)

    def client(self) -> LangflowClient:
        """A REST client logged in as the superuser (authentication is on)."""
        client = LangflowClient(self.url, timeout=180)
        # One login per server: Langflow rate-limits /api/v1/login per client address (HTTP 429)
        if self._token is None:
            self._token = client.login_with_password(self.username, self.password)
        client.token = self._token
        return client

    def login(self, page: Any) -> None:
        """Langflow's login page, as a user fills it in."""
        page.goto(f"{self.url}/login", timeout=120_000)
        page.fill("#login-username", self.username)
        page.fill('input[type="password"]', self.password)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(lambda url: "/login" not in url, timeout=120_000)

    # -- createos-local's admin API (what LocalControlPlane.sandboxes() reads) -----------------
    def stats(self) -> dict[str, Any]:
        assert self.control_plane_url
        request = urllib.request.Request(
            f"{self.control_plane_url}/_local/stats", headers={"X-Api-Key": self.control_plane_key}
        )
        with urllib.request.urlopen(request, timeout=10) as r:
            return json.loads(r.read())

    def sandboxes(self) -> list[dict[str, Any]]:
        return self.stats()["sandboxes"]

    def live_sandboxes(self) -> list[dict[str, Any]]:
        return [sb for sb in self.sandboxes() if sb["status"] not in ("destroyed", "failed")]

    # -- logs ----------------------------------------------------------------------------------
    def log_tail(self, name: str, lines: int = 80) -> str:
        path = self.run_dir / name
        if not path.exists():
            return f"({path} does not exist)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def report(self) -> str:
        return (
            f"--- make run output ---\n{''.join(self.output)[-6000:]}\n"
            f"--- langflow.log (tail) ---\n{self.log_tail('langflow.log')}\n"
            f"--- createos-local.log (tail) ---\n{self.log_tail('createos-local.log', 40)}"
        )

    # -- lifecycle -----------------------------------------------------------------------------
    def _pid(self, name: str) -> int | None:
        with contextlib.suppress(OSError, ValueError):
            return int((self.run_dir / name).read_text())
        return None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUB)}
        env.update(
            LANGFLOW_PORT=str(self.port),
            CREATEOS_LOCAL_PORT="0",
            CREATEOS_LOCAL_API_KEY=self.control_plane_key,
            RUN_DIR=str(self.run_dir),
            SKIP_INSTALL="1",  # make test built .venv-langflow already
            LANGFLOW_START_TIMEOUT=str(int(START_TIMEOUT)),
            LANGFLOW_CREATE_STARTER_PROJECTS="false",  # Langflow's own ~30 starters: slow, unused
            LANGFLOW_AUTO_LOGIN="false",
            # Langflow allows 5 logins a minute per address; the suite's browser pages, the
            # importer's credential checks and test_policy's second user log in more often
            LANGFLOW_RATE_LIMIT_PER_MINUTE="600",
            LANGFLOW_SUPERUSER=self.username,
            LANGFLOW_SUPERUSER_PASSWORD=self.password,
            DO_NOT_TRACK="true",
            # one log record per line in langflow.log (rich wraps records into columns), so a
            # test can find the executor's per-run line
            LANGFLOW_PRETTY_LOGS="false",
            # Code execution for administrators only: the auto-login superuser runs code as
            # usual, and test_policy.py's ordinary user is refused (Langflow's own gate).
            LANGFLOW_CUSTOM_COMPONENT_ADMIN_ONLY="true",
            # Reused guests paused for more than 2 s are deleted (test_policy.py watches it).
            CREATEOS_SANDBOX_REUSE_IDLE_SECONDS=str(self.reuse_idle_seconds),
        )
        env.update(self.extra_env)
        started = time.monotonic()
        # env --default-signal=INT: pytest may itself run with SIGINT ignored (any `cmd &` from a
        # non-interactive shell), and a bash script cannot trap a signal ignored at its start.
        self.process = subprocess.Popen(
            ["env", "--default-signal=INT", str(ROOT / "scripts" / "run-langflow.sh")],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        ready = threading.Event()

        def pump() -> None:
            assert self.process and self.process.stdout
            for line in self.process.stdout:
                self.output.append(line)
                if m := re.search(r"/flow/([0-9a-f-]{36})", line):
                    self.starter_flow_id = m.group(1)
                if m := re.search(r"Control plane: (http://127\.0\.0\.1:\d+)", line):
                    self.control_plane_url = m.group(1)
                if "Stop: Ctrl-C" in line:
                    ready.set()
            ready.set()

        self._pump = threading.Thread(target=pump, daemon=True)
        self._pump.start()
        if not ready.wait(START_TIMEOUT + 60) or self.process.poll() is not None or not self.starter_flow_id:
            report = self.report()
            self.stop()
            raise RuntimeError(f"make run did not come up:\n{report}")
        self.start_seconds = time.monotonic() - started

    def stop(self, timeout: float = 90.0) -> int | None:
        """Ctrl-C, as a user would; then make sure nothing of ours survives."""
        proc = self.process
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        if self._pump is not None:
            self._pump.join(10)
        # The script puts both servers in their own sessions: kill those groups if it did not.
        for name in ("langflow.pid", "createos-local.pid"):
            pid = self._pid(name)
            if pid and _alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
        return proc.returncode


KEEPER_LINE = re.compile(
    r"the process that created (\d+) guest\(s\) ended without deleting them; deleted (\d+)"
)


def trace_view(client: LangflowClient, flow_id: str, runs: int) -> list[dict[str, Any]]:
    """The flow's traces in Langflow's trace view (oldest first, each with its spans), once
    `runs` of them are there or 60 s have passed: a run's trace is written when its tracers
    end, for a streamed run after its response has ended (in-process as under the executor)."""
    deadline = time.monotonic() + 60
    while True:
        listing = client.request("GET", f"/api/v1/monitor/traces?flow_id={flow_id}&size=50")
        summaries = sorted(listing.get("traces") or [], key=lambda t: t["startTime"])
        if len(summaries) >= runs or time.monotonic() > deadline:
            return [client.request("GET", f"/api/v1/monitor/traces/{t['id']}") for t in summaries]
        time.sleep(0.5)


def _assert_pool_not_left_to_reap(server: LangflowServer, output: str) -> None:
    """The executor's warm pool (lf-xw-) is the plugin's to delete, not make run's reap: the
    gunicorn worker ends through os._exit or SIGQUIT (no atexit), so its pool keeper deletes
    the pooled guests and says so in Langflow's log. Issue 30: they were left to reap."""
    reaped = output.split("deleting every guest the plugin left", 1)[-1]
    deadline = time.monotonic() + 30
    while True:
        log = (server.run_dir / "langflow.log").read_text(errors="replace")
        kept = [(int(a), int(b)) for a, b in KEEPER_LINE.findall(log)]
        if kept:
            assert all(held == deleted for held, deleted in kept), kept
            return
        if "lf-xw-" not in reaped:
            return  # deleted before the worker ended (atexit ran): nothing was left either
        assert time.monotonic() < deadline, f"pooled guests left to make run's reap:\n{reaped[:2000]}"
        time.sleep(0.5)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is not alive; /proc says so.
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    return False


def serve(tag: str = "", **extra_env: str) -> Iterator[LangflowServer]:
    """Start `make run` (with `extra_env`), yield it, then stop it with Ctrl-C and check that
    nothing of it survives."""
    if not (VENV_LANGFLOW / "bin" / "langflow").exists():
        pytest.fail(f"{VENV_LANGFLOW} has no langflow: run `make langflow` (make test does it)")
    run_dir = Path(tempfile.mkdtemp(prefix="lf-e2e-"))
    server = LangflowServer(run_dir=run_dir, port=free_port(), extra_env=extra_env)
    server.start()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / f"langflow-{tag}start-seconds.txt").write_text(f"{server.start_seconds:.1f}\n")
    try:
        yield server
    finally:
        pids = {name: server._pid(name) for name in ("langflow.pid", "createos-local.pid")}
        rc = server.stop()
        output = "".join(server.output)
        (ARTIFACTS / f"make-run-{tag}output.txt").write_text(output)
        survivors = {name: pid for name, pid in pids.items() if pid and _alive(pid)}
        assert rc == 0, f"make run exited {rc} on Ctrl-C (0 after a clean stop):\n{server.report()}"
        assert not survivors, f"still running after Ctrl-C: {survivors}"
        assert "Deleted " in output and "stopping createos-local" in output, output[-3000:]
        assert "nothing is left." in output and "stopped cleanly" in output, output[-3000:]
        if extra_env.get("EXECUTOR") == "createos":
            _assert_pool_not_left_to_reap(server, output)
        shutil.rmtree(run_dir, ignore_errors=True)  # kept (logs, database) when a check above failed


# A model provider of the tests' own (tests/e2e/model_server.py), which every server may call:
# its address is allowed as an endpoint (Langflow's SSRF policy refuses private addresses and
# plain HTTP otherwise), also for a credential held in the server's environment, and the
# servers' environment holds such a credential (what a user without a variable of that name
# falls back on).
MODEL_KEY_VARIABLE = "LF_E2E_MODEL_KEY"
SERVER_MODEL_KEY = "sk-server-" + secrets.token_hex(8)


@pytest.fixture(scope="session")
def model_server() -> Iterator[ModelServer]:
    with ModelServer() as model:
        yield model


def model_env(model: ModelServer) -> dict[str, str]:
    return {
        "LANGFLOW_SSRF_ALLOWED_HOSTS": model.address,
        "LANGFLOW_PROVIDER_CREDENTIAL_ALLOWED_HOSTS": f"http://{model.address}:{model.port}",
        MODEL_KEY_VARIABLE: SERVER_MODEL_KEY,
    }


@pytest.fixture(scope="session")
def langflow_server(model_server: ModelServer) -> Iterator[LangflowServer]:
    yield from serve(**model_env(model_server))


@pytest.fixture(scope="session")
def executor_server(model_server: ModelServer) -> Iterator[LangflowServer]:
    """``make run EXECUTOR=createos``: the same server with the whole-flow executor on."""
    yield from serve("executor-", EXECUTOR="createos", **model_env(model_server))


@pytest.fixture(scope="session")
def executor_reuse_server(model_server: ModelServer) -> Iterator[LangflowServer]:
    """The executor's server with reused guests per trust domain (CREATEOS_EXECUTOR_REUSE)."""
    yield from serve(
        "executor-reuse-", EXECUTOR="createos", CREATEOS_EXECUTOR_REUSE="true", **model_env(model_server)
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    for name in ("langflow_server", "executor_server", "executor_reuse_server"):
        server = getattr(item, "funcargs", {}).get(name)
        if report.failed and isinstance(server, LangflowServer):
            report.sections.append((f"make run / Langflow logs ({name})", server.report()))
