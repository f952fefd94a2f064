"""The guest lease: one guest's life, for every surface and both warm pools, written once.

A run (the sandbox backend's, the CreateOS Sandbox component's, the executor's) and a warm
pool's refill go through the same steps, here and nowhere else:

1. **Admission** (:class:`Admission`): a slot of the surface's line (``core/admission.py``),
   at most N guests in flight per process and surface. A run that has to wait says so once,
   in the log and on the surface's own channel (the component's status, the executor's
   events), and gives up with ``SandboxUnavailableError`` past its wait, before any guest
   exists for it. A warm pool's refill takes a spare slot only (:meth:`Admission.gate`).
2. **The guest** (:class:`Lease`): created and held in the guest keeper at once
   (:meth:`Lease.create`; a create whose answer was lost is looked up by its unique name and
   deleted), or handed over by a warm pool (the lease its refill created). A kept guest (the
   component's Guest Reuse) is leased unheld: it outlives the process on purpose, shared by
   other workers, and the keeper must not take it away.
3. **Staging and the run**: :meth:`Lease.stage` uploads files, :meth:`Lease.exec` runs one
   exec; :meth:`Lease.run_program` does both in C in one call and deletes the guest in the
   background.
4. **The result** (:func:`finished`): the guest shell's clock trailer taken off stderr, and the
   program's timeout inside the guest read from its exit status (124: the shell counts a KILL
   at or past the deadline as one, ``program_clock.sh_timeout_status``).
5. **The end**: :meth:`Lease.end` deletes the guest once and releases it from the keeper when
   it is gone (a failed delete leaves it held: the keeper tries again when the process ends);
   :meth:`Lease.end_soon` does it in a thread, off the caller's path (interpreter exit waits a
   little for those); run_program's background delete is released once
   :func:`collect_deletes` reads its outcome.

A lease is handed on, never shared: a pool hands the lease its refill created to the run that
takes it, and whoever holds a lease last ends it. A lease may so be held across runs (a holder
that keeps its guest for the next run does not end it), and only this module talks to the
keeper (``core/pool_keeper.py``) and to the admission lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from lfx.utils.sandbox.base import SandboxExecutionError, SandboxUnavailableError

from langflow_sandbox_createos.core import admission, connection, failures, hooks, pool_keeper, program_clock
from langflow_sandbox_createos.core.native import load_native

if TYPE_CHECKING:
    from langflow_sandbox_createos._createos import Client, ExecResult
    from langflow_sandbox_createos.core.guest_spec import GuestSpec

logger = logging.getLogger("langflow_sandbox_createos")

Tell = Callable[[str], None]
_L = TypeVar("_L", admission.SyncLine, admission.Line)


# --- admission ---------------------------------------------------------------------------------


class Slot:
    """An admitted run's place in its surface's line, given back once (:meth:`leave`)."""

    def __init__(self, line: admission.Line) -> None:
        self._line = line
        self._lock = threading.Lock()
        self._left = False
        self._taken = time.monotonic()

    def leave(self) -> None:
        with self._lock:
            if self._left:
                return
            self._left = True
        # How long a run holds its slot is the line's estimate of the wait (load shedding).
        self._line.observe_hold(time.monotonic() - self._taken)
        self._line.leave()


@dataclass(frozen=True)
class Admission:
    """One surface's admission: its line, what a run says while it waits (``waiting``, with
    ``{in_flight}``, ``{ahead}`` and ``{limit}``; logged through ``logged``), and the refusal of
    a run that waited too long (``what`` gave up; the two settings that would change it)."""

    line: admission.SyncLine | admission.Line
    log: logging.Logger
    what: str
    limit_setting: str
    wait_setting: str
    waiting: str
    logged: str = "%s"

    def _announce(self, limit: int, tell: Tell | None, ahead: int, in_flight: int) -> None:
        text = self.waiting.format(in_flight=in_flight, ahead=ahead, limit=limit)
        self.log.info(self.logged, text)
        if tell is not None:
            tell(text)

    def _refuse(self, exc: admission.WaitedTooLong, limit: int, subject: str | None) -> NoReturn:
        """Raise the ``SandboxUnavailableError`` of a refused run, chained from the
        :class:`failures.CapacityError` Langflow's run API answers with (503, retryable,
        ``retry_after`` the line's estimate of the wait)."""
        text = admission.gave_up_text(self.what, exc, self.limit_setting, limit, self.wait_setting)
        if subject is not None:
            self.log.warning("%s (%s)", text, subject)
        retry_after = None if exc.expected is None else float(max(1, math.ceil(exc.expected)))
        later = f"retry in about {retry_after:g} s" if retry_after is not None else "retry later"
        hint = (
            f"CreateOS: every guest slot is taken ({self.limit_setting}={limit}); {later}, or raise "
            f"{self.limit_setting} or {self.wait_setting}."
        )
        raise SandboxUnavailableError(text) from failures.CapacityError(
            text, hint=hint, retry_after=retry_after
        )

    @contextlib.contextmanager
    def slot(self, limit: int, max_wait: float | None, tell: Tell | None = None) -> Iterator[None]:
        """Hold a slot for the body (a blocking surface's run, in a worker thread)."""
        line = self._line(admission.SyncLine)
        try:
            line.enter(
                limit, lambda ahead, in_flight: self._announce(limit, tell, ahead, in_flight), max_wait
            )
        except admission.WaitedTooLong as exc:
            self._refuse(exc, limit, None)
        taken = time.monotonic()
        try:
            yield
        finally:
            line.observe_hold(time.monotonic() - taken)
            line.leave()

    async def enter(
        self,
        limit: int,
        max_wait: float | None,
        *,
        tell: Tell | None = None,
        subject: str | None = None,
        quiet_cancel: bool = False,
    ) -> Slot:
        """A slot for an async run, left with :meth:`Slot.leave` (the executor's, once its
        guest's delete returned); ``subject`` names the run in the warning of a refusal.
        ``quiet_cancel``: a cancelled wait is not logged (the run was served another way)."""
        line = self._line(admission.Line)
        try:
            await line.enter(
                limit, lambda ahead, in_flight: self._announce(limit, tell, ahead, in_flight), max_wait
            )
        except admission.WaitedTooLong as exc:
            self._refuse(exc, limit, subject)
        except asyncio.CancelledError:
            # Langflow cancels a streaming run whose caller went away: it leaves the line
            # (admission.Line.enter) and never takes a guest.
            if not quiet_cancel:
                self.log.info(
                    "%s left the line before its turn: cancelled (%s)", self.what, subject or "a run"
                )
            raise
        return Slot(line)

    def gate(self, limit_of: Callable[[GuestSpec], int]) -> _Gate:
        """This line as a warm pool's gate (``warm_pool.Gate``): a refill is one more run in
        flight, and starts only on a spare slot."""
        return _Gate(self._line(admission.Line), limit_of)

    def _line(self, kind: type[_L]) -> _L:
        """This surface's line, which must be of ``kind`` (a blocking surface's, or an async one's)."""
        if not isinstance(self.line, kind):
            raise TypeError(
                f"the {self.line.name} line is a {type(self.line).__name__}, not a {kind.__name__}"
            )
        return self.line


