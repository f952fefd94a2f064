"""A warm executor per trust domain (``CREATEOS_EXECUTOR_REUSE=true``, opt-in).

Off (the default), every executor run gets a guest of its own, deleted after it. On, the runs
of one trust domain share guests that stay up between runs, each with a warm runner that has
already imported lfx (``guest/zygote.py``): a run is one exec of a small connector, and its
process is forked from the warm runner, so it pays neither a boot nor lfx's import. Once a run
gave its guest back, the next run's process is forked ahead of need (the guest's *standby*:
one connector exec whose forked process waits for a spec, as a pooled runner does), so the
next run only uploads its spec; a run that finds no standby waiting forks its own.

A trust domain is one flow run for one owner (the end user for a flow Langflow serves to one,
else the executing user), under one guest policy: the guest spec (image, shape, egress rules,
the names and values of ``CREATEOS_EXECUTOR_ENV``, endpoint) and the run's timeout and output
cap. A run with no flow id or no owner (an anonymous served run) gets a throwaway guest, as
with reuse off. Different flows, different owners and a changed policy never share a guest.

Runs of one domain share the guest's filesystem and its processes: what a run leaves in the
guest (files, processes it did not wait for, unless they are in its own process group, which
is killed when the run ends) a later run of the same flow and owner can see. They never share
anything with another flow or another owner, and each run keeps its own frame secret, spec,
variables, reply directory and exit status.

Per guest at most ``CREATEOS_EXECUTOR_REUSE_MAX_RUNS`` runs at once (more go to another guest
of the domain, made for them); a guest with no run for ``CREATEOS_EXECUTOR_REUSE_IDLE_SECONDS``
is deleted; every guest is held by the guest keeper from its create (``core/lease.py``), and
this process's guests are deleted at exit (``executor.shutdown()`` too). A guest whose warm
runner is gone (the connector finds nobody, exit 75) is replaced before anything of the run
ran on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from lfx.utils.sandbox.base import SandboxExecutionError, SandboxUnavailableError

from langflow_sandbox_createos.core import admission, budget, connection, failures, guest_spec, hooks
from langflow_sandbox_createos.core.guest_spec import GuestSpec
from langflow_sandbox_createos.core.lease import Lease
from langflow_sandbox_createos.core.settings import ExecutorSettings
from langflow_sandbox_createos.executor.framing import new_token, tail
from langflow_sandbox_createos.executor.guest import BOOTSTRAP
from langflow_sandbox_createos.executor.guest.zygote import ZYGOTE_SOCKET
from langflow_sandbox_createos.executor.pool import warm_flow
from langflow_sandbox_createos.executor.reader import FrameReader
from langflow_sandbox_createos.executor.run import (
    PYTHON,
    ROOTFS_HINT,
    _Run,
    boot_stdin,
    compact_json,
    runner_stdin,
    version_text,
)

logger = logging.getLogger("langflow_sandbox_createos.executor")

NAME_PREFIX = "lf-xr-"
# How long a warm runner may take to start (interpreter, lfx's import, a warm-up build).
START_TIMEOUT_SECONDS = 300.0
# The warm runner stays this much longer than the host keeps its guest, and auto-pause more.
IDLE_MARGIN_SECONDS = 30
REAP_TICK_SECONDS = 5.0
STANDBY_POLL_SECONDS = 0.02  # how often a standby looks for its spec where inotify is missing


@dataclass(frozen=True, repr=False, kw_only=True)
class DomainKey(GuestSpec):
    """A guest spec plus the trust domain and what its warm runner serves: the runs of equal
    keys share guests."""

    flow_id: str
    owner: str
    timeout_seconds: int
    idle_seconds: int
    max_output_bytes: int
    cfg: ExecutorSettings = field(compare=False)


def domain_key(
    endpoint: connection.Endpoint, cfg: ExecutorSettings, envs: dict[str, str], flow_id: Any, owner: Any
) -> DomainKey | None:
    """The run's trust domain, or None when it has none (no flow id, no owner): that run gets a
    throwaway guest."""
    if not flow_id or not owner:
        return None
    return DomainKey(
        endpoint=endpoint,
        shape=cfg.shape,
        rootfs=cfg.rootfs,
        egress=tuple(cfg.egress),
        auto_pause_seconds=budget.executor(
            cfg.timeout_seconds, spec_wait=cfg.reuse_idle_seconds + IDLE_MARGIN_SECONDS
        ).auto_pause_seconds(),
        envs=tuple(sorted(envs.items())),
        flow_id=str(flow_id),
        owner=str(owner),
        timeout_seconds=cfg.timeout_seconds,
        idle_seconds=cfg.reuse_idle_seconds,
        max_output_bytes=cfg.max_output_bytes,
        cfg=cfg,
    )


ANONYMOUS_SESSION_PREFIX = "anon::"  # Langflow's session of an anonymous end user's run


def run_owner(graph: Any, spec: dict[str, Any]) -> Any:
    """Whom a run belongs to for reuse, by the CreateOS Sandbox component's rule for Guest Reuse
    (Langflow's rule for chat history): the end user where Langflow serves the run to one, else
    the executing user; None for an anonymous end user's run (its session is ``anon::…``), which
    never shares a guest."""
    from langflow_sandbox_createos.component.engine import run_owner as component_run_owner

    live = graph is not None and not isinstance(graph, (str, bytes, dict))
    if str(spec.get("session_id") or "").startswith(ANONYMOUS_SESSION_PREFIX):
        return None
    return component_run_owner(graph if live else None, spec.get("user_id"))


_Woken = tuple[asyncio.AbstractEventLoop, "asyncio.Future[None]"]  # a run waiting for a spare run


class WarmGuest:
    """One reused guest: its lease, its warm runner, the runs it serves now."""

    def __init__(
        self, key: DomainKey, guest: Lease, lfx: str | None, runner_pid: int, owner: Domains
    ) -> None:
        self.owner = owner
        self.runner_pid = runner_pid  # the warm runner's pid in the guest
        self.key = key
        self.lease = guest
        self.lfx = lfx
        self.served = 0
        self.last_used = time.monotonic()
        self.gone = False
        self._standby_lock = threading.Lock()
        self.standby: _Run | None = None  # the next run's process, forked ahead and waiting
        self.served_ahead = 0  # runs served by a standby
        self.taken_at: list[float] = []  # when each run now on it took it (oldest first)

    @property
    def runs(self) -> int:
        """The runs on it now."""
        return len(self.taken_at)

    @property
    def sandbox_id(self) -> str:
        return self.lease.sandbox_id

    def arm_standby(self) -> None:
        """Start the next run's process now, off any run's path (one exec of the connector
        whose warm-runner child waits for a spec, as a pooled runner does), unless one is
        already there: the next run of the domain then only uploads its spec."""
        with self._standby_lock:
            if self.standby is not None or self.gone:
                return
            wait = self.key.idle_seconds + IDLE_MARGIN_SECONDS  # as long as the warm runner stays
            run = _Run(self.key.endpoint, self.key.cfg, None, reused=self, standby=True, spec_wait=wait)
            self.standby = run
        boot = {"path": run.spec_path, "seconds": wait, "poll": STANDBY_POLL_SECONDS, "preload": False}
        run.start_exec(boot_stdin(run.token, wait=compact_json(boot)))

    def take_standby(self) -> _Run | None:
        """The standby run if its process waits for a spec now (else None: the run forks its
        own through the connector); one that ended is dropped."""
        with self._standby_lock:
            run = self.standby
            if run is None:
                return None
            if not run.alive():
                self.standby = None
                run.discard()
                return None
            if "waiting" not in run.early_kinds():
                return None  # still starting: it serves a later run
            self.standby = None
            self.served_ahead += 1
            return run

    def drop_standby(self) -> None:
        """The guest goes: its standby reports nothing more (the guest's delete ends its exec)."""
        with self._standby_lock:
            run, self.standby = self.standby, None
        if run is not None:
            run.discard()

    def give_back(self, *, gone: bool) -> None:
        """This guest's run ended (``gone``: the guest or its runner is gone)."""
        self.owner.give_back(self, gone=gone)


# The largest flow (its JSON) the warm runner is given to build once at start; a larger one
# warms with the generic flow.
WARM_FLOW_MAX_BYTES = 1 << 20


def _warm_with(flow: Any) -> Any:
    """What the warm runner builds once (never runs) at start: the domain's own flow, as the
    first run's spec has it (its graph only: no variables, inputs or secret), so the modules
    its components import are loaded in the runner and every forked run finds them; the
    generic flow when there is none or it is too large."""
    if isinstance(flow, dict) and len(compact_json(flow)) <= WARM_FLOW_MAX_BYTES:
        return flow
    return warm_flow()


def _start_blocking(key: DomainKey, owner: Domains, flow: Any = None) -> WarmGuest:
    """Create a reused guest (held at once) and start its warm runner, warmed with `flow` (the
    domain's graph); the guest is deleted again if the runner does not start."""
    with failures.native_errors("create the executor's reused guest"):
        guest = Lease.create(key.endpoint, key, guest_spec.random_name(NAME_PREFIX))
    try:
        token = new_token()
        frames: list[dict[str, Any]] = []
        stderr: list[str] = []
        reader = FrameReader(key=bytes.fromhex(token), on_frame=frames.append, on_plain=lambda line: None)
        wait = {
            "socket": ZYGOTE_SOCKET,
            "idle_seconds": key.idle_seconds + IDLE_MARGIN_SECONDS,
            "warm_flow": _warm_with(flow),
        }
        stdin = runner_stdin(token, entry=json.dumps("zygote_main"), zygote=compact_json(wait))
        with failures.native_errors("start the reused guest's warm runner"):
            result = guest.exec(
                PYTHON,
                ["-c", BOOTSTRAP],
                stdin=stdin,
                timeout=START_TIMEOUT_SECONDS,
                max_output_bytes=key.max_output_bytes,
                stream=True,
                on_output=lambda stream, text: (
                    reader.feed(text) if stream == "stdout" else stderr.append(text)
                ),
            )
        if not result.streamed:
            reader.feed(result.stdout)
            stderr.append(result.stderr)
        reader.close()
        started = next((f for f in frames if f.get("t") == "zygote"), None)
        if started is None:
            if any(f.get("t") == "missing_lfx" for f in frames):
                raise SandboxUnavailableError(
                    f"CreateOS executor: the guest (rootfs {key.rootfs!r}) has no importable lfx, so it cannot "
                    f"rebuild the flow. {ROOTFS_HINT}"
                )
            raise SandboxExecutionError(
                f"CreateOS executor: the reused guest's warm runner did not start (exit {result.exit_code}). "
                f"Guest stderr (tail):\n{tail(''.join(stderr), 2000)}"
            )
        return WarmGuest(key, guest, version_text(started.get("lfx")), int(started.get("pid") or 0), owner)
    except BaseException:
        guest.end(
            lambda exc: logger.warning(
                "CreateOS executor: could not delete guest %s: %s", guest.sandbox_id, exc
            )
        )
        raise


class Domains:
    """This process's reused guests, by trust domain."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._guests: dict[DomainKey, list[WarmGuest]] = {}
        self._starting: dict[DomainKey, threading.Event] = {}
        self._spare_waiters: dict[DomainKey, list[_Woken]] = {}
        self._mean_run: dict[DomainKey, float] = {}  # how long a run holds a guest's place
        self._reaper: threading.Thread | None = None
        self._stop = threading.Event()

    def guests(self) -> Iterator[WarmGuest]:
        with self._lock:
            found = [g for guests in self._guests.values() for g in guests]
        yield from found

    def _take_locked(self, key: DomainKey) -> WarmGuest | None:
        for guest in self._guests.get(key, ()):
            if not guest.gone and guest.runs < key.cfg.reuse_max_runs:
                guest.taken_at.append(time.monotonic())
                return guest
        return None

    def try_take(self, key: DomainKey) -> WarmGuest | None:
        """A guest of the domain with a run to spare, taken for one run, or None (no waiting)."""
        with self._lock:
            return self._take_locked(key)

    def serving(self, key: DomainKey) -> bool:
        """Whether the domain has a guest, or one being made: a run of it will come free."""
        with self._lock:
            return bool(self._guests.get(key)) or key in self._starting

    def expected_spare_wait(self, key: DomainKey) -> float | None:
        """How long a run that starts waiting now for a spare run of the domain should expect
        to wait: the runs waiting before it, plus itself, over the domain's places, times the
        mean hold of a run (None before a run of the domain ended, or with no guest)."""
        with self._lock:
            mean = self._mean_run.get(key)
            places = sum(key.cfg.reuse_max_runs for g in self._guests.get(key, ()) if not g.gone)
            waiting = len(self._spare_waiters.get(key, ()))
        return admission.expected_wait(mean, waiting, places) if places else None

    async def wait_take(self, key: DomainKey) -> WarmGuest:
        """A guest of the domain with a run to spare, taken as soon as one has (a run of it
        ended, or a guest of it was made); makes none itself. Cancel it to stop waiting."""
        loop = asyncio.get_running_loop()
        while True:
            woken: _Woken = (loop, loop.create_future())
            with self._lock:
                found = self._take_locked(key)
                if found is not None:
                    return found
                self._spare_waiters.setdefault(key, []).append(woken)
            try:
                await woken[1]
            finally:
                with self._lock:
                    waiting = self._spare_waiters.get(key, [])
                    if woken in waiting:
                        waiting.remove(woken)

    def _wake(self, key: DomainKey) -> None:
        """A run of the domain may be spare now: every run waiting for one looks again (one
        takes it; the others wait on)."""
        with self._lock:
            waiting = self._spare_waiters.pop(key, [])
        for loop, future in waiting:
            with contextlib.suppress(RuntimeError):  # its loop is closed: nobody waits there
                loop.call_soon_threadsafe(admission.resolve, future)

    async def acquire(self, key: DomainKey, flow: Any = None) -> WarmGuest:
        """A guest of the domain with a free run, made if none is (runs that arrive while one
        is being made wait for it: they may fit on it); a new guest's runner is warmed with
        `flow`, the domain's graph."""
        while True:
            with self._lock:
                found = self._take_locked(key)
                if found is not None:
                    return found
                starting = self._starting.get(key)
                if starting is None:
                    starting = self._starting[key] = threading.Event()
                    mine = True
                else:
                    mine = False
            if not mine:
                await asyncio.to_thread(starting.wait)
                continue
            try:
                made = await asyncio.to_thread(_start_blocking, key, self, flow)
            finally:
                with self._lock:
                    self._starting.pop(key, None)
                starting.set()
            with self._lock:
                made.taken_at.append(time.monotonic())  # its first run
                self._guests.setdefault(key, []).append(made)
                self._start_reaper_locked()
            self._wake(key)  # its other runs are spare
            logger.info(
                "CreateOS executor: reused guest %s is up for flow %s (warm runner, lfx %s)",
                made.sandbox_id,
                key.flow_id,
                made.lfx,
            )
            return made

    def give_back(self, guest: WarmGuest, *, gone: bool = False) -> None:
        """A run of `guest` ended; a guest found `gone` (its runner or the guest itself) is
        deleted, never handed out again."""
        with self._lock:
            guest.served += 1
            guest.last_used = time.monotonic()
            # the oldest run's hold: an estimate, runs need not end in order
            held = guest.last_used - guest.taken_at.pop(0)
            self._mean_run[guest.key] = admission.moving_mean(self._mean_run.get(guest.key), held)
            if gone and not guest.gone:
                guest.gone = True
                self._drop_locked(guest)
            else:
                gone = False
        if gone:
            self._end(guest, "its warm runner is gone")
        else:
            guest.arm_standby()  # the next run's process, while none runs on the critical path
            self._wake(guest.key)

    def _drop_locked(self, guest: WarmGuest) -> None:
        guests = self._guests.get(guest.key, [])
        if guest in guests:
            guests.remove(guest)
        if not guests:
            self._guests.pop(guest.key, None)

    def _end(self, guest: WarmGuest, why: str) -> None:
        guest.drop_standby()
        logger.info("CreateOS executor: deleting reused guest %s (%s)", guest.sandbox_id, why)
        guest.lease.end_soon(
            lambda exc: logger.warning(
                "CreateOS executor: could not delete reused guest %s (%s); auto-pause after %s s bounds it",
                guest.sandbox_id,
                exc,
                guest.key.auto_pause_seconds,
            )
        )

    def reap_idle(self, now: float | None = None) -> list[str]:
        """Delete the guests with no run for their idle time; the ids of those deleted."""
        now = time.monotonic() if now is None else now
        idle = []
        with self._lock:
            for guests in list(self._guests.values()):
                for guest in list(guests):
                    if guest.runs == 0 and now - guest.last_used > guest.key.idle_seconds:
                        guest.gone = True
                        self._drop_locked(guest)
                        idle.append(guest)
        for guest in idle:
            self._end(guest, f"idle for more than {guest.key.idle_seconds} s")
        return [g.sandbox_id for g in idle]

    def _start_reaper_locked(self) -> None:
        if self._reaper is not None and self._reaper.is_alive():
            return

        def reap() -> None:
            while not self._stop.wait(REAP_TICK_SECONDS):
                try:
                    self.reap_idle()
                except Exception:  # the reaper must outlive a failed delete
                    logger.debug("CreateOS executor: reaping idle reused guests failed", exc_info=True)

        self._stop.clear()
        self._reaper = threading.Thread(target=reap, name="createos-executor-reuse-reaper", daemon=True)
        self._reaper.start()

    def shutdown(self) -> None:
        """Delete every reused guest of this process now (interpreter exit does it too)."""
        self._stop.set()
        with self._lock:
            guests = [g for gs in self._guests.values() for g in gs]
            self._guests.clear()
            for guest in guests:
                guest.gone = True
        for guest in guests:
            guest.drop_standby()
            guest.lease.end(functools.partial(_shutdown_failed, guest.sandbox_id))

    def forget_after_fork(self) -> None:
        """In a fork child: the parent's guests and threads are the parent's."""
        self._lock = threading.Lock()
        self._guests = {}
        self._starting = {}
        self._spare_waiters = {}
        self._mean_run = {}
        self._reaper = None
        self._stop = threading.Event()


def _shutdown_failed(sandbox_id: str, exc: BaseException) -> None:
    logger.warning("CreateOS executor: could not delete reused guest %s at shutdown: %s", sandbox_id, exc)


domains = Domains()
hooks.at_exit("reused guests", domains.shutdown)
hooks.after_fork("reused guests", domains.forget_after_fork)
