"""Guest Reuse: the CreateOS Sandbox component's named guests, kept per flow, node, user (and
session) and network setting, found again by any worker of the flow.

A reused guest is found by its stable name (`reuse_name`): the id this process remembers
(one GET), else a paginated lookup, else a create; a lost race for the name adopts the
winner. It is brought to `running` (resumed when paused), its egress rules are checked
against the run's, and one idle past `CREATEOS_SANDBOX_REUSE_IDLE_SECONDS` is deleted and
replaced. It outlives the run and the process on purpose (other workers of the same flow
share it; the product page's "Before you turn Guest Reuse on"), so it is not held by the
guest keeper: idle expiry, the sweep (`sweeper`), auto-pause and `reap` bound it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

from lfx.utils.sandbox.base import SandboxExecutionError, SandboxUnavailableError

from langflow_sandbox_createos.core import clock, connection, failures, guest_spec, network
from langflow_sandbox_createos.core.guest_spec import GuestSpec
from langflow_sandbox_createos.core.lease import Lease
from langflow_sandbox_createos.core.native import load_native

if TYPE_CHECKING:
    from langflow_sandbox_createos._createos import Client

logger = logging.getLogger("langflow_sandbox_createos.component")

NAME_PREFIX = "lf-c-"
GUEST_READY_SECONDS = 120.0  # waiting for a reused guest to finish a transition or resume

LIVE_TRANSITIONS = frozenset({"creating", "pausing", "resuming", "forking"})
TERMINAL = frozenset({"destroyed", "failed"})

SWEEP_INTERVAL_SECONDS = 60.0  # at most one sweep of idle reused guests per process per minute
SWEEP_MAX_DELETES = 50
T = TypeVar("T")


def reuse_name(flow_id: str, component_id: str, egress: tuple[str, ...], owner: tuple[str, ...]) -> str:
    """The guest's name for (flow, component, owner, network policy): 22 characters, `lf-c-`
    prefix. The parts are hashed as one JSON list, so no choice of a session id (which the
    caller picks) can make its parts read as another owner's."""
    return guest_spec.stable_name(NAME_PREFIX, json.dumps([flow_id, component_id, list(owner), list(egress)]))


def idle_seconds(record: dict[str, Any], now: float | None = None) -> float | None:
    """How long a reused guest has sat unused: since it paused, which CreateOS does after
    `auto_pause_after_seconds` without an exec. None while it is not paused (it ran within
    its auto-pause window) or when the control plane gave no pause time."""
    return clock.paused_seconds(record, time.time() if now is None else now)


def idle_expired(record: dict[str, Any], limit: float, now: float | None = None) -> bool:
    idle = idle_seconds(record, now)
    return idle is not None and idle > limit


# --- the per-process guest cache ---------------------------------------------------------