class _Gate:
    def __init__(self, line: admission.Line, limit_of: Callable[[GuestSpec], int]) -> None:
        self._line = line
        self._limit_of = limit_of

    def try_enter(self, key: GuestSpec) -> bool:
        return self._line.try_enter_spare(self._limit_of(key))

    def has_spare(self, key: GuestSpec) -> bool:
        return self._line.has_spare(self._limit_of(key))

    def leave(self) -> None:
        self._line.leave()

    def when_spare(self, callback: Callable[[], None]) -> None:
        self._line.when_spare(callback)


# The settings that bound a line (its limit; how long a run may wait in it): the backend and the
# component share theirs.
_SANDBOX_SETTINGS = ("CREATEOS_SANDBOX_MAX_GUESTS", "CREATEOS_SANDBOX_MAX_WAIT_SECONDS")
_EXECUTOR_SETTINGS = ("CREATEOS_EXECUTOR_MAX_GUESTS", "CREATEOS_EXECUTOR_MAX_WAIT_SECONDS")
BACKEND = Admission(
    admission.backend_line,
    logging.getLogger("langflow_sandbox_createos.backend"),
    "CreateOS: this sandbox run",
    *_SANDBOX_SETTINGS,
    waiting="CreateOS: {in_flight} sandbox run(s) in flight, the limit (CREATEOS_SANDBOX_MAX_GUESTS); "
    "this run waits in line behind {ahead} other(s)",
)
COMPONENT = Admission(
    admission.component_line,
    logging.getLogger("langflow_sandbox_createos.component"),
    "CreateOS Sandbox: this run",
    *_SANDBOX_SETTINGS,
    waiting="{in_flight} CreateOS Sandbox run(s) in flight, the limit (CREATEOS_SANDBOX_MAX_GUESTS={limit}); "
    "waiting in line behind {ahead} other(s)…",
    logged="CreateOS Sandbox: %s",
)
EXECUTOR = Admission(
    admission.executor_line,
    logging.getLogger("langflow_sandbox_createos.executor"),
    "CreateOS executor: this run",
    *_EXECUTOR_SETTINGS,
    waiting="CreateOS executor: {in_flight} run(s) in flight, the limit (CREATEOS_EXECUTOR_MAX_GUESTS={limit}); "
    "this run waits in line behind {ahead} other(s)",
)


