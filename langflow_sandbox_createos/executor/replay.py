"""What the host does with a run's guest-side effects, so the caller sees an in-process run:
lfx events replayed into the caller's event manager, chat messages stored in the host's
memory (Langflow's database when it is there), and the history a component reads, fetched
from the host's memory when it asks (never shipped ahead: a flow that reads no history sees
none).

Everything here reads authenticated JSON frames only. Messages are rebuilt with pydantic
validation, never unpickled; the owner and flow of a stored message are the host graph's,
whatever the guest says, so a guest cannot write into another user's or flow's history. Each
memory operation runs with lfx's flow and owner scope bound, as lfx binds it around each
component in-process, so Langflow's own guard holds it to the run's flow and owner; a history
read is held to them here too, whatever filters the guest passes (see `_history`).
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

from lfx.utils.sandbox.base import SandboxExecutionError

from langflow_sandbox_createos.executor import flows

logger = logging.getLogger("langflow_sandbox_createos.executor")

# The most messages one history read returns to the guest (Message History asks for 100).
HISTORY_MAX = 1000
# The filters a history read may pass; its flow and owner are the host's (see _history).
_HISTORY_FILTERS = ("sender", "sender_name", "session_id", "context_id", "order_by", "order")


def _same_id(a: Any, b: Any) -> bool:
    """Two flow or user ids name the same thing (UUIDs compare in any spelling)."""
    if a is None or b is None:
        return False
    try:
        return uuid.UUID(str(a)) == uuid.UUID(str(b))
    except ValueError:
        return str(a) == str(b)


@contextlib.contextmanager
def _message_scope(flow_id: Any, owner: Any, executor: Any) -> Iterator[None]:
    """lfx's flow and owner scope, bound as lfx binds it around each component in-process
    (`get_instance_results`), so the host's memory (Langflow's guard, `_message_scope`) sees the
    read as the component's own."""
    from lfx.memory import flow_context as fc

    tokens = (
        fc.set_current_flow_id(flow_id),
        fc.set_current_message_owner_id(fc.coerce_flow_id(owner)),
        fc.set_current_message_executor_id(fc.coerce_flow_id(executor)),
    )
    try:
        yield
    finally:
        fc.reset_current_message_executor_id(tokens[2])
        fc.reset_current_message_owner_id(tokens[1])
        fc.reset_current_flow_id(tokens[0])


def _owner(graph: Any) -> str | None:
    try:
        from lfx.memory.flow_context import resolve_message_owner_id

        owner = resolve_message_owner_id(graph)
    except Exception:  # an lfx without owner resolution: the executing user
        owner = getattr(graph, "user_id", None)
    return str(owner) if owner else None


