"""The ``createos`` whole-flow executor's class: lfx's contract, one run in named steps.

One run: its slot in the executor's admission line (``lease.EXECUTOR``), the run spec
(``spec.run_spec``), a guest (``run._Run``: created and held by a guest lease, or a pooled one
whose runner waits for its spec, ``pool.py``), one streaming exec whose frames become lfx's
steps (``_GuestFrames``), the guest deleted off the run's path, and the slot given back once
that delete returned. The package's docstring (``executor/__init__.py``) says what the
executor covers and which options it understands.

Importing this module is cheap and reads no settings.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from lfx.execution.executor import Executor
from lfx.execution.types import RunComplete, StepResult
from lfx.utils.sandbox.base import SandboxExecutionError, SandboxUnavailableError

from langflow_sandbox_createos.core import connection, failures, lease
from langflow_sandbox_createos.core.settings import ExecutorSettings
from langflow_sandbox_createos.executor import pool, reuse
from langflow_sandbox_createos.executor.bridge import SandboxBridge
from langflow_sandbox_createos.executor.framing import ONCE
from langflow_sandbox_createos.executor.guest.zygote import EXIT_NO_ZYGOTE
from langflow_sandbox_createos.executor.replay import HostReplay
from langflow_sandbox_createos.executor.results import GuestStatus, decode_outputs, decode_vertex
from langflow_sandbox_createos.executor.run import (
    ACCEPT_SECONDS,
    _Run,
    forwarded_env,
    run_failure,
    version_text,
)
from langflow_sandbox_createos.executor.spec import REPLY_DIR, guest_knowledge, run_spec
from langflow_sandbox_createos.executor.timeline import Timeline
from langflow_sandbox_createos.executor.tracing import HostTrace

if TYPE_CHECKING:
    from lfx.execution.types import Unit

logger = logging.getLogger("langflow_sandbox_createos.executor")


class CreateOSExecutor(Executor):
    """Runs whole flows on disposable CreateOS guests. Stateless: one shared instance serves
    concurrent runs; everything a run owns lives in that run's generator."""

    kind: ClassVar[str] = "createos"

    async def execute(self, unit: Unit) -> AsyncIterator[StepResult | RunComplete]:
        from lfx.graph.graph.constants import Finish

        timeline = Timeline()
        options = dict(unit.runtime_options or {})
        spec, cfg, endpoint = await run_spec(unit.graph, list(unit.inputs or []), options)
        timeline.mark("spec")
        replay = HostReplay(options.get("event_manager"), unit.graph, spec)
        trace = HostTrace(unit.graph, spec)
        domain = _domain(endpoint, cfg, spec, unit.graph)
        # a run that lands on a warm guest of its domain with a run to spare boots nothing: it
        # takes no place in the line (CREATEOS_EXECUTOR_MAX_GUESTS paces guests, not their runs)
        warm = reuse.domains.try_take(domain) if domain is not None else None
        slot = None
        if warm is None:
            enter = functools.partial(
                lease.EXECUTOR.enter,
                cfg.max_guests,
                cfg.max_wait_seconds,
                tell=functools.partial(_tell_events, options),
            )
            subject = f"flow {spec.get('flow_id') or '(no id)'}"
            if domain is not None and reuse.domains.serving(domain):
                warm, slot = await _slot_or_spare(domain, enter, cfg.max_wait_seconds, subject)
            else:
                slot = await enter(subject=subject)
        timeline.mark("line")
        run: _Run | None = None
        bridge: SandboxBridge | None = None
        started = time.monotonic()
        status = "failed"  # until RunComplete is out
        failure: BaseException | None = None
        try:
            early: list[tuple[str, Any]] = []
            if domain is not None:
                taken, warm = warm, None  # _take_reused owns it now (and gives it back)
                run, early = await _take_reused(endpoint, cfg, spec, domain, taken, timeline)
            if run is None and cfg.warm_pool and "install" not in spec:
                run, early = await _take_warm(endpoint, cfg, spec, timeline)
            if run is None:
                run = _Run(endpoint, cfg, spec)
                await run.create()
                timeline.mark("create")
                run.start_exec(await run.stage())
            run.timeline = timeline
            replay.reply = run.reply
            bridge = SandboxBridge(unit.graph, spec, run.reply)
            frames = _GuestFrames(run, cfg, endpoint, replay, bridge, trace)
            async for step in frames.steps(_reports(run, early), timeline):
                yield step
            status = "ok"  # a consumer may stop iterating at RunComplete: the run is done by now
            yield StepResult(payload=Finish())
            timeline.mark("complete")
            yield RunComplete(outputs=frames.result)
        except BaseException as exc:
            failure = exc
            if warm is not None:  # taken, never used: nothing ran on it
                warm.give_back(gone=False)
            raise
        finally:
            try:
                if bridge is not None:
                    await bridge.close()  # may be cancelled: the guest is deleted all the same
                    timeline.mark("bridge")
            finally:
                _close(run, slot, timeline)
            await _end_trace(trace, failure if status != "ok" else None)
            _log_run(spec, run, bridge, started, status)
            timeline.log(status, run.sandbox_id if run is not None else None)

    @staticmethod
    def shutdown() -> None:
        """Delete every pooled and reused guest of this process now (interpreter exit does it too)."""
        pool.shutdown()
        reuse.domains.shutdown()