# --- the guest ---------------------------------------------------------------------------------


class Lease:
    """One guest of this process, from its create (or a pool's hand-over) to its delete.

    ``held``: the guest keeper deletes it if the process ends first (every guest a run or a
    pool creates; not a kept one). ``view``: what the control plane answered at create (None
    for a guest found or handed over). Its end happens once, whoever asks for it first."""

    def __init__(
        self, endpoint: connection.Endpoint, sandbox_id: str, *, held: bool, view: Any = None
    ) -> None:
        self.endpoint = endpoint
        self.sandbox_id = sandbox_id
        self.held = held
        self.view = view
        self._lock = threading.Lock()
        self._ended = False

    def __repr__(self) -> str:
        return f"<Lease {self.sandbox_id}{' held' if self.held else ''}{' ended' if self.ended else ''}>"

    @property
    def client(self) -> Client:
        return self.endpoint.client

    @property
    def ended(self) -> bool:
        with self._lock:
            return self._ended

    @classmethod
    def create(
        cls, endpoint: connection.Endpoint, guest: GuestSpec, name: str, *, kept: bool = False
    ) -> Lease:
        """Create a guest named ``name`` and hold it at once (a ``kept`` one is not held, and
        a lost answer is not chased: its stable name finds it again). Raises the native
        error; a create whose answer was lost is looked up by its name and deleted first."""
        native = load_native()
        try:
            view = endpoint.client.create(guest.create_request(name))
        except native.CreateOSError as exc:
            if not kept:
                _reap_lost_create(endpoint.client, name, exc)
            raise
        sandbox_id = view.get("id") if isinstance(view, dict) else None
        if not isinstance(sandbox_id, str):
            raise SandboxExecutionError(f"CreateOS: create answered without a sandbox id: {view!r}")
        if not kept:
            pool_keeper.hold(endpoint, sandbox_id)  # from now until its delete
        return cls(endpoint, sandbox_id, held=not kept, view=view)

    @classmethod
    def kept(cls, endpoint: connection.Endpoint, sandbox_id: str) -> Lease:
        """An existing guest this process does not hold (a reused one it found by name)."""
        return cls(endpoint, sandbox_id, held=False)

    # -- staging and the run ------------------------------------------------------------------
    def upload(self, path: str, data: bytes) -> None:
        self.client.upload(self.sandbox_id, path, data)

    def download(self, path: str, max_bytes: int) -> bytes:
        return self.client.download(self.sandbox_id, path, max_bytes=max_bytes)

    def stage(self, files: Sequence[tuple[str, bytes]]) -> None:
        """Upload the run's files before its exec."""
        for path, data in files:
            self.upload(path, data)

    def exec(self, cmd: str, args: Sequence[str], **options: Any) -> ExecResult:
        """One exec on the guest (``options``: the native client's exec keywords)."""
        return self.client.exec(self.sandbox_id, cmd, args, **options)

    def run_program(self, cmd: str, args: Sequence[str], **options: Any) -> ExecResult:
        """Stage ``files``, run one streaming exec and delete the guest, in C with the GIL
        released: the whole run in one call. The delete is queued in the background; the guest
        stays held until :func:`collect_deletes` reads that it is gone. The lease ends here."""
        with self._lock:
            self._ended = True
        return self.client.run_program(
            {}, cmd, args, sandbox_id=self.sandbox_id, delete="background", **options
        )

    # -- the end --------------------------------------------------------------------------------
    def delete(self) -> None:
        """Delete the guest now; released from the keeper once it is gone (deleted, or 404). Any
        other failure raises, and the guest stays held."""
        pool_keeper.delete(self.client, self.sandbox_id)

    def end(self, failed: Callable[[BaseException], None]) -> bool:
        """Delete the guest unless the lease ended already; True when it was deleted now. A
        failed delete goes to ``failed`` (and the guest stays held, for the keeper)."""
        with self._lock:
            if self._ended:
                return False
            self._ended = True
        try:
            self.delete()
        except Exception as exc:
            failed(exc)
            return False
        return True

    def end_soon(
        self,
        failed: Callable[[BaseException], None],
        *,
        then: Callable[[], None] | None = None,
        deleted: Callable[[], None] | None = None,
    ) -> None:
        """:meth:`end` in a thread of its own, off the caller's path: ``deleted`` runs once the
        guest is gone, ``then`` once the delete returned, however it went. Interpreter exit
        waits a little for such threads (:func:`wait_for_deletes`)."""

        def work() -> None:
            try:
                if self.end(failed) and deleted is not None:
                    deleted()
            finally:
                _deleting.discard(threading.current_thread())
                if then is not None:
                    then()

        worker = threading.Thread(target=work, name="createos-guest-delete", daemon=True)
        with _deleting_lock:
            _deleting.add(worker)
            try:
                worker.start()
            except RuntimeError:  # interpreter shutdown: no new threads; the guest keeper deletes it
                _deleting.discard(worker)
                raise