class HostReplay:
    """Applies a run's `event`, `store`, `update` and `delete` frames on the host, in order."""

    def __init__(self, event_manager: Any, graph: Any, spec: Mapping[str, Any]) -> None:
        self.event_manager = event_manager
        self.allowed = frozenset(spec.get("events") or ())
        live = graph is not None and not isinstance(graph, (str, bytes, Mapping))
        self.flow_id = spec.get("flow_id")
        # the flows its Run Flow / Sub Flow nodes were given: their messages keep their flow id
        runtime = spec.get("runtime")
        self.subflows = flows.flow_ids(runtime.get("flows") if isinstance(runtime, Mapping) else None)
        self.owner = _owner(graph) if live else None
        # the executing user (a served flow's owner is its end user): Langflow accepts it as a
        # legacy owner hint in a history read, as in-process
        executor = getattr(graph, "user_id", None) if live else None
        self.executor = str(executor) if executor else None
        self.run_id = spec.get("run_id")  # the host graph's (spec._identity)
        # in-process, lfx persists a component's messages only for a graph that keeps them
        # (Langflow's serving plane: not an anonymous run's), with a flow and an owner
        self.persist = (
            spec.get("persist_messages", True) is not False and bool(self.flow_id) and bool(self.owner)
        )
        self.ids: dict[str, str] = {}  # guest message id -> host message id
        self.flows: dict[str, Any] = {}  # host message id -> the flow it was stored under
        # answers a stored message with its host id: (the guest's number for it, the answer)
        self.reply: Callable[[str, Mapping[str, Any]], Awaitable[None]] | None = None
        self.stored = 0

    async def handle(self, frame: Mapping[str, Any]) -> bool:
        """True when the frame was one of ours (and has been applied)."""
        kind = frame.get("t")
        try:
            if kind == "history":
                await self._history(frame)
            elif kind == "event":
                self._event(frame)
            elif kind == "store":
                await self._store(frame)
            elif kind == "update":
                await self._update(frame)
            elif kind == "delete":
                await self._delete(frame)
            else:
                return False
        except SandboxExecutionError:
            raise
        except Exception as exc:
            raise SandboxExecutionError(
                f"CreateOS executor: could not apply the guest's {kind}: {exc}"
            ) from exc
        return True

    def _map_ids(self, data: Any) -> Any:
        if isinstance(data, dict):
            if isinstance(data.get("id"), str) and data["id"] in self.ids:
                data["id"] = self.ids[data["id"]]
            inner = data.get("data")
            if isinstance(inner, dict) and isinstance(inner.get("id"), str) and inner["id"] in self.ids:
                inner["id"] = self.ids[inner["id"]]
        return data

    def _event(self, frame: Mapping[str, Any]) -> None:
        name = frame.get("name")
        if not isinstance(name, str) or name not in self.allowed:
            raise SandboxExecutionError(
                f"CreateOS executor: the guest sent an event nobody registered: {name!r}"
            )
        events = getattr(self.event_manager, "events", None)
        callback = (
            events.get(name) if isinstance(events, Mapping) else getattr(self.event_manager, name, None)
        )
        if callable(callback):
            callback(data=self._map_ids(frame.get("data")))

    def _message(self, frame: Mapping[str, Any]) -> Any:
        from lfx.schema.message import Message

        data = frame.get("message")
        if not isinstance(data, Mapping):
            raise SandboxExecutionError("CreateOS executor: a message frame carries no message")
        return Message.model_validate(dict(data))

    async def _store(self, frame: Mapping[str, Any]) -> None:
        from lfx.memory import astore_message

        message = self._message(frame)
        if not self.persist:  # a guest whose run keeps no messages stores none here either
            logger.warning("CreateOS executor: the guest stored a message of a run that keeps none; ignored")
            await self._answer_store(frame, None)
            return
        guest_id = str(message.id) if message.id else None
        # A message this run stored already (a streamed answer that Chat Output stores again)
        # keeps its row, as in-process; any other id is the guest's own: the host's memory
        # gives the message an id of its own.
        message.id = self.ids.get(guest_id) if guest_id else None
        message.flow_id = self._flow_of(message)
        if self.run_id:
            message.run_id = self.run_id
        with _message_scope(message.flow_id, self.owner, self.executor):  # as lfx binds it per component
            stored = await astore_message(
                message, flow_id=message.flow_id, run_id=self.run_id, user_id=self.owner
            )
        host_id = str(stored[0].id) if stored and getattr(stored[0], "id", None) else None
        if host_id:
            self.ids[host_id] = host_id  # the guest goes on with the host's id (see below)
            if guest_id:
                self.ids[guest_id] = host_id
            self.flows[host_id] = message.flow_id
        self.stored += 1
        await self._answer_store(frame, host_id)

    async def _answer_store(self, frame: Mapping[str, Any], host_id: str | None) -> None:
        number = frame.get("reply")
        if self.reply is not None and isinstance(number, int) and 0 < number < 1 << 31:
            # In-process, the next vertex sees the stored message with its database id: the
            # guest waits for this answer before its flow goes on.
            await self.reply(f"reply-{number}", {"id": host_id})

    async def _history(self, frame: Mapping[str, Any]) -> None:
        """A component in the guest reads chat history (lfx.memory.aget_messages): read it from
        the host's memory as in-process, under the run's owner whatever the guest asks."""
        from lfx.memory import aget_messages

        number = frame.get("reply")
        if self.reply is None or not isinstance(number, int) or not 0 < number < 1 << 31:
            raise SandboxExecutionError("CreateOS executor: a history read without a reply number")
        flow_id = self._scope_of(frame.get("scope"))
        found: Any = []
        if self._within_scope(flow_id, frame.get("flow_id"), frame.get("user_id")):
            filters = {k: frame[k] for k in _HISTORY_FILTERS if isinstance(frame.get(k), str)}
            limit = frame.get("limit")
            limit = min(limit, HISTORY_MAX) if isinstance(limit, int) and limit > 0 else HISTORY_MAX
            with _message_scope(flow_id, self.owner, self.executor):
                found = await aget_messages(**filters, flow_id=flow_id, limit=limit, user_id=self.owner)
        messages = [m.model_dump(mode="json") for m in (found or [])]
        await self.reply(f"history-{number}", {"messages": messages})

    def _scope_of(self, claimed: Any) -> Any:
        """The flow a history read covers: the one whose component reads, as the guest names it,
        if that is this run's flow or a flow the host shipped for it; else this run's flow."""
        if isinstance(claimed, str) and claimed in self.subflows:
            return claimed
        return self.flow_id

    def _within_scope(self, flow_id: Any, asked_flow: Any, asked_user: Any) -> bool:
        """What Langflow's guard lets a component read with its flow scope bound: nothing without
        a flow and an owner, nothing for another flow or another owner (the executing user
        counts as the owner, a legacy hint). Applied here too, so a host memory without the
        guard (lfx's own) answers the same."""
        if flow_id is None or self.owner is None:
            return False
        if asked_flow is not None and not _same_id(asked_flow, flow_id):
            return False
        return asked_user is None or _same_id(asked_user, self.owner) or _same_id(asked_user, self.executor)

    def _flow_of(self, message: Any) -> Any:
        """The run's flow, or a subflow the host resolved for this run (in-process, a Run Flow
        target's messages are stored under the target's id). Any other id the guest names is
        replaced: a guest cannot write into another flow's history."""
        claimed = str(message.flow_id) if message.flow_id else None
        return claimed if claimed in self.subflows else self.flow_id

    async def _update(self, frame: Mapping[str, Any]) -> None:
        from lfx.memory import aupdate_messages

        message = self._message(frame)
        host_id = self.ids.get(str(message.id))
        if host_id is None:  # never stored here (the guest's own seed or an ephemeral message)
            return
        message.id = host_id
        message.flow_id = self.flows.get(host_id, self.flow_id)
        with _message_scope(message.flow_id, self.owner, self.executor):
            await aupdate_messages([message])

    async def _delete(self, frame: Mapping[str, Any]) -> None:
        from lfx.memory import delete_message

        host_id = self.ids.pop(str(frame.get("id")), None)
        if host_id is not None:
            with _message_scope(self.flows.get(host_id, self.flow_id), self.owner, self.executor):
                await delete_message(id_=host_id)
