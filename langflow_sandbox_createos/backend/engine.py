"""The ``createos`` sandbox backend: lfx's Python Interpreter code runs on a throwaway microVM.

Enabled only with ``LANGFLOW_SANDBOX_BACKEND_PLUGINS=createos`` and
``LANGFLOW_SANDBOX_BACKEND=createos``; lfx loads :func:`create_backend` through the
``lfx.sandbox_backends`` entry point. Importing this module and building the backend do
no I/O and read no settings: lfx imports plugins while it is still building its own
settings, and every setting is re-read on each run so a changed key or URL takes effect.

One run is, after the first: its slot in the backend's admission line, its guest created
(``lease.Lease.create``: held by the guest keeper at once), then one native call
(``run_program``) that adopts the guest, runs one streaming exec whose stdin is the program
and whose shell writes it under ``/workspace`` and runs it under the guest's own ``timeout``,
and queues the guest's delete on the native client's I/O thread, off the critical path. With
``CREATEOS_SANDBOX_WARM_POOL=N`` the guest comes from a pool booted ahead of need
(:mod:`warm_pool`), so the critical path is the exec alone. Either way the guest is held from
its create until its delete is reported done (``lease.collect_deletes``), so a process killed
mid-run leaves it to the keeper instead of the control plane.
"""

from __future__ import annotations

import functools
import logging
import secrets
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from lfx.utils.sandbox.base import (
    Capabilities,
    SandboxExecutionError,
    SandboxResult,
    SandboxUnavailableError,
)

from langflow_sandbox_createos.core import (
    budget,
    connection,
    failures,
    guest_spec,
    lease,
    network,
    program_clock,
    settings,
    shape_catalog,
    warm_pool,
)
from langflow_sandbox_createos.core.native import load_native
from langflow_sandbox_createos.core.settings import BackendSettings, SettingsError

if TYPE_CHECKING:
    from langflow_sandbox_createos._createos import ExecResult

logger = logging.getLogger("langflow_sandbox_createos.backend")

BACKEND_NAME = "createos"
NAME_PREFIX = "lf-"

# lfx's timeout exit code (lfx.utils.sandbox.base._EXIT_CODE_TIMEOUT, a private name).
EXIT_CODE_TIMEOUT = -1
GUEST_TIMEOUT_STATUS = program_clock.GUEST_TIMEOUT_STATUS

STDIN_PROGRAM_MAX_BYTES = guest_spec.STDIN_PROGRAM_MAX_BYTES  # programs up to this travel on stdin

# shutdown() waits at most this long for queued background deletes.
SHUTDOWN_DRAIN_SECONDS = 10.0

WORKSPACE = "/workspace"

# The guest shell's timing line on stderr (program_clock), re-exported for tests.
TRAILER_PREFIX = program_clock.TRAILER_PREFIX
split_trailer = program_clock.split_trailer


def create_backend() -> CreateOSBackend:
    """The zero-argument factory named by the entry point. No I/O, no settings."""
    return CreateOSBackend()