# Guest deletes still running in their threads (a run does not wait for its guest's delete).
_deleting: set[threading.Thread] = set()
# Held while a delete thread is added and started, and while wait_for_deletes takes its list:
# so that list never holds a thread not yet started (join() refuses one).
_deleting_lock = threading.Lock()
# How long interpreter exit waits for them (what is left is the guest keeper's).
EXIT_WAIT_SECONDS = 5.0


def wait_for_deletes(timeout: float = EXIT_WAIT_SECONDS) -> None:
    """Wait up to ``timeout`` s for the guest deletes still running in their threads. At
    interpreter exit it gives them a moment (a short `lfx run` ends right after its run); what
    is left is the guest keeper's. Tests call it before they look at what a run left."""
    deadline = time.monotonic() + timeout
    with _deleting_lock:
        workers = list(_deleting)
    for worker in workers:
        worker.join(max(0.0, deadline - time.monotonic()))


def _forget_deletes_after_fork() -> None:
    global _deleting_lock
    _deleting_lock = threading.Lock()  # a parent's thread may have held it at the fork
    _deleting.clear()  # the parent's threads are not ours


hooks.at_exit("guest deletes", wait_for_deletes)
hooks.after_fork("guest deletes", _forget_deletes_after_fork)


# --- the result ----------------------------------------------------------------------------------

GUEST_TIMEOUT_STATUS = program_clock.GUEST_TIMEOUT_STATUS


@dataclass(frozen=True)
class Finished:
    """An exec's result as the guest shell reports it: ``stderr`` without the shell's clock
    trailer; ``exec_ms`` the service's count, else the shell's own; ``guest_timed_out`` when
    the program was killed at its deadline inside the guest; ``host_timed_out`` when no exit
    status came within the host's deadline (``exit_code`` then means nothing)."""

    stdout: str
    stderr: str
    exit_code: int
    start_error: str | None
    exec_ms: float | None
    guest_timed_out: bool
    host_timed_out: bool
    stdout_truncated: bool
    stderr_truncated: bool


