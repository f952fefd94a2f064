"""What this process does after a fork (in the child) and at interpreter exit, in one place and
in a stated order, not in the order modules happened to be imported.

A module that keeps per-process state registers its hook under one of the names below; the
registry runs them in that order. Standard library only; importing it reads no settings.

After a fork, in the child: the parent's clients, keepers, admission lines, pools and threads
belong to the parent, so each is forgotten (never closed or deleted: they are the parent's).

At exit: first the guest deletes still running in their threads get a moment (a short `lfx
run` ends right after its run), then the warm pools delete their guests, then the native
clients' background deletes are drained and each outcome is logged. What is left after that
is the guest keeper's (``core/pool_keeper.py``).
"""

from __future__ import annotations

import atexit
import logging
import os
from collections.abc import Callable

logger = logging.getLogger("langflow_sandbox_createos")

AFTER_FORK = (
    "endpoints",  # core/connection.py: the native clients (their sockets and I/O threads)
    "guest keepers",  # core/pool_keeper.py: the keeper processes and what they hold
    "admission lines",  # core/admission.py: runs in flight and waiting
    "warm pools",  # core/warm_pool.py: pooled guests and refill workers
    "guest deletes",  # core/lease.py: deletes running in threads
    "bridge threads",  # executor/bridge.py: the bridge's thread pool
    "reused guests",  # executor/reuse.py: the warm executor's guests per trust domain
)
AT_EXIT = (
    "guest deletes",  # core/lease.py: wait a little for deletes running in threads
    "warm pools",  # core/warm_pool.py: delete every pooled guest
    "reused guests",  # executor/reuse.py: delete every reused executor guest
    "delete outcomes",  # core/connection.py: drain the background deletes, log each outcome
)

_after_fork: dict[str, Callable[[], None]] = {}
_at_exit: dict[str, Callable[[], None]] = {}


def after_fork(name: str, hook: Callable[[], None]) -> None:
    """Run ``hook`` in every fork child, at its place in AFTER_FORK."""
    if name not in AFTER_FORK:
        raise ValueError(f"{name!r} is not an after-fork hook (AFTER_FORK)")
    _after_fork[name] = hook


def at_exit(name: str, hook: Callable[[], None]) -> None:
    """Run ``hook`` at interpreter exit, at its place in AT_EXIT."""
    if name not in AT_EXIT:
        raise ValueError(f"{name!r} is not an exit hook (AT_EXIT)")
    _at_exit[name] = hook


def _run(order: tuple[str, ...], hooks: dict[str, Callable[[], None]]) -> None:
    for name in order:
        hook = hooks.get(name)
        if hook is None:
            continue
        try:
            hook()
        except Exception:  # one hook's failure must not keep the others from running
            logger.debug("the %r hook failed", name, exc_info=True)


def run_after_fork() -> None:
    _run(AFTER_FORK, _after_fork)


def run_at_exit() -> None:
    _run(AT_EXIT, _at_exit)


atexit.register(run_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=run_after_fork)
