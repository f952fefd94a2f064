"""The warm pool the backend and the executor share: guests created ahead of need, one run each.

Opt-in with ``CREATEOS_SANDBOX_WARM_POOL=N`` for the backend (0..64, default 0) and
``CREATEOS_EXECUTOR_WARM_POOL=N`` for the executor (``executor/pool.py`` adds a warmer that
starts the guest runner). For every configuration a run asks for (a :class:`GuestSpec`:
endpoint, shape, rootfs, egress rules, env, auto-pause budget) the pool keeps N guests booted
and idle. A run takes one, execs on it and deletes it in the
background, so one VM still serves exactly one execution, and the critical path shrinks from
create + exec to the exec alone.

Design points (docs/performance.md has the costs):

- **Keyed by the whole configuration.** A run only ever receives a guest created with its own
  policy. Env *keys* are part of the key; values are not (they may be secrets): pool guests
  declare the keys with empty values at create, and the run passes its values at exec.
- **Refilled in the background** by at most ``MAX_WORKERS`` threads per pool object. They
  spend their time inside native calls (create, delete), which release the GIL.
- **Stale guests are discarded without a round trip where possible.** A guest is handed out
  only while it is younger than its auto-pause budget minus ``EXPIRY_MARGIN_SECONDS`` (the
  control plane would pause it otherwise); older ones are deleted in the background. A guest
  that died, was paused or deleted behind our back is detected by the exec itself (404/409,
  answered before anything runs) and the caller falls back to one fresh create. That costs
  nothing on the common path, where a GET before every use would cost one round trip per run.
- **Bounded idle cost.** Each guest carries the auto-pause backstop. A pool that has not been
  used for one auto-pause window stops replacing guests that expire, so an idle process
  drains its pool instead of churning guests forever.
- **Lifecycle.** ``shutdown()`` and process exit (atexit) delete every pooled guest. Each
  guest is a :class:`~langflow_sandbox_createos.core.lease.Lease`, held by the guest keeper
  from its create until it is deleted; ``take`` hands the lease to the run (which ends it), so
  a process that ends without shutdown or atexit (killed, SIGQUIT, ``os._exit`` as gunicorn's
  workers do) leaves pooled guests and those of runs in flight to the keeper. A fork child
  forgets the parent's pool (never touching the parent's guests); it builds its own.
- **Warmers.** A pool may be given a :class:`Warmer` that prepares each new guest further
  (the executor starts its guest runner and waits until lfx is loaded) and holds a handle
  for it; a guest whose handle reports it unusable is discarded at ``take`` without a request.
- **Gates.** A pool may also be given a :class:`Gate`, the surface's admission line
  (``lease.Admission.gate``): each
  create then holds one of the line's slots from its request until its guest is warm, and
  starts only when a slot is spare (no run waiting, fewer than the limit in flight). Refills
  then count against the same limit as runs, never make a run wait, and resume by themselves
  when a run leaves (the executor's pool, ``executor/pool.py``).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from langflow_sandbox_createos.core import connection, hooks
from langflow_sandbox_createos.core.guest_spec import GuestSpec
from langflow_sandbox_createos.core.lease import Lease

logger = logging.getLogger("langflow_sandbox_createos.warm_pool")

NAME_PREFIX = "lf-w-"
MAX_WORKERS = 4
# A guest is handed out only while it is this much younger than its auto-pause budget.
# Refill back-off after a failed create: doubles per failure, capped.
BACKOFF_FIRST_SECONDS = 0.5
BACKOFF_MAX_SECONDS = 30.0
SHUTDOWN_SECONDS = 10.0


class PoolDisabled(Exception):
    """Raised by a warmer when no guest of this key can ever be warmed (the pool stops
    creating guests for the key; runs take the cold path)."""


class Warmer(Protocol):
    """Prepares a freshly created guest before it is handed out, and owns what that leaves
    open (a running exec, for the executor)."""

    def warm(self, guest: Lease, key: GuestSpec) -> Any:
        """Blocking; returns the handle kept with the guest. Raises when the guest is unusable."""

    def usable(self, handle: Any) -> bool:
        """A local check (no request): False when the guest is known to be dead."""

    def discard(self, handle: Any) -> None:
        """The guest is about to be deleted unused: release the handle's resources."""


