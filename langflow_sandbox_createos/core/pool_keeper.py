"""No guest outlives its process: a keeper process deletes what a dead process left behind.

Every guest this process creates for a run or a pool (the backend's and the component's runs,
the executor's runs, the warm pools) is *held* from the moment
its create returned an id until its delete succeeded or answered 404: :func:`hold` and
:func:`delete` (or :func:`release`, where the delete happened elsewhere: the native client's
background queue). A delete that fails otherwise leaves the guest held. The component's
reused guests are not held: they outlive the process on purpose, shared by other workers.

Runs and pools delete their guests themselves, and a warm pool also at ``shutdown()`` and
interpreter exit. None of that runs when the process is killed, or leaves through
``os._exit``, which is how a server usually ends: Langflow runs gunicorn inside a
``multiprocessing`` child, whose workers exit with ``os._exit`` (atexit handlers never run),
and gunicorn's quick shutdown (SIGINT, Ctrl-C) sends its workers SIGQUIT, which uvicorn leaves
at the default action (the process dies on the spot). Each such stop left the guests of runs
in flight and pooled guests running on the control plane.

So each process starts, per endpoint, one keeper: a small child process in a session of its
own (a Ctrl-C to the terminal's process group does not reach it) that reads ``+<id>`` /
``-<id>`` lines on a pipe (``+`` at :func:`hold`, ``-`` at release). When the pipe reaches end
of file (the process ended, however it ended) the keeper deletes every guest still held, says
so on stderr and exits. A process that deleted its guests leaves it nothing to do. A fork
child forgets the parent's keepers and what they hold (``os.register_at_fork``): it never
deletes the parent's guests, and starts keepers of its own for the guests it creates.

The key reaches the keeper through its environment, never its argv. The keeper imports only
the native client.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
import time
from typing import IO, TYPE_CHECKING

from langflow_sandbox_createos.core import hooks, with_this_package_importable

if TYPE_CHECKING:
    from langflow_sandbox_createos._createos import Client
    from langflow_sandbox_createos.core.connection import Endpoint

logger = logging.getLogger("langflow_sandbox_createos.pool_keeper")

ENV_URL = "CREATEOS_POOL_KEEPER_URL"
ENV_KEY = "CREATEOS_POOL_KEEPER_KEY"
ENV_TIMEOUT = "CREATEOS_POOL_KEEPER_CONTROL_TIMEOUT"
ENV_OWNER = "CREATEOS_POOL_KEEPER_OWNER"
DELETE_BUDGET_SECONDS = 60.0  # all deletes together, after the owner died


class Keeper:
    """The owner's side: one per (process, endpoint). Thread-safe; never raises.

    The pipe is a raw descriptor written with one ``os.write`` per line (atomic below
    PIPE_BUF), so a fork in the middle of a write never leaves half a line buffered in the
    child, and the child can drop its copy with ``os.close`` alone."""

    def __init__(self, base_url: str, key: str, control_timeout: float) -> None:
        self.base_url = base_url
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._start(key, control_timeout)

    def _start(self, key: str, control_timeout: float) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CREATEOS_")}
        env.update(
            {
                ENV_URL: self.base_url,
                ENV_KEY: key,
                ENV_TIMEOUT: str(control_timeout),
                ENV_OWNER: str(os.getpid()),
            }
        )
        with_this_package_importable(env)
        read_end, write_end = os.pipe()  # both close-on-exec: no other child inherits them
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "langflow_sandbox_createos.core.pool_keeper"],
                stdin=read_end,
                stdout=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # the terminal's Ctrl-C is for the server, not for us
            )
            self._fd = write_end
        except OSError as exc:
            os.close(write_end)
            logger.warning(
                "CreateOS: could not start the guest keeper (%s); the guests of a killed process are "
                "then left to auto-pause",
                exc,
            )
        finally:
            os.close(read_end)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _send(self, line: str) -> None:
        data = line.encode("ascii") + b"\n"
        with self._lock:
            if self._fd is None:
                return
            try:
                os.write(self._fd, data)
            except OSError:  # the keeper is gone: nothing more to tell it
                os.close(self._fd)
                self._fd = None

    def hold(self, sandbox_id: str) -> None:
        self._send(f"+{sandbox_id}")

    def release(self, sandbox_id: str) -> None:
        self._send(f"-{sandbox_id}")

    def close(self) -> None:
        """End of file for the keeper (it deletes what is still held and exits)."""
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def forget_after_fork(self) -> None:
        """In a fork child: drop our copy of the pipe so the keeper still sees its owner end."""
        fd, self._fd, self._proc = self._fd, None, None
        self._lock = threading.Lock()
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


class _Keepers:
    """This process's keepers, one per endpoint (base URL and key digest), and which keeper
    holds which guest (a delete knows only the guest's id)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_endpoint: dict[tuple[str, str], Keeper] = {}
        self._held: dict[str, Keeper] = {}

    def for_endpoint(self, endpoint: Endpoint) -> Keeper:
        """The keeper for this endpoint (base URL and key digest), started on first use with the
        endpoint's own key and control timeout."""
        with self._lock:
            keeper = self._by_endpoint.get((endpoint.base_url, endpoint.key_digest))
            if keeper is None:
                keeper = Keeper(endpoint.base_url, endpoint.key.value, endpoint.control_timeout)
                self._by_endpoint[(endpoint.base_url, endpoint.key_digest)] = keeper
            return keeper

    def hold(self, endpoint: Endpoint, sandbox_id: str) -> None:
        if not _one_line(sandbox_id):  # ids are short ASCII tokens; anything else would garble the pipe
            logger.warning("CreateOS: guest id %r cannot be told to the guest keeper", sandbox_id)
            return
        keeper = self.for_endpoint(endpoint)
        # the map and the line change together: a release racing this hold cannot reach the
        # keeper before the `+` it undoes
        with self._lock:
            self._held[sandbox_id] = keeper
            keeper.hold(sandbox_id)

    def release(self, sandbox_id: str) -> None:
        with self._lock:
            keeper = self._held.pop(sandbox_id, None)
            if keeper is not None:
                keeper.release(sandbox_id)

    def held_ids(self) -> set[str]:
        """The guests a keeper of this process would delete if it ended now (tests, logs)."""
        with self._lock:
            return set(self._held)

    def close_all(self) -> None:
        with self._lock:
            keepers = list(self._by_endpoint.values())
            self._by_endpoint.clear()
            self._held.clear()
        for keeper in keepers:
            keeper.close()

    def forget_after_fork(self) -> None:
        for keeper in self._by_endpoint.values():
            keeper.forget_after_fork()
        self._lock = threading.Lock()  # another thread of the parent may have held it at fork
        self._by_endpoint = {}
        self._held = {}  # the parent's keepers hold the parent's guests


def _one_line(sandbox_id: str) -> bool:
    return bool(sandbox_id) and sandbox_id.isascii() and sandbox_id.isprintable() and " " not in sandbox_id


keepers = _Keepers()
hooks.after_fork("guest keepers", keepers.forget_after_fork)


def hold(endpoint: Endpoint, sandbox_id: str) -> None:
    """Call as soon as a create returned ``sandbox_id``: from now until the guest is deleted,
    the endpoint's keeper deletes it if this process ends first. Never raises."""
    keepers.hold(endpoint, sandbox_id)


def release(sandbox_id: str) -> None:
    """The guest is gone (deleted, or 404): the keeper forgets it. A no-op for an id this
    process does not hold (another process's guest, or one released already)."""
    keepers.release(sandbox_id)


def delete(client: Client, sandbox_id: str) -> None:
    """Delete a guest and release it once it is gone (deleted, or already gone: 404). Any
    other failure raises, and the guest stays held: the keeper tries again at exit."""
    try:
        client.delete(sandbox_id)
    except Exception as exc:
        if getattr(exc, "status", None) != 404:
            raise
    release(sandbox_id)


# --- the keeper process ---------------------------------------------------------------------


def _serve(stream: IO[bytes]) -> set[str]:
    held: set[str] = set()
    for raw in stream:
        line = raw.decode("ascii", "replace").strip()
        if line.startswith("+"):
            held.add(line[1:])
        elif line.startswith("-"):
            held.discard(line[1:])
    return held


def main() -> int:
    import signal

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)  # our owner's end is our only signal
    url, key = os.environ.pop(ENV_URL, ""), os.environ.pop(ENV_KEY, "")
    control_timeout = float(os.environ.pop(ENV_TIMEOUT, "30") or 30)
    owner = os.environ.pop(ENV_OWNER, "?")
    held = _serve(sys.stdin.buffer)
    if not held or not url or not key:
        return 0
    from langflow_sandbox_createos import _createos

    client = _createos.Client(url, key, control_timeout=min(control_timeout, DELETE_BUDGET_SECONDS))
    deadline = time.monotonic() + DELETE_BUDGET_SECONDS
    deleted, failed = 0, []
    for sandbox_id in sorted(held):
        if time.monotonic() >= deadline:
            failed.append(sandbox_id)
            continue
        try:
            client.delete(sandbox_id)
            deleted += 1
        except _createos.CreateOSError as exc:
            if getattr(exc, "status", None) == 404:
                deleted += 1
            else:
                failed.append(sandbox_id)
    print(
        f"langflow-sandbox-createos: the process that created {len(held)} guest(s) ended without deleting "
        f"them; deleted {deleted}"
        + (f", could not delete {', '.join(failed)} (auto-pause bounds their cost)" if failed else "")
        + f" (keeper of pid {owner})",
        file=sys.stderr,
        flush=True,
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
