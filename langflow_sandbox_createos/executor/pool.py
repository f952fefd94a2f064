"""Warm pool for the whole-flow executor: guests whose runner already has lfx loaded.

Opt-in with ``CREATEOS_EXECUTOR_WARM_POOL=N`` (0..16, default 0). The pool machinery (keys,
background refill, expiry, shutdown, atexit, fork) is the backend's :mod:`warm_pool`; this
module adds what a warm executor guest is:

- **Warm-up** (a pool worker thread, off every run's critical path): create the guest
  (``lf-xw-...``), start the one streaming exec of the guest runner with ``wait`` instead of a
  spec on its stdin, and wait until the runner reports ``waiting``: the interpreter is up and
  lfx plus everything a run imports is loaded. The exec stays open; its frames are kept.
- **A run** takes a ready guest (no request), uploads its spec to the path the runner polls
  (``PUT .../files``, authenticated with the runner's per-guest secret), and reads the rest of
  the stream that has been open since warm-up. One run per guest; the guest is deleted after.
- **Stale guests.** A guest whose exec ended (runner died, stream broke, guest deleted) is
  dropped at ``take`` without a request. A paused or deleted one refuses the upload (409/404),
  so the spec never reaches it. A runner that dies between the upload and its ``accepted``
  frame ends the stream without ``accepted``: nothing of the run ran there. In all three cases
  the run falls back to a fresh guest, so nothing runs twice.
- **Refills count against CREATEOS_EXECUTOR_MAX_GUESTS.** A warm-up boots a guest and imports
  lfx, the same work as a cold run, so each one holds a slot of the executor's admission line
  from its create until its runner is waiting. It starts only when a slot is spare (no run
  waits, fewer than the limit in flight), so a pool never makes a run wait and never boots more
  guests at once than the limit; refills left over resume as runs leave.
- **Bounded idle life.** A pooled guest is handed out only within
  ``CREATEOS_EXECUTOR_WARM_POOL_IDLE_SECONDS`` of its create; its runner gives up waiting a
  little later, and the guest's auto-pause covers idle life plus the run's timeout.
"""

from __future__ import annotations

import functools
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from langflow_sandbox_createos.core import budget, connection, guest_spec, lease, warm_pool
from langflow_sandbox_createos.core.guest_spec import GuestSpec
from langflow_sandbox_createos.core.settings import ExecutorSettings
from langflow_sandbox_createos.executor.run import SPEC_PATH, _Run, compact_json, runner_stdin

logger = logging.getLogger("langflow_sandbox_createos.executor")

NAME_PREFIX = "lf-xw-"
# How long a warm-up may take (interpreter start plus lfx import on a loaded guest).
WARM_TIMEOUT_SECONDS = 300.0
# The runner waits this much longer than the host hands its guest out.
WAIT_MARGIN_SECONDS = 30
POLL_SECONDS = 0.02


@dataclass(frozen=True, repr=False, kw_only=True)
class ExecutorPoolKey(GuestSpec):
    """A guest spec (env values sent at create and compared, never shown) plus what an
    executor runner is started with: two pooled guests with equal keys are interchangeable."""

    timeout_seconds: int
    idle_seconds: int
    max_output_bytes: int
    cfg: ExecutorSettings = field(compare=False)

    def lifetime_seconds(self) -> float:
        return float(self.idle_seconds)

    def idle_window_seconds(self) -> float:
        return float(self.idle_seconds)


def pool_key(endpoint: connection.Endpoint, cfg: ExecutorSettings, envs: dict[str, str]) -> ExecutorPoolKey:
    return ExecutorPoolKey(
        endpoint=endpoint,
        shape=cfg.shape,
        rootfs=cfg.rootfs,
        egress=tuple(cfg.egress),
        auto_pause_seconds=budget.executor(
            cfg.timeout_seconds, spec_wait=_spec_wait(cfg.warm_pool_idle_seconds)
        ).auto_pause_seconds(),
        envs=tuple(sorted(envs.items())),
        timeout_seconds=cfg.timeout_seconds,
        idle_seconds=cfg.warm_pool_idle_seconds,
        max_output_bytes=cfg.max_output_bytes,
        cfg=cfg,
    )