class Gate(Protocol):
    """Admission for the pool's creates (see the module docstring)."""

    def try_enter(self, key: GuestSpec) -> bool:
        """Take a slot for one create of ``key`` if one is spare; never waits."""

    def has_spare(self, key: GuestSpec) -> bool:
        """Whether try_enter would succeed now (a hint: workers are started only then)."""

    def leave(self) -> None:
        """Give back a slot try_enter took."""

    def when_spare(self, callback: Any) -> None:
        """Call ``callback()`` whenever a slot frees that no run takes."""


@dataclass
class _Guest:
    lease: Lease
    expires: float  # monotonic; past it the guest may be paused by the control plane
    handle: Any = None  # what the pool's warmer returned for it

    @property
    def sandbox_id(self) -> str:
        return self.lease.sandbox_id


@dataclass
class _Pool:
    key: GuestSpec
    endpoint: connection.Endpoint
    target: int
    ready: deque[_Guest] = field(default_factory=deque)
    pending: int = 0
    last_used: float = 0.0
    failures: int = 0
    retry_at: float = 0.0
    disabled: bool = False

    def active(self, now: float) -> bool:
        """Used within the last auto-pause window: keep it topped up."""
        return not self.disabled and now - self.last_used <= self.key.idle_window_seconds()


_live_pools: weakref.WeakSet[WarmPool] = weakref.WeakSet()


