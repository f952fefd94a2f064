"""An OpenAI-compatible chat model of the test's own, on a test host in a network namespace
(`NamespaceHost`): what a model-provider flow calls instead of an outside address.

It answers `POST /v1/chat/completions` (no streaming) with a text made from the request, and
records each request: the bearer token it carried (the API key the flow's component sent),
the model and the messages. Both the Langflow process (in-process runs) and executor guests
(through their egress) reach it at `base_url`.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from langflow_sandbox_createos.local.testing import NamespaceHost


class ModelServer:
    def __init__(self) -> None:
        self.host = NamespaceHost()
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def __enter__(self) -> ModelServer:
        self.host.__enter__()
        try:
            sock = self.host.listen_socket()
            server = ThreadingHTTPServer(sock.getsockname(), self._handler(), bind_and_activate=False)
            server.socket.close()
            server.socket = sock
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, name="model-server", daemon=True).start()
            self._server = server
        except BaseException:
            self.host.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        self.host.close()

    @property
    def address(self) -> str:
        return self.host.address

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://{self.address}:{self.port}/v1"

    def seen(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.requests)

    @staticmethod
    def answer(messages: list[dict[str, Any]]) -> str:
        """The model's reply: the last user message and the system message it was given."""

        def text(message: dict[str, Any]) -> str:
            content = message.get("content")
            if isinstance(content, list):  # content parts
                return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            return str(content or "")

        user = next((text(m) for m in reversed(messages) if m.get("role") == "user"), "")
        system = " / ".join(text(m) for m in messages if m.get("role") == "system")
        return f"answer to {user!r} with history [{system}]"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return None

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self.send_error(404)
                    return
                messages = body.get("messages") or []
                with outer._lock:
                    outer.requests.append(
                        {
                            "authorization": self.headers.get("Authorization"),
                            "model": body.get("model"),
                            "messages": messages,
                        }
                    )
                if body.get("stream"):
                    self._stream(body, outer.answer(messages))
                    return
                reply = {
                    "id": f"chatcmpl-{len(outer.requests)}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": body.get("model") or "test-model",
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": outer.answer(messages)},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8},
                }
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, body: dict[str, Any], text: str) -> None:
                """The same answer as server-sent events, in three chunks, as OpenAI streams."""
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                base = {
                    "id": "chatcmpl-stream",
                    "object": "chat.completion.chunk",
                    "created": int(time.time()),
                    "model": body.get("model") or "test-model",
                }
                third = max(1, len(text) // 3)
                parts = [text[:third], text[third : 2 * third], text[2 * third :]]
                chunks = [
                    {"index": 0, "delta": {"role": "assistant", "content": part}, "finish_reason": None}
                    for part in parts
                ]
                chunks.append({"index": 0, "delta": {}, "finish_reason": "stop"})
                for choice in chunks:
                    self.wfile.write(f"data: {json.dumps({**base, 'choices': [choice]})}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

        return Handler