def _spec_wait(idle_seconds: int) -> int:
    """How long a pooled runner waits for its spec: a little longer than the host hands its
    guest out."""
    return idle_seconds + WAIT_MARGIN_SECONDS


@functools.lru_cache(maxsize=1)
def warm_flow() -> dict[str, Any] | None:
    """ChatInput -> ChatOutput as flow JSON, which a waiting runner rebuilds (never runs)."""
    try:
        from lfx.components.input_output import ChatInput, ChatOutput
        from lfx.graph import Graph

        chat_in = ChatInput(_id="warm-in")
        chat_out = ChatOutput(_id="warm-out")
        chat_out.set(input_value=chat_in.message_response)
        return dict(Graph(chat_in, chat_out).dump())
    except Exception:  # an lfx without these components: the runner skips the warm-up build
        logger.debug("CreateOS executor: no warm-up flow", exc_info=True)
        return None


@functools.lru_cache(maxsize=8)
def _wait_json(seconds: float) -> str:
    """What a pooled runner waits for and how, with the warm-up flow (about 24 KB, encoded
    once per process and wait)."""
    return compact_json(
        {"path": SPEC_PATH, "seconds": seconds, "poll": POLL_SECONDS, "warm_flow": warm_flow()}
    )


class _Warmer:
    """Starts a guest's runner and waits until it is ready for a spec (warm_pool.Warmer)."""

    def warm(self, guest: lease.Lease, key: GuestSpec) -> Any:
        assert isinstance(key, ExecutorPoolKey)
        wait = _spec_wait(key.idle_seconds)
        run = _Run(key.endpoint, key.cfg, None, pooled=guest, spec_wait=wait)
        run.start_exec(runner_stdin(run.token, wait=_wait_json(wait)))
        kinds = run.wait_warm(WARM_TIMEOUT_SECONDS)
        if "waiting" in kinds and run.alive():
            return run
        run.discard()
        if "missing_lfx" in kinds:
            raise warm_pool.PoolDisabled(
                f"rootfs {key.rootfs!r} has no importable lfx; the executor's warm pool is off for it"
            )
        raise RuntimeError(
            f"the guest runner did not get ready (reported: {sorted(kinds)}); "
            f"guest stderr (tail): {run.stderr_text()[-500:]}"
        )

    def usable(self, handle: Any) -> bool:
        return bool(handle.alive())

    def discard(self, handle: Any) -> None:
        handle.discard()


def _max_guests(key: GuestSpec) -> int:
    """The limit a refill of ``key`` counts against: its runs' (CREATEOS_EXECUTOR_MAX_GUESTS)."""
    assert isinstance(key, ExecutorPoolKey)
    return key.cfg.max_guests


_lock = threading.Lock()
_pool: warm_pool.WarmPool | None = None


def pool() -> warm_pool.WarmPool:
    """The process's executor pool (created on first use; atexit deletes its guests)."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = warm_pool.WarmPool(
                random_name=guest_spec.random_name,
                prefix=NAME_PREFIX,
                warmer=_Warmer(),
                gate=lease.EXECUTOR.gate(_max_guests),
            )
        return _pool


def take(endpoint: connection.Endpoint, cfg: ExecutorSettings, envs: dict[str, str]) -> tuple[Any, Any]:
    """(a ready warm run, its key) or (None, key) when none is ready. No request."""
    key = pool_key(endpoint, cfg, envs)
    guest = pool().take_guest(key, endpoint, cfg.warm_pool)
    return (guest.handle if guest is not None else None), key


def note_stale(key: Any, sandbox_id: str) -> None:
    pool().note_stale(key, sandbox_id)


def shutdown(timeout: float = warm_pool.SHUTDOWN_SECONDS) -> None:
    """Delete every pooled executor guest now (also done at interpreter exit)."""
    with _lock:
        current = _pool
    if current is not None:
        current.shutdown(timeout)