class _GuestIds:
    """name -> sandbox id of reused guests seen by this process. Only a hint: every use is
    verified with a GET, and a restarted worker finds its guest again by name."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: dict[str, str] = {}

    def get(self, name: str) -> str | None:
        with self._lock:
            return self._ids.get(name)

    def remember(self, name: str, sandbox_id: str) -> None:
        with self._lock:
            self._ids[name] = sandbox_id

    def forget(self, name: str, sandbox_id: str | None = None) -> None:
        with self._lock:
            if sandbox_id is None or self._ids.get(name) == sandbox_id:
                self._ids.pop(name, None)

    def clear(self) -> None:
        with self._lock:
            self._ids.clear()


guest_ids = _GuestIds()


def after_acquire(client: Client, sandbox_id: str) -> None:
    """Test seam: runs between finding the guest and using it."""


# --- guest lookup --------------------------------------------------------------------------


class _GuestGone(Exception):
    """The guest vanished or is being destroyed: look it up again."""


def _sleep_step(attempt: int) -> float:
    return min(2.0, 0.25 * (1.25 ** max(0, attempt - 4)))


def _pick(rows: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    """The guest holding `name`: running first, then the oldest (so racing lookups agree)."""
    alive = [r for r in rows if r.get("name") == name and r.get("status") not in TERMINAL]
    if not alive:
        return None
    alive.sort(key=lambda r: (r.get("status") != "running", str(r.get("created_at") or ""), str(r.get("id"))))
    return alive[0]


def _wait_running(client: Client, native: ModuleType, sandbox_id: str, deadline: float) -> dict[str, Any]:
    """Bring a guest to `running`: resume it when paused, wait out transitions."""
    attempt = 0
    while True:
        try:
            record = client.get(sandbox_id)
        except native.NotFoundError:
            raise _GuestGone from None
        status = record.get("status")
        if status == "running":
            return record
        if status == "paused":
            remaining = max(1.0, deadline - time.monotonic())
            try:
                record = client.resume(sandbox_id, wait=remaining)
            except native.ConflictError:
                pass  # another worker resumed it first: poll
            except native.NotFoundError:
                raise _GuestGone from None
            else:
                if record.get("status") == "running":
                    return record
        elif status in ("destroying", *TERMINAL):
            raise _GuestGone
        elif status not in LIVE_TRANSITIONS:
            raise SandboxUnavailableError(
                f"CreateOS: the reused guest {sandbox_id} is in state {status!r} and cannot run code. "
                f"Delete it (DELETE /v1/sandboxes/{sandbox_id}); the next run creates a fresh one."
            )
        if time.monotonic() >= deadline:
            raise SandboxExecutionError(
                f"CreateOS: the reused guest {sandbox_id} did not become running within "
                f"{GUEST_READY_SECONDS:g} s (last state {status!r}); retry later."
            )
        attempt += 1
        time.sleep(_sleep_step(attempt))


def _check_drift(record: dict[str, Any], wanted: tuple[str, ...], allow_network: bool) -> None:
    live = record.get("egress")
    if not network.egress_matches(live, wanted):
        raise SandboxUnavailableError(
            f"Refusing to reuse guest {record.get('id')} ({record.get('name')}): its egress rules are "
            f"{list(live or ['*'])}, but Allow Network {'on' if allow_network else 'off'} needs "
            f"{list(wanted)}. The rules were changed after the guest was created, so the network policy "
            f"this component shows would not be the one applied. Delete the guest "
            f"(DELETE /v1/sandboxes/{record.get('id')}) and the next run creates a fresh one."
        )


def acquire_reused_guest(
    endpoint: connection.Endpoint,
    native: ModuleType,
    name: str,
    guest: GuestSpec,
    allow_network: bool,
    *,
    idle_limit: float | None = None,
    expired: list[str] | None = None,
) -> tuple[dict[str, Any], bool]:
    """The running guest named `name`, and whether it already existed (False: created now).

    Tries the id this process remembers (one GET), then a full, paginated lookup by name,
    then a create; a duplicate-name conflict means another worker won the race, so the
    lookup runs again and adopts its guest. A guest idle longer than `idle_limit` seconds is
    deleted instead of used (its id appended to `expired`), and a fresh one is created.

    A guest created here is kept, not held by the guest keeper: other workers may be using it
    when this process ends (idle expiry, the sweep, auto-pause and reap bound it)."""
    client = endpoint.client
    deadline = time.monotonic() + GUEST_READY_SECONDS
    attempt = 0
    while True:
        record: dict[str, Any] | None = None
        cached = guest_ids.get(name)
        if cached is not None:
            try:
                record = client.get(cached)
            except native.NotFoundError:
                record = None
            if record is not None and (record.get("name") != name or record.get("status") in TERMINAL):
                record = None
            if record is None:
                guest_ids.forget(name, cached)
        from_get = record is not None  # a full view; a list row may be abridged
        if record is None:
            record = _pick(client.list(prefix=name), name)
        if record is None:
            try:
                created = Lease.create(endpoint, guest, name, kept=True)
            except native.ConflictError:
                logger.debug("guest name %s was taken concurrently; adopting the winner", name)
            else:
                guest_ids.remember(name, created.sandbox_id)
                return created.view, False
        elif record.get("status") != "destroying":
            sandbox_id = str(record["id"])
            try:
                # decide on drift (and state) from a GET, never from a list row
                current = record if from_get else client.get(sandbox_id)
                if idle_limit is not None and idle_expired(current, idle_limit):
                    _delete_expired(endpoint, current, idle_limit)
                    if expired is not None:
                        expired.append(sandbox_id)
                    raise _GuestGone
                _check_drift(current, guest.egress, allow_network)
                running = (
                    current
                    if current.get("status") == "running"
                    else _wait_running(client, native, sandbox_id, deadline)
                )
            except (_GuestGone, native.NotFoundError):
                guest_ids.forget(name, sandbox_id)
            else:
                guest_ids.remember(name, sandbox_id)
                return running, True
        if time.monotonic() >= deadline:
            raise SandboxExecutionError(
                f"CreateOS: could not find or create the reused guest {name} within "
                f"{GUEST_READY_SECONDS:g} s (it may still be being destroyed); retry later."
            )
        attempt += 1
        time.sleep(_sleep_step(attempt))


def _delete_expired(endpoint: connection.Endpoint, record: dict[str, Any], limit: float) -> None:
    sandbox_id = str(record["id"])
    logger.info(
        "deleting reused guest %s (%s): idle %.0f s, past CREATEOS_SANDBOX_REUSE_IDLE_SECONDS=%g",
        sandbox_id,
        record.get("name"),
        idle_seconds(record) or 0.0,
        limit,
    )
    Lease.kept(endpoint, sandbox_id).delete()  # already gone (404) is as good


class _Sweeper:
    """Deletes every reused guest (`lf-c-`) idle past the lifetime, at most once per
    SWEEP_INTERVAL_SECONDS per process, from reused runs: a guest whose user never comes back
    is gone by the next reused run anyone makes after its lifetime, without a cron job."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last = float("-inf")

    def due(self) -> bool:
        with self._lock:
            now = time.monotonic()
            if now - self._last < SWEEP_INTERVAL_SECONDS:
                return False
            self._last = now
            return True

    def reset(self) -> None:
        with self._lock:
            self._last = float("-inf")

    def sweep(self, endpoint: connection.Endpoint, limit: float) -> list[str]:
        """Best effort: a failure is logged and the run goes on."""
        native = load_native()
        client = endpoint.client
        deleted: list[str] = []
        try:
            rows = client.list(prefix=NAME_PREFIX)
            now = time.time()
            for row in rows:
                if len(deleted) >= SWEEP_MAX_DELETES:
                    break
                name = str(row.get("name") or "")
                if not name.startswith(NAME_PREFIX) or row.get("status") != "paused":
                    continue
                record = row if "paused_at" in row else client.get(str(row["id"]))
                if idle_expired(record, limit, now):
                    _delete_expired(endpoint, record, limit)
                    guest_ids.forget(name, str(record["id"]))
                    deleted.append(str(record["id"]))
        except native.CreateOSError as exc:
            logger.warning("sweeping idle reused guests failed: %s", failures.describe(exc))
        return deleted


sweeper = _Sweeper()


def resume_retry(client: Client, native: ModuleType, sandbox_id: str) -> Callable[[Callable[[], T]], T]:
    """Call `fn`; if the guest answers 409 because it paused meanwhile, resume it and retry once."""

    def call(fn: Callable[[], T]) -> T:
        try:
            return fn()
        except native.ConflictError as exc:
            try:
                status = client.get(sandbox_id).get("status")
            except native.CreateOSError:
                raise exc from None
            if status == "running" and "paused" not in str(exc):
                raise
            logger.info("guest %s was %s at use; resuming it and retrying once", sandbox_id, status)
            try:
                _wait_running(client, native, sandbox_id, time.monotonic() + GUEST_READY_SECONDS)
            except _GuestGone:
                raise exc from None
            return fn()

    return call