class _GuestFrames:
    """What one run does with each frame its guest sends: host-side effects (messages, events,
    sandboxed nodes) are applied, vertex events and the guest's status go to the caller, and
    the rest is kept for the run's end (`outputs`)."""

    def __init__(
        self,
        run: _Run,
        cfg: ExecutorSettings,
        endpoint: connection.Endpoint,
        replay: HostReplay,
        bridge: SandboxBridge,
        trace: HostTrace,
    ) -> None:
        self.run = run
        self.cfg = cfg
        self.endpoint = endpoint
        self.replay = replay
        self.bridge = bridge
        self.trace = trace
        self.kept: dict[str, Mapping[str, Any]] = {}  # the first frame of each other type
        self.result: list[Any] = []  # the run's outputs, once `steps` has ended

    async def steps(
        self, reports: AsyncIterator[tuple[str, Any]], timeline: Timeline
    ) -> AsyncIterator[StepResult]:
        """The caller's steps from what the guest's exec reports, until the runner's last frame
        (its exit is not waited for) or the exec's end; then `result` holds the run's outputs,
        or this raises the error the run's end stands for."""
        result = None
        async for kind, item in reports:
            if kind == "error":
                raise item
            if kind == "end":
                timeline.mark("end")
                result = item
                break
            if timeline.enabled:
                timeline.mark_once(item["t"])
            step = await self.handle(item)
            if step is not None:
                yield step
            if item["t"] == "done":  # the runner's last frame: its exit is not waited for
                break
        self.result = self.outputs(result)
        timeline.guest_phases(self.kept.get("done", {}).get("phases"))

    async def handle(self, frame: Mapping[str, Any]) -> StepResult | None:
        """The step one frame gives the caller, if any."""
        frame_type = frame["t"]
        if await self.replay.handle(frame):
            return None
        if frame_type == "sandbox":
            self.bridge.handle(frame)
            return None
        if frame_type == "trace":
            self.trace.handle(frame)
            return None
        if frame_type == "vertex":
            try:
                event = decode_vertex(frame)
            except Exception as exc:
                raise SandboxExecutionError(
                    f"CreateOS executor: unreadable vertex event from the guest: {exc}"
                ) from None
            return StepResult(payload=event)
        if frame_type in ONCE and frame_type in self.kept:
            # the runner writes these once, before (or after) any flow code runs: a
            # second one is flow code that learnt the frame secret
            raise SandboxExecutionError(
                f"CreateOS executor: the guest sent a second {frame_type!r} frame; the run "
                "was stopped (docs/executor.md, frame limits)."
            )
        self.kept.setdefault(frame_type, frame)
        if frame_type == "ready":
            return StepResult(payload=self._ready(frame))
        return None

    def _ready(self, frame: Mapping[str, Any]) -> GuestStatus:
        lfx_version = version_text(frame.get("lfx"))
        if not frame.get("installed"):
            guest_knowledge.record(self.endpoint.base_url, self.cfg.rootfs, lfx_version)
        return GuestStatus(
            status="ready",
            sandbox_id=self.run.sandbox_id,
            rootfs=self.cfg.rootfs,
            lfx_version=lfx_version,
            installed=bool(frame.get("installed")),
            pooled=self.run.pooled,
            reused=self.run.reused is not None,
            standby=self.run.standby,
        )

    def outputs(self, result: Any) -> list[Any]:
        """The run's outputs once its exec ended (`result`), or the error its end stands for."""
        error = run_failure(self.cfg, self.kept, result, self.run.stderr_text())
        if error is not None:
            raise error
        try:
            outputs = decode_outputs(self.kept["outputs"])
        except Exception as exc:
            raise SandboxExecutionError(
                f"CreateOS executor: unreadable outputs from the guest: {exc}"
            ) from None
        if self.run.plain_lines:
            logger.debug("CreateOS executor: %d unframed stdout line(s) ignored", self.run.plain_lines)
        return outputs