class CreateOSBackend:
    """lfx ``SandboxBackend``: one fresh CreateOS guest per execution, always deleted.

    A process-wide singleton called from arbitrary threads. The shared state (one native
    client per endpoint, the whoami latch and the shape catalog) lives in
    :data:`connection.endpoints`, which the other surfaces share, so this class holds only the
    lock that serializes its shutdown.
    """

    name = BACKEND_NAME

    def __init__(self) -> None:
        # Serializes shutdown(): two concurrent calls would race for the same outcomes.
        self._lock = threading.Lock()
        # CREATEOS_SANDBOX_WARM_POOL > 0: guests booted ahead of need (core/warm_pool.py). Per
        # instance, so shutting down the loser of a construction race leaves the winner's alone.
        self._pool = warm_pool.WarmPool(random_name=guest_spec.random_name)
        # The last run's guest spec, shape and budget, reused while what they are made from holds.
        self._plan: _Plan | None = None

    def __repr__(self) -> str:
        return f"<CreateOSBackend name={self.name!r}>"

    # --- protocol ------------------------------------------------------------------------

    def capabilities(self) -> Capabilities:
        """What this backend enforces; lfx's dispatcher decides whether that is enough.

        The isolation of the control plane in use (see `_reported_isolation`); no domain allowlist (CreateOS stores hostname rules without
        enforcing them); at most MAX_TIMEOUT_SECONDS per run. Deny-all egress only once
        LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS=true: the deny-all rule leaves
        169.254.0.0/16 reachable, so without that acknowledgement "off" is not enforced
        and lfx refuses egress-off runs itself. Reads one environment variable, no I/O.
        """
        return Capabilities(
            isolation=_reported_isolation(),
            supports_deny_all_egress=_deny_all_acknowledged(),
            supports_domain_allowlist=False,
            max_timeout_seconds=settings.MAX_TIMEOUT_SECONDS,
        )

    def run(
        self,
        code: str,
        *,
        env: Mapping[str, str] | None = None,
        session: object | None = None,
        **_ignored: object,
    ) -> SandboxResult:
        """Run ``code`` on a fresh guest. ``session`` (older lfx builds) is ignored: the
        protocol cannot return a reused guest, so every run gets its own."""
        del session
        config = _read_settings()
        if config.allowed_domains:
            raise network.domains_refusal(config.allowed_domains)
        network.egress_gate(config.allow_network, config.accept_egress_exceptions)
        refusal = guest_spec.nul_refusal(code, "The program")
        if refusal:
            raise SandboxExecutionError(f"CreateOS: {refusal}")
        guest_env = _guest_env(env)

        endpoint = connection.endpoints.get()
        _preflight(endpoint)
        _isolation_gate(endpoint)
        plan = self._plan_for(endpoint, config, guest_env)
        program = _Program.build(code, config.timeout_seconds)
        started = time.monotonic()
        with lease.BACKEND.slot(config.max_guests, config.max_wait_seconds):
            try:
                with failures.native_errors("run the program on a CreateOS guest"):
                    result = self._run_on_a_guest(endpoint, plan, program, config, guest_env)
            finally:
                lease.collect_deletes(endpoint.client, 0.0, logger)
        logger.debug(
            "createos run on %s (%s) finished in %.0f ms wall, exit %s",
            result.sandbox_id,
            plan.shape,
            (time.monotonic() - started) * 1000,
            result.exit_code,
        )
        return _to_sandbox_result(result, config)

    def _run_on_a_guest(
        self,
        endpoint: connection.Endpoint,
        plan: _Plan,
        program: _Program,
        config: BackendSettings,
        guest_env: dict[str, str],
    ) -> ExecResult:
        """The program on a pooled guest when one is ready, else on a fresh one: staged, run
        and its guest deleted in the background, in one native call."""
        options: dict[str, Any] = {
            "files": program.files,
            "stdin": program.stdin,
            "timeout": plan.exec_timeout,
            "max_output_bytes": config.max_output_bytes,
        }
        argv = ["-c", program.script]
        if config.warm_pool:
            warm = self._pool.take(plan.pool_key, endpoint, config.warm_pool)
            if warm is not None:
                # One round trip: the exec on a booted guest (deleted in the background after).
                # A guest that was paused, deleted or died answers 404/409 before anything runs,
                # so falling back to one fresh create cannot run the program twice.
                native = load_native()
                try:
                    return warm.run_program("/bin/sh", argv, env=guest_env or None, **options)
                except (native.NotFoundError, native.ConflictError):
                    self._pool.note_stale(plan.pool_key, warm.sandbox_id)
        cold = lease.Lease.create(endpoint, plan.guest, guest_spec.random_name(NAME_PREFIX))
        return cold.run_program("/bin/sh", argv, **options)

    def _plan_for(
        self, endpoint: connection.Endpoint, config: BackendSettings, guest_env: dict[str, str]
    ) -> _Plan:
        """The guest spec, shape and exec budget of a run: the last run's when nothing they
        are made from changed (the settings, the endpoint and its shape catalog, the env),
        else built anew."""
        plan = self._plan
        if plan is not None and plan.fits(endpoint, config, guest_env):
            return plan
        plan = _Plan.build(endpoint, config, guest_env)
        self._plan = plan
        return plan

    def shutdown(self) -> None:
        """Wait up to SHUTDOWN_DRAIN_SECONDS for queued deletes and log each outcome.

        Closes nothing: the native clients are shared with the other surfaces through
        connection.endpoints, and a second backend instance (lfx shuts down the loser of a
        construction race) must not break the one that won. Safe to call repeatedly.
        """
        with self._lock:
            self._pool.shutdown()
            self._drain_all()

    def _drain_all(self) -> None:
        for base_url, left in lease.drain_deletes(SHUTDOWN_DRAIN_SECONDS, logger).items():
            logger.warning(
                "CreateOS: %d guest delete(s) still pending at shutdown on %s; auto-pause bounds "
                "their cost. Delete leftover lf-* sandboxes if the process exits now.",
                left,
                base_url,
            )

    def reset_after_fork(self) -> None:
        """In a forked child: fresh lock, forget state. The parent's clients (sockets and
        I/O thread) are forgotten by connection.endpoints' own fork hook, never closed."""
        self._lock = threading.Lock()
        self._plan = None  # it names the parent's endpoint
        self._pool.forget_after_fork()  # the parent's pooled guests stay the parent's


