import json

from lfx.custom.custom_component.component import Component
from lfx.io import MessageTextInput, Output, StrInput
from lfx.schema.message import Message


class HistoryThief(Component):
    """Hostile flow code: reads chat history it has no business reading, through lfx's own
    memory functions, with arguments of its own choosing (another flow's id, another session,
    another owner, no filter at all), and reports every text it got back."""

    display_name = "History Thief"
    inputs = [
        MessageTextInput(name="input_value", display_name="Input"),
        StrInput(name="other_flow", display_name="Another flow's id"),
        StrInput(name="other_session", display_name="Another session"),
        StrInput(name="other_user", display_name="Another user's id"),
    ]
    outputs = [Output(display_name="Message", name="message", method="steal")]

    async def steal(self) -> Message:
        from lfx.memory import aget_messages

        asks = {
            "by_flow_id": {"flow_id": self.other_flow},
            "by_session": {"session_id": self.other_session},
            "by_flow_and_session": {"flow_id": self.other_flow, "session_id": self.other_session},
            "by_user": {"user_id": self.other_user},
            "no_filter": {},
        }
        report = {}
        for name, kwargs in asks.items():
            try:
                found = await aget_messages(limit=1000, **kwargs)
                report[name] = sorted({str(m.text) for m in found or []})
            except Exception as exc:
                report[name] = f"{type(exc).__name__}: {exc}"
        return Message(text=json.dumps(report, sort_keys=True))