async def _end_trace(trace: HostTrace, failure: BaseException | None) -> None:
    """The run's trace ends here if the guest did not end it (a failed run: with its error);
    a cancelled run does not wait for the tracers."""
    try:
        await trace.close(failure)
    except BaseException:  # cancelled, or a tracer's failure: tracing never fails a run
        logger.debug("CreateOS executor: the run's trace was not closed", exc_info=True)


def _close(run: _Run | None, slot: lease.Slot | None, timeline: Timeline) -> None:
    """The run is over: its guest is deleted off its path, and its slot in the line is held
    until that delete returned (never more guests than the limit). The slot is left by
    `_deleted` once the delete returned (close_soon calls it, at once when there is no
    guest), or here when there is no run or close_soon could not start its thread."""
    if run is None:
        _leave(slot)
        return
    try:
        run.close_soon(then=functools.partial(_deleted, run, slot, timeline))
    except BaseException:
        _leave(slot)
        raise
    timeline.mark("closed")


def _leave(slot: lease.Slot | None) -> None:
    if slot is not None:  # None: a run on a warm reused guest, which took no place in the line
        slot.leave()


def _deleted(run: _Run, slot: lease.Slot | None, timeline: Timeline) -> None:
    """A run's guest delete returned (in its thread): the run's slot in the line is free."""
    _leave(slot)
    timeline.log("deleted", run.sandbox_id)


def _tell_events(options: Mapping[str, Any], text: str) -> None:
    """A run that waits in line says so in its own events too (a log event, as a component's
    log reaches the canvas)."""
    callback = getattr(options.get("event_manager"), "on_log", None)
    if callable(callback):
        try:
            callback(data={"name": "CreateOS executor", "message": text, "type": "text"})
        except Exception:  # telling the caller is best effort; the wait itself is what matters
            logger.debug("could not emit the waiting-in-line event", exc_info=True)


def _log_run(
    spec: Mapping[str, Any],
    run: _Run | None,
    bridge: SandboxBridge | None,
    started: float,
    status: str,
) -> None:
    """One info line per executor run: which guest, how long, how it ended."""
    sandboxed = f", {bridge.served} sandboxed node run(s) on the host" if bridge and bridge.asked else ""
    if bridge is not None and bridge.refused:
        sandboxed += f", {bridge.refused} refused"
    logger.info(
        "CreateOS executor: flow %s ran on guest %s%s in %.2f s: %s%s",
        spec.get("flow_id") or "(no id)",
        (run.sandbox_id if run is not None else None) or "(none)",
        " (pooled)"
        if run is not None and run.pooled
        else " (reused)"
        if run is not None and run.reused
        else "",
        time.monotonic() - started,
        status,
        sandboxed,
    )