# --- one run, step by step -----------------------------------------------------------------


def _deny_all_acknowledged() -> bool:
    """LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS, with an unreadable value read as
    not acknowledged (fail closed: run() then reports the malformed setting itself)."""
    try:
        return settings.accept_egress_exceptions()
    except SettingsError:
        return False


def _read_settings() -> BackendSettings:
    """The backend's settings, parsed again only when one of its variables changed. A
    malformed one fails closed as failures.refusing_bad_settings() makes it fail, without
    the context manager's cost on every run (issue 45)."""
    try:
        return settings.current_backend_settings()
    except SettingsError as exc:
        raise SandboxUnavailableError(str(exc)) from None


class _Plan:
    """What a run's guest is made from, and its exec budget: the same for every run with the
    same settings, endpoint (and its shape catalog) and env, so it is built once for them."""

    __slots__ = ("config", "endpoint", "env", "exec_timeout", "guest", "pool_key", "shape", "shapes")

    def __init__(
        self,
        endpoint: connection.Endpoint,
        config: BackendSettings,
        env: dict[str, str],
        shapes: tuple[tuple[int, str], ...],
    ) -> None:
        self.endpoint = endpoint
        self.config = config
        self.env = env
        self.shapes = shapes
        self.shape = shape_catalog.pick_shape(shapes, config.memory_mb, config.shape)
        time_budget = budget.backend(config.timeout_seconds)
        self.guest = guest_spec.GuestSpec.of(
            endpoint,
            shape=self.shape,
            rootfs=config.rootfs,
            egress=network.egress_rules(config.allow_network),
            budget=time_budget,
            envs=env,
        )
        self.pool_key = self.guest.env_at_exec()
        self.exec_timeout = time_budget.exec_timeout()

    @classmethod
    def build(cls, endpoint: connection.Endpoint, config: BackendSettings, env: dict[str, str]) -> _Plan:
        return cls(endpoint, config, dict(env), shape_catalog.catalog(endpoint))

    def fits(self, endpoint: connection.Endpoint, config: BackendSettings, env: dict[str, str]) -> bool:
        return (
            endpoint is self.endpoint
            and endpoint.shapes is self.shapes
            and (config is self.config or config == self.config)
            and env == self.env
        )


def _guest_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """The caller's env, declared at create: the control plane refuses exec-time env keys
    that the guest was not created with."""
    if not env:
        return {}
    out: dict[str, str] = {}
    for key, value in env.items():
        if not isinstance(key, str) or not key or "=" in key or "\0" in key:
            raise SandboxExecutionError(f"CreateOS: {key!r} cannot be an environment variable name.")
        text = value if isinstance(value, str) else str(value)
        refusal = guest_spec.nul_refusal(text, f"The value of environment variable {key}")
        if refusal:
            raise SandboxExecutionError(f"CreateOS: {refusal}")
        out[key] = text
    return out


HARDWARE = "hardware-virtualized"
ACCEPT_LOCAL_ISOLATION = "CREATEOS_SANDBOX_ACCEPT_LOCAL_ISOLATION"


# read on every run against a control plane without hardware isolation: parsed once per
# change of the variable (issue 45: per-run Python)
_local_isolation_memo = settings.EnvMemo((ACCEPT_LOCAL_ISOLATION,), settings.accept_local_isolation)