class WarmPool:
    """The pools of one backend instance, one per configuration. Thread-safe."""

    def __init__(
        self,
        *,
        random_name: Any,
        max_workers: int = MAX_WORKERS,
        prefix: str = NAME_PREFIX,
        warmer: Warmer | None = None,
        gate: Gate | None = None,
    ) -> None:
        self._random_name = random_name
        self._max_workers = max_workers
        self.prefix = prefix
        self._warmer = warmer
        self._gate = gate
        self._init_state()
        _live_pools.add(self)
        if gate is not None:
            ref = weakref.ref(self)

            def on_spare() -> None:
                pool = ref()
                if pool is not None:
                    pool._on_spare()

            gate.when_spare(on_spare)

    def _init_state(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._pools: dict[GuestSpec, _Pool] = {}
        self._to_delete: deque[tuple[Lease, Any]] = deque()  # (the guest, its warmer's handle)
        self._workers: list[threading.Thread] = []
        self._warming: dict[str, Lease] = {}  # sandbox id -> the guest, while its warmer runs
        self._busy = 0  # workers inside a native call
        self._generation = 0
        self._counters = {
            "created": 0,
            "taken": 0,
            "expired": 0,
            "stale": 0,
            "deleted": 0,
            "delete_failures": 0,
            "create_failures": 0,
        }

    # --- the run's side ----------------------------------------------------------------------

    def take(self, key: GuestSpec, endpoint: connection.Endpoint, target: int) -> Lease | None:
        """A ready guest's lease for ``key``, or None when none is ready (the caller creates one).

        Also sets the pool's size to ``target`` and schedules the refill. No I/O."""
        guest = self.take_guest(key, endpoint, target)
        return guest.lease if guest is not None else None

    def take_guest(self, key: GuestSpec, endpoint: connection.Endpoint, target: int) -> _Guest | None:
        """Like :meth:`take`, with the warmer's handle. The lease is the caller's from here: it
        ends it (the guest stays held by the keeper until then)."""
        now = time.monotonic()
        with self._cond:
            pool = self._pools.get(key)
            if pool is None:
                pool = self._pools[key] = _Pool(key=key, endpoint=endpoint, target=target)
            pool.endpoint = endpoint  # the endpoint may have been rebuilt (same URL and key)
            pool.target = target
            pool.last_used = now
            guest = None
            while pool.ready:
                candidate = pool.ready.popleft()
                if candidate.expires <= now:
                    self._counters["expired"] += 1
                elif self._warmer is not None and not self._warmer.usable(candidate.handle):
                    self._counters["stale"] += 1
                else:
                    guest = candidate
                    break
                self._to_delete.append((candidate.lease, candidate.handle))
            while len(pool.ready) > target:  # the size was lowered
                dropped = pool.ready.pop()
                self._to_delete.append((dropped.lease, dropped.handle))
            if guest is not None:
                self._counters["taken"] += 1
            self._wake_workers_locked()
        # the guest stays held: the run that took its lease ends it
        return guest

    def note_stale(self, key: GuestSpec, sandbox_id: str) -> None:
        """A guest taken from the pool was gone or paused (404/409 on its exec)."""
        with self._cond:
            self._counters["stale"] += 1
        logger.info(
            "CreateOS warm pool: guest %s was no longer usable; ran on a fresh guest instead", sandbox_id
        )

    # --- introspection -----------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        with self._cond:
            out = dict(self._counters)
            out["ready"] = sum(len(p.ready) for p in self._pools.values())
            out["pending"] = sum(p.pending for p in self._pools.values())
            out["pools"] = len(self._pools)
            out["to_delete"] = len(self._to_delete)
            out["workers"] = len(self._workers)
            return out

    def ready_ids(self, key: GuestSpec | None = None) -> list[str]:
        with self._cond:
            pools = [self._pools[key]] if key is not None and key in self._pools else []
            if key is None:
                pools = list(self._pools.values())
            return [g.sandbox_id for p in pools for g in p.ready]

    def wait_full(self, timeout: float) -> bool:
        """Wait until every pool holds its target of ready guests (tests, benchmarks)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if all(len(p.ready) >= p.target for p in self._pools.values()):
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.5))

    # --- background work ---------------------------------------------------------------------

    def _on_spare(self) -> None:
        """The gate freed a slot: a refill that waited for one may start now."""
        with self._cond:
            self._wake_workers_locked()

    def _may_create_locked(self, pool: _Pool, now: float) -> bool:
        return pool.active(now) and now >= pool.retry_at and len(pool.ready) + pool.pending < pool.target

    def _wake_workers_locked(self) -> None:
        work = self._work_count_locked(time.monotonic())
        while len(self._workers) - self._busy < work and len(self._workers) < self._max_workers:
            worker = threading.Thread(
                target=self._worker, args=(self._generation,), name="createos-warm-pool", daemon=True
            )
            self._workers.append(worker)
            worker.start()
        self._cond.notify_all()

    def _work_count_locked(self, now: float) -> int:
        n = len(self._to_delete)
        for pool in self._pools.values():
            gated_off = self._gate is not None and not self._gate.has_spare(pool.key)
            if pool.active(now) and now >= pool.retry_at and not gated_off:
                n += max(0, pool.target - len(pool.ready) - pool.pending)
        return n

    def _next_job_locked(self, now: float) -> tuple[str, Any, Any] | None:
        # Expire first: an expired guest is deleted, and replaced only while the pool is in use.
        for pool in self._pools.values():
            while pool.ready and pool.ready[0].expires <= now:
                self._counters["expired"] += 1
                old = pool.ready.popleft()
                self._to_delete.append((old.lease, old.handle))
        if self._to_delete:
            return ("delete", self._to_delete.popleft(), None)
        for pool in self._pools.values():
            if self._may_create_locked(pool, now) and (self._gate is None or self._gate.try_enter(pool.key)):
                pool.pending += 1
                return ("create", pool, self._gate)
        return None

    def _next_wakeup_locked(self, now: float) -> float | None:
        times = [p.ready[0].expires for p in self._pools.values() if p.ready]
        times += [p.retry_at for p in self._pools.values() if p.retry_at > now and p.active(now)]
        return max(0.05, min(times) - now) if times else None

    def _worker(self, generation: int) -> None:
        me = threading.current_thread()
        while True:
            with self._cond:
                while True:
                    if self._generation != generation:
                        return  # shut down or forgotten: the list it was in is gone
                    now = time.monotonic()
                    job = self._next_job_locked(now)
                    if job is not None:
                        self._busy += 1
                        break
                    wakeup = self._next_wakeup_locked(now)
                    if wakeup is None:  # nothing to do or wait for; take() starts a new worker
                        self._workers.remove(me)
                        return
                    self._cond.wait(wakeup)
            try:
                if job[0] == "delete":
                    self._delete(*job[1])
                else:
                    try:
                        self._create(job[1], generation)
                    finally:
                        if job[2] is not None:
                            job[
                                2
                            ].leave()  # after the guest is ready: a waiting run that gets the slot takes it
            finally:
                with self._cond:
                    if self._generation == generation:
                        self._busy -= 1
                    self._cond.notify_all()

    def _create(self, pool: _Pool, generation: int) -> None:
        key = pool.key
        started = time.monotonic()
        guest = None
        handle = None
        try:
            guest = Lease.create(pool.endpoint, key, self._random_name(self.prefix))
            if self._warmer is not None:
                with self._cond:
                    self._warming[guest.sandbox_id] = guest  # shutdown deletes it mid-warm-up
                try:
                    handle = self._warmer.warm(guest, key)
                finally:
                    with self._cond:
                        self._warming.pop(guest.sandbox_id, None)
        except Exception as exc:
            if guest is not None:  # a create whose answer was lost: Lease.create deleted it
                self._delete(guest, None)
            with self._cond:
                if isinstance(exc, PoolDisabled):
                    pool.disabled = True
                pool.pending -= 1
                pool.failures += 1
                self._counters["create_failures"] += 1
                backoff = min(BACKOFF_MAX_SECONDS, BACKOFF_FIRST_SECONDS * 2 ** (pool.failures - 1))
                pool.retry_at = time.monotonic() + backoff
            log = logger.warning if pool.failures == 1 else logger.debug
            log(
                "CreateOS warm pool: could not create a guest for %r: %s (retrying in %.1f s)",
                key,
                exc,
                backoff,
            )
            return
        with self._cond:
            pool.pending -= 1
            pool.failures = 0
            pool.retry_at = 0.0
            self._counters["created"] += 1
            if (
                self._generation == generation
                and self._pools.get(key) is pool
                and len(pool.ready) < pool.target
            ):
                # The activity clock starts no earlier than the request was sent.
                pool.ready.append(_Guest(guest, started + key.lifetime_seconds(), handle))
                self._cond.notify_all()
                return
        # shut down, forgotten or no longer wanted meanwhile
        self._delete(guest, handle)

    def _delete(self, guest: Lease, handle: Any = None) -> None:
        if handle is not None and self._warmer is not None:
            try:
                self._warmer.discard(handle)
            except Exception:  # deleting the guest is what matters
                logger.debug("warm pool: discarding a handle failed", exc_info=True)

        def failed(exc: BaseException) -> None:  # still held: the keeper tries again at exit
            logger.warning(
                "CreateOS warm pool: could not delete guest %s: %s. Auto-pause bounds its cost; "
                "delete leftover lf-w-* sandboxes.",
                guest.sandbox_id,
                exc,
            )

        if guest.ended:  # shutdown deleted it while its warmer ran
            return
        ok = guest.end(failed)
        with self._cond:
            self._counters["deleted" if ok else "delete_failures"] += 1

    # --- lifecycle ---------------------------------------------------------------------------

    def shutdown(self, timeout: float = SHUTDOWN_SECONDS) -> None:
        """Delete every pooled guest, stop the workers (waiting for in-flight creates, whose
        guests they then delete). The object stays usable: a later take() starts over."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._generation += 1
            doomed = list(self._to_delete)
            self._to_delete.clear()
            for pool in self._pools.values():
                doomed += [(g.lease, g.handle) for g in pool.ready]
                pool.ready.clear()
            doomed += [(guest, None) for guest in self._warming.values()]
            self._warming.clear()
            self._pools.clear()
            workers = list(self._workers)
            self._workers = []
            self._busy = 0
            self._cond.notify_all()
        _delete_all(self, doomed, deadline)
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))
        if any(w.is_alive() for w in workers):
            logger.warning(
                "CreateOS warm pool: a guest create was still in flight at shutdown; it is deleted when it "
                "returns, or auto-pauses if the process exits first."
            )

    def forget_after_fork(self) -> None:
        """In a fork child: drop the parent's guests and threads without touching them."""
        self._init_state()


