"""Chat memory in the guest, bridged to the host's: lfx's memory functions answer from the
host's memory (Langflow's database) through frames and reply files.
"""

from __future__ import annotations

import time
from typing import Any

from langflow_sandbox_createos.executor.guest.frames import REPLY_POLL_SECONDS, Frames, _jsonable, _take_reply

REPLY_WAIT_SECONDS = 60.0  # for the host's answer to a stored message


class _Memory:
    """Chat memory inside the guest. Each store/update/delete is sent to the host as a frame,
    and the host performs it on its own memory (Langflow's database); a history read asks the
    host (with a reply directory), so the guest sees exactly what the host holds, and nothing
    of it until a component reads it. Without a reply directory (an older host), reads answer
    from what this run stored."""

    def __init__(
        self, frames: Frames, seed: list[Any], stamp_run_id: bool = False, reply_dir: str | None = None
    ) -> None:
        from lfx.memory import stubs

        self.frames = frames
        self.stubs = stubs
        self.messages: list[Any] = list(seed)
        self.stamp_run_id = stamp_run_id
        self.reply_dir = reply_dir
        self.asked = 0

    async def _host_id(self, number: int) -> Any:
        """The id the host's memory gave stored message `number` (uploaded by the host)."""
        answer = await self._answer(f"reply-{number}")
        return answer.get("id") if isinstance(answer, dict) else None

    async def _answer(self, name: str) -> Any:
        """The host's answer `name` in the reply directory, once it is there (read once)."""
        import asyncio

        path = f"{self.reply_dir}/{name}"
        deadline = time.monotonic() + REPLY_WAIT_SECONDS
        while time.monotonic() < deadline:
            found, answer = _take_reply(path)
            if found:
                return answer
            await asyncio.sleep(REPLY_POLL_SECONDS)
        raise RuntimeError(f"the host did not answer {name} within {REPLY_WAIT_SECONDS} s")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stubs, name)

    async def astore_message(
        self, message: Any, flow_id: Any = None, run_id: Any = None, user_id: Any = None
    ):
        if self.stamp_run_id and run_id:  # what the host's tracing service makes a component add
            metadata = dict(message.session_metadata or {})
            metadata.setdefault("graph_run_id", str(run_id))
            message.session_metadata = metadata
        stored = await self.stubs.astore_message(message, flow_id=flow_id, run_id=run_id, user_id=user_id)
        from lfx.memory.flow_context import should_persist_messages

        if should_persist_messages():
            for item in stored:
                self.asked += 1
                number = self.asked if self.reply_dir else None
                self.frames.emit("store", message=_jsonable(item.model_dump()), reply=number)
                if number is not None:  # as in-process, the flow goes on with the stored id
                    host_id = await self._host_id(number)
                    if host_id:
                        item.id = host_id
                self.messages.append(item)
        return stored

    async def aupdate_messages(self, messages: Any) -> list[Any]:
        items = messages if isinstance(messages, list) else [messages]
        for item in items:
            for index, known in enumerate(self.messages):
                if str(known.id) == str(item.id):
                    self.messages[index] = item
            self.frames.emit("update", message=_jsonable(item.model_dump()))
        return items

    async def delete_message(self, id_: str) -> None:
        self.messages = [m for m in self.messages if str(m.id) != str(id_)]
        self.frames.emit("delete", id=str(id_))

    async def aget_messages(
        self,
        sender: Any = None,
        sender_name: Any = None,
        session_id: Any = None,
        context_id: Any = None,
        order_by: Any = "timestamp",
        order: Any = "DESC",
        flow_id: Any = None,
        limit: Any = None,
        user_id: Any = None,  # the host checks it against the run's owner, as Langflow's guard does
    ) -> list[Any]:
        filters = {
            "sender": sender,
            "sender_name": sender_name,
            "session_id": session_id,
            "context_id": context_id,
            "order_by": order_by,
            "order": order,
            "flow_id": flow_id,
            "limit": limit,
        }
        if self.reply_dir:
            return await self._host_history(**filters, user_id=user_id)
        return self._stored_history(**filters)

    def _stored_history(
        self,
        sender: Any,
        sender_name: Any,
        session_id: Any,
        context_id: Any,
        order_by: Any,
        order: Any,
        flow_id: Any,
        limit: Any,
    ) -> list[Any]:
        """What this run stored, filtered and ordered as lfx's memory would (an older host)."""

        def keep(m: Any) -> bool:
            return (
                (sender is None or m.sender == sender)
                and (sender_name is None or m.sender_name == sender_name)
                and (session_id is None or str(m.session_id) == str(session_id))
                and (context_id is None or str(getattr(m, "context_id", None)) == str(context_id))
                and (flow_id is None or str(m.flow_id) == str(flow_id))
            )

        found = [m for m in self.messages if keep(m)]
        found.sort(key=lambda m: str(getattr(m, order_by or "timestamp", "") or ""), reverse=order == "DESC")
        if limit:
            found = found[: int(limit)]
        return found

    async def _host_history(self, **filters: Any) -> list[Any]:
        from lfx.memory.flow_context import get_current_flow_id, has_current_flow_scope
        from lfx.schema.message import Message

        self.asked += 1
        number = self.asked
        sent = {k: str(v) for k, v in filters.items() if v is not None and k != "limit"}
        limit = filters.get("limit")
        # the flow whose component reads (lfx binds it per component): the host reads that
        # flow's history only, and only if it is this run's flow or one it shipped
        scope = get_current_flow_id() if has_current_flow_scope() else None
        self.frames.emit(
            "history",
            reply=number,
            limit=int(limit) if limit else None,
            scope=str(scope) if scope else None,
            **sent,
        )
        answer = await self._answer(f"history-{number}")
        return [Message.model_validate(m) for m in (answer or {}).get("messages") or []]


def _install_memory(frames: Frames, seed: list[Any], stamp_run_id: bool, reply_dir: str | None) -> None:
    import lfx.memory

    memory = _Memory(frames, seed, stamp_run_id, reply_dir)
    lfx.memory._impl = lambda: memory  # every lfx.memory function dispatches through _impl()