def _local_acknowledged() -> bool:
    try:
        return _local_isolation_memo.get()
    except SettingsError:
        return False  # run() reports the malformed setting (a raising parse is not remembered)


def _reported_isolation() -> str:
    """What this backend tells lfx: the truth about the control plane in use, learnt from its
    whoami (no I/O here). CreateOS runs microVMs: hardware-virtualized. createos-local runs
    namespaces on a shared kernel and says so: that is reported (lfx then refuses, quoting
    it, with the setting that accepts it), unless CREATEOS_SANDBOX_ACCEPT_LOCAL_ISOLATION=true
    accepts it for tests and demos. Before the first whoami of an endpoint nothing is known:
    run() asks first and refuses itself (`_isolation_gate`)."""
    try:
        endpoint = connection.endpoints.get()
    except SandboxUnavailableError:
        return HARDWARE  # run() refuses the settings anyway
    isolation = endpoint.isolation
    if isolation is None or isolation == HARDWARE or _local_acknowledged():
        return HARDWARE
    return (
        f"{isolation} (the control plane at {endpoint.base_url} runs guests with {isolation!r} isolation "
        f"on a shared kernel, not microVMs; {ACCEPT_LOCAL_ISOLATION}=true accepts it for tests and demos)"
    )


def _isolation_gate(endpoint: connection.Endpoint) -> None:
    if endpoint.isolation in (None, HARDWARE) or _local_acknowledged():
        return
    raise SandboxUnavailableError(
        f"CreateOS: the control plane at {endpoint.base_url} runs guests with {endpoint.isolation!r} isolation "
        f"on a shared kernel (createos-local), not hardware-virtualized microVMs, which lfx's sandbox mode "
        f"assumes. Point CREATEOS_SANDBOX_BASE_URL at CreateOS, or set {ACCEPT_LOCAL_ISOLATION}=true to "
        "accept it (tests and demos: make run sets it)."
    )


def _preflight(endpoint: connection.Endpoint) -> None:
    """GET /v1/whoami once per endpoint (a new key or base URL is a new endpoint)."""
    if endpoint.preflight_ok:
        return
    with endpoint.lock:
        if endpoint.preflight_ok:
            return
        with failures.native_errors(
            "verify the API key (GET /v1/whoami)", refine=lambda exc: _preflight_refusal(endpoint, exc)
        ):
            who = endpoint.client.whoami()
        endpoint.isolation = connection.plane_isolation(who)
        endpoint.preflight_ok = True


def _preflight_refusal(endpoint: connection.Endpoint, exc: BaseException) -> BaseException | None:
    """A whoami that never reached a control plane, or reached something else: said so."""
    native = load_native()
    if isinstance(exc, native.TransientError) and exc.status is None:
        return SandboxUnavailableError(
            f"CreateOS control plane at {endpoint.base_url} is unreachable ({exc}). "
            "Check CREATEOS_SANDBOX_BASE_URL and the network."
        )
    if isinstance(exc, native.ProtocolError):
        return SandboxUnavailableError(
            f"{endpoint.base_url} did not answer like a CreateOS control plane ({exc}). "
            "Check CREATEOS_SANDBOX_BASE_URL."
        )
    return None


class _Program:
    """The guest command for one program: where it lives and how it gets there."""

    __slots__ = ("files", "path", "script", "stdin")

    def __init__(self, path: str, script: str, stdin: str | None, files: list[tuple[str, bytes]]) -> None:
        self.path = path
        self.script = script
        self.stdin = stdin
        self.files = files

    @classmethod
    def build(cls, code: str, timeout_seconds: int) -> _Program:
        path = f"{WORKSPACE}/main_{secrets.token_hex(6)}.py"
        try:
            data = code.encode("utf-8")
        except UnicodeEncodeError:
            # Lone surrogates cannot travel in a JSON string; upload the bytes and let the
            # guest's python3 report the invalid source exactly as it would locally.
            data = code.encode("utf-8", "surrogatepass")
            inline = False
        else:
            inline = len(data) <= STDIN_PROGRAM_MAX_BYTES
        run = run_script(path, timeout_seconds)
        if inline:
            # `[ -d ]` is a builtin: mkdir (a process) only runs when the directory is missing.
            script = f"{{ [ -d {WORKSPACE} ] || mkdir -p {WORKSPACE}; }} && cat > {path} || exit $?\n{run}"
            return cls(path, script, code, [])
        return cls(path, run, None, [(path, data)])