def _delete_all(pool: WarmPool, doomed: list[tuple[Lease, Any]], deadline: float) -> None:
    """Delete guests in parallel (up to MAX_WORKERS threads), within the deadline."""
    if not doomed:
        return
    queue = deque(doomed)
    lock = threading.Lock()

    def run() -> None:
        while time.monotonic() < deadline:
            with lock:
                if not queue:
                    return
                job = queue.popleft()
            pool._delete(*job)

    threads = [threading.Thread(target=run, daemon=True) for _ in range(min(MAX_WORKERS, len(doomed)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    if queue:
        logger.warning(
            "CreateOS warm pool: %d guest(s) not deleted at shutdown; auto-pause bounds their cost",
            len(queue),
        )


def env_keys(env: Mapping[str, str] | Iterable[str] | None) -> tuple[str, ...]:
    return tuple(sorted(env or ()))


def _shutdown_all() -> None:
    for pool in list(_live_pools):
        try:
            pool.shutdown()
        except Exception:
            logger.debug("warm pool shutdown failed", exc_info=True)


def _forget_all_after_fork() -> None:
    for pool in list(_live_pools):
        pool.forget_after_fork()  # pool_keeper forgets the parent's held guests on its own


hooks.at_exit("warm pools", _shutdown_all)
hooks.after_fork("warm pools", _forget_all_after_fork)