async def _reports(run: _Run, early: list[tuple[str, Any]]) -> AsyncIterator[tuple[str, Any]]:
    """What the guest's exec reported before the run took it, then what it reports live."""
    for item in early:
        yield item
    while True:
        yield await run.queue.get()


def _domain(
    endpoint: connection.Endpoint, cfg: ExecutorSettings, spec: dict[str, Any], graph: Any
) -> reuse.DomainKey | None:
    """The run's trust domain when reused guests serve it (``CREATEOS_EXECUTOR_REUSE``, no
    per-run install), else None: a throwaway guest."""
    if not cfg.reuse or "install" in spec:
        return None
    key = reuse.domain_key(
        endpoint, cfg, forwarded_env(cfg), spec.get("flow_id"), reuse.run_owner(graph, spec)
    )
    if key is None:
        logger.debug("CreateOS executor: a run without a flow id or an owner gets a guest of its own")
    return key


async def _slot_or_spare(
    key: reuse.DomainKey, enter: Callable[..., Awaitable[lease.Slot]], max_wait: float | None, subject: str
) -> tuple[reuse.WarmGuest | None, lease.Slot | None]:
    """A run whose domain's guests are all busy: a place in the line, as any run (then a spare
    run or a new guest, ``_take_reused``). The line's estimate counts guests to be made, not
    the runs of warm ones, so if it refuses, the run waits instead for a run of its domain's
    guests to come free, within `max_wait` of its arrival; the refusal stands (at once, when the
    domain's own runs are expected to take longer than that) only if none does."""
    loop = asyncio.get_running_loop()
    arrived = loop.time()
    try:
        return None, await enter(subject=None)  # a refusal is logged below if it stands
    except SandboxUnavailableError as exc:
        if not isinstance(exc.__cause__, failures.CapacityError):
            raise
        refused = exc
    left = None if not max_wait else max(0.0, max_wait - (loop.time() - arrived))
    expected = reuse.domains.expected_spare_wait(key)
    if left is None or expected is None or expected <= left:
        spare = asyncio.ensure_future(reuse.domains.wait_take(key))
        used = False
        try:
            done, _ = await asyncio.wait({spare}, timeout=left)
            if spare in done:
                used = True
                return spare.result(), None
        finally:
            if not used:  # timed out, or the run was cancelled: a run taken in that instant goes back
                spare.cancel()
                spare.add_done_callback(_give_unused_back)
    logger.warning("%s (%s)", refused, subject)
    raise refused


def _give_unused_back(waiting: asyncio.Future[reuse.WarmGuest]) -> None:
    """A wait for a spare run that the run gave up, once ended: a run it took goes back."""
    if not waiting.cancelled() and waiting.exception() is None:
        waiting.result().give_back(gone=False)