def run_script(path: str, timeout_seconds: int) -> str:
    """Run ``path`` under the guest's own ``timeout --signal=KILL``, reporting a timeout as 124.

    GNU timeout exits 137, not 124, when the signal it sent was KILL (it reports the forced
    kill on purpose), which would read as an out-of-memory kill. So the shell reports 124
    when the program died of SIGKILL at or past the deadline (``program_clock.sh_timeout_status``,
    the check the component's wrapper makes too).

    The streaming exec protocol carries no ``exec_ms``, so the shell also measures the
    program's own time and appends it to stderr as one trailer line (see
    :func:`split_trailer`).

    Both use ``/proc/uptime`` (centiseconds) read by the shell's ``read`` builtin, so no
    process starts besides ``cat``, ``timeout`` and ``python3``: every extra process is on
    the critical path of a run (the four ``date`` calls and the ``mkdir`` this replaced cost
    ~9 ms per run on createos-local, paired median; benchmarks/breakdown.py and
    docs/performance.md). Truncation to centiseconds
    keeps ``c >= 100 N - 1`` whenever the program ran N s. Without a readable
    ``/proc/uptime`` the shell falls back to ``date +%s`` for the timeout check and sends
    no trailer.

    ``python3 -u`` keeps output printed before a kill instead of losing it in a buffer.
    """
    head, tail = _run_script_parts(int(timeout_seconds))
    return f"{head}{path}{tail}"


@functools.lru_cache(maxsize=16)
def _run_script_parts(n: int) -> tuple[str, str]:
    """run_script's text before and after the program's path: the same for every run with
    the same timeout, so it is built once per timeout (issue 45: per-run Python)."""
    return (
        # The shell's own stderr goes to /dev/null (fd 3 keeps the real one): when timeout
        # is SIGKILLed, sh prints "Killed" on its stderr, which would reach the program's.
        "exec 3>&2 2>/dev/null\n"
        + program_clock.SH_START
        # Redirect inside the subshell, so the parent still has /dev/null while it waits.
        + f"(exec 2>&3 3>&-; exec timeout --signal=KILL {n} python3 -u ",
        ")\n"
        + "r=$?\n"
        + program_clock.sh_stop(3)
        + program_clock.sh_timeout_status("r", str(n))
        + 'exit "$r"\n',
    )


def _to_sandbox_result(result: ExecResult, config: BackendSettings) -> SandboxResult:
    if result.error:
        raise SandboxExecutionError(
            f"CreateOS: the guest {result.sandbox_id or ''} could not start the program: {result.error}. "
            f"Check that CREATEOS_SANDBOX_ROOTFS={config.rootfs!r} provides /bin/sh, timeout and python3."
        )
    done = lease.finished(result)
    stderr = done.stderr
    notes = [
        f"[createos: {stream} truncated at {_size(config.max_output_bytes)}; "
        "set CREATEOS_SANDBOX_MAX_OUTPUT_BYTES]"
        for stream, cut in (("stdout", done.stdout_truncated), ("stderr", done.stderr_truncated))
        if cut
    ]
    if done.host_timed_out:
        notes.append(
            f"[createos: no exit status within {config.timeout_seconds}s + {budget.BACKEND_GRACE_SECONDS:g}s grace; "
            "output is what arrived before the deadline]"
        )
        exit_code = EXIT_CODE_TIMEOUT
    elif done.guest_timed_out:
        exit_code = EXIT_CODE_TIMEOUT
    elif done.exit_code < 0:  # a signal reported as its negative number
        exit_code = 128 - done.exit_code
    else:
        exit_code = done.exit_code
    if notes:
        joined = "\n".join(notes)
        stderr = f"{stderr}\n{joined}\n" if stderr and not stderr.endswith("\n") else f"{stderr}{joined}\n"
    # The service's exec_ms when it sent one (buffered exec); otherwise the guest's own count.
    return SandboxResult(
        stdout=done.stdout,
        stderr=stderr,
        exit_code=exit_code,
        execution_time_ms=None if done.exec_ms is None else int(done.exec_ms),
    )


def _size(n: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} bytes"