def finished(result: ExecResult) -> Finished:
    stderr, program_ms = program_clock.split_trailer(result.stderr)
    if result.stderr_truncated:
        stderr = program_clock.strip_cut_trailer(stderr)
    return Finished(
        stdout=result.stdout,
        stderr=stderr,
        exit_code=int(result.exit_code),
        start_error=result.error or None,
        exec_ms=result.exec_ms if result.exec_ms is not None else program_ms,
        guest_timed_out=result.exit_code == GUEST_TIMEOUT_STATUS,
        host_timed_out=bool(result.timed_out),
        stdout_truncated=bool(result.stdout_truncated),
        stderr_truncated=bool(result.stderr_truncated),
    )


# --- guests whose create or delete did not go as planned --------------------------------------


def _create_may_have_landed(exc: BaseException) -> bool:
    """Whether a failed create may still have made its guest: its answer was lost (deadline,
    reset, cut or garbled body) or was a 5xx from somewhere in between. A 4xx, 429 included,
    is a definite refusal."""
    if getattr(exc, "sandbox_id", None):
        return False  # the caller knows the guest and deletes it
    status = getattr(exc, "status", None)
    return status is None or not 400 <= status < 500


def _reap_lost_create(client: Client, name: str, exc: BaseException) -> None:
    """After a create whose answer was lost, find the guest by its unique name and delete it,
    so an answer cut in flight never orphans a VM. Best effort, logged, never raises."""
    if not name or not _create_may_have_landed(exc):
        return
    native = load_native()
    try:
        rows = client.list(prefix=name)
    except native.CreateOSError as lookup:
        logger.warning(
            "CreateOS: a create failed without a usable answer and the guest named %s could not be "
            "looked up (%s). If it exists, auto-pause bounds its cost; delete leftovers with "
            "'createos-langflow reap --yes'.",
            name,
            failures.describe(lookup),
        )
        return
    for row in rows:
        if row.get("name") != name or row.get("status") in ("destroyed", "failed"):
            continue
        try:
            client.delete(row["id"])
        except native.CreateOSError as failed:
            logger.warning(
                "CreateOS: could not delete guest %s (%s), created by a request whose answer was lost: "
                "%s. Auto-pause bounds its cost; delete leftovers with 'createos-langflow reap --yes'.",
                row.get("id"),
                name,
                failures.describe(failed),
            )
        else:
            logger.info(
                "CreateOS: deleted guest %s (%s), created by a request whose answer was lost",
                row.get("id"),
                name,
            )


def collect_deletes(client: Client, timeout: float, log: logging.Logger = logger) -> None:
    """Log the outcome of every background delete that finished (never the key): run_program's
    and those the native client retried. A guest that is gone is released from the keeper;
    one whose delete failed stays held, for the keeper to try at exit."""
    try:
        outcomes = client.drain_deletes(timeout)
    except Exception:  # collecting outcomes must never fail a run
        log.debug("drain_deletes failed", exc_info=True)
        return
    for sandbox_id, status, error in outcomes:
        if error is None and (status is None or 200 <= status < 300 or status == 404):
            pool_keeper.release(sandbox_id)
            log.debug("CreateOS: deleted guest %s (HTTP %s)", sandbox_id, status)
        else:
            log.warning(
                "CreateOS: could not delete guest %s (HTTP %s): %s. Auto-pause bounds its cost; "
                "delete leftovers with 'createos-langflow reap --yes'.",
                sandbox_id,
                status,
                error or "unexpected status",
            )


def drain_deletes(timeout: float, log: logging.Logger = logger) -> dict[str, int]:
    """Wait up to ``timeout`` in all for the background deletes of every endpoint's client,
    logging each outcome; the deletes still pending after that, per base URL (none: left out)."""
    deadline = time.monotonic() + timeout
    left: dict[str, int] = {}
    for endpoint in connection.endpoints.all():
        try:
            pending = endpoint.client.pending_deletes()
        except Exception:  # a closed client has nothing to wait for
            log.debug("pending_deletes failed", exc_info=True)
            continue
        collect_deletes(endpoint.client, max(0.0, deadline - time.monotonic()) if pending else 0.0, log)
        try:
            still = endpoint.client.pending_deletes()
        except Exception:
            still = 0
        if still:
            left[endpoint.base_url] = still
    return left


EXIT_DRAIN_SECONDS = 5.0


def _drain_at_exit() -> None:
    drain_deletes(EXIT_DRAIN_SECONDS)


hooks.at_exit("delete outcomes", _drain_at_exit)