async def _take_reused(
    endpoint: connection.Endpoint,
    cfg: ExecutorSettings,
    spec: dict[str, Any],
    key: reuse.DomainKey,
    taken: reuse.WarmGuest | None,
    timeline: Timeline,
) -> tuple[_Run, list[tuple[str, Any]]]:
    """The run on a reused guest of its trust domain (``reuse.py``: `taken`, or one acquired
    now): the guest's standby run, which took the spec, or one its warm runner forked now (its
    first report is in hand). A guest whose warm runner is gone is replaced, once, before
    anything of the run ran on it."""
    for _ in range(2):
        warm = taken if taken is not None else await reuse.domains.acquire(key, spec.get("graph"))
        taken = None
        timeline.mark("take")
        standby = warm.take_standby()
        if standby is not None:  # the run's process waits already: it needs only the spec
            spec["reply_dir"] = _own_reply_dir(standby)
            try:
                early, reason = await _hand_over(standby, spec, timeline, "reused guest")
            except BaseException:
                standby.close_soon()
                raise
            if reason is None:
                return standby, early
            logger.info(
                "CreateOS executor: the standby run of reused guest %s was not usable (%s); forking one",
                warm.sandbox_id,
                reason,
            )
            standby.discard()
        try:
            run = _Run(endpoint, cfg, spec, reused=warm)
        except BaseException:
            warm.give_back(gone=False)  # nothing ran on it
            raise
        spec["reply_dir"] = _own_reply_dir(run)
        try:
            run.start_exec(await run.stage())
            first = await run.queue.get()
        except BaseException:
            run.close_soon()
            raise
        if first[0] == "end" and getattr(first[1], "exit_code", None) == EXIT_NO_ZYGOTE:
            logger.info(
                "CreateOS executor: reused guest %s has no warm runner; using another", warm.sandbox_id
            )
            run.close_soon()  # the guest goes (nothing of the run ran on it)
            continue
        return run, [first]
    raise SandboxExecutionError(
        "CreateOS executor: two reused guests of this flow had no warm runner in a row; the run was not started."
    )


def _own_reply_dir(run: _Run) -> str:
    """A reused guest's run's own reply directory (the guest is shared by runs of its domain)."""
    return f"{REPLY_DIR}/{run.token[:16]}"


async def _take_warm(
    endpoint: connection.Endpoint, cfg: ExecutorSettings, spec: dict[str, Any], timeline: Timeline
) -> tuple[_Run | None, list[tuple[str, Any]]]:
    """A pooled guest that has accepted this run's spec, with what it reported while it
    waited; (None, []) when no guest is ready or the one taken turned out stale (it is then
    deleted, and nothing of this run has run on it)."""
    run, key = pool.take(endpoint, cfg, forwarded_env(cfg))
    if run is None:
        return None, []
    timeline.mark("take")
    try:
        early, reason = await _hand_over(run, spec, timeline, "pooled guest")
    except BaseException:
        await run.close()
        raise
    if reason is None:
        return run, early
    pool.note_stale(key, run.sandbox_id or "?")
    logger.info(
        "CreateOS executor: pooled guest %s was not usable (%s); using a fresh one", run.sandbox_id, reason
    )
    await run.close()
    return None, []


async def _hand_over(
    run: _Run, spec: dict[str, Any], timeline: Timeline, what: str
) -> tuple[list[tuple[str, Any]], str | None]:
    """Give `spec` to a runner started ahead (a pooled guest's, a reused guest's standby):
    (what it reported, up to its `accepted`; None) once it took the run, or ([], why) when it
    cannot have begun it (the run may go elsewhere). A stream that broke after the upload
    fails the run: whether it began there is unknown."""
    early = run.attach()
    if any(kind != "frame" for kind, _ in early):
        return [], "its runner had already exited"
    if not await run.deliver(spec):
        return [], "it refused the spec (paused or deleted)"
    timeline.mark("delivered")
    while True:
        try:
            kind, item = await asyncio.wait_for(run.queue.get(), ACCEPT_SECONDS)
        except asyncio.TimeoutError:  # not the builtin TimeoutError on Python 3.10
            raise SandboxExecutionError(
                f"CreateOS executor: the {what} {run.sandbox_id} did not pick up the run "
                f"within {ACCEPT_SECONDS:g} s; it was deleted and the run was not started."
            ) from None
        if kind == "frame" and item.get("t") == "accepted":
            timeline.mark("accepted")
            early.append((kind, item))
            return early, None
        if kind == "frame":
            early.append((kind, item))
        elif kind == "end":  # a complete stream without `accepted`: nothing ran
            return [], "its runner exited before taking the run"
        else:  # the stream broke: whether the run began there is unknown, so fail closed
            raise SandboxExecutionError(
                f"CreateOS executor: the stream of {what} {run.sandbox_id} broke while "
                f"it took the run ({item}); it was deleted and the run was not retried."
            )
