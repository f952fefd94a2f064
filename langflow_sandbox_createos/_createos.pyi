"""Type stub for the native CreateOS control-plane client (`csrc/`).

Every network wait releases the GIL. No Python code runs on the I/O thread:
streamed output is handed to `on_output` on the calling thread, with the GIL
held, between network waits.
"""

from collections.abc import Callable, Mapping, Sequence
from os import PathLike
from typing import Any, Literal, final

__version__: str
curl_version: str
jansson_version: str

DEFAULT_MAX_OUTPUT_BYTES: int  # 16 MiB per stream

class CreateOSError(Exception):
    """Base of every error the native client raises.

    status: the HTTP status, or None when no response was received.
    request_id: the server's X-Request-Id, when there was one.
    transient: True when retrying later could succeed (429, 5xx, transport, deadline).
    retry_after: seconds from a 429/503 Retry-After header, else None.
    code: the machine code of a JSend fail envelope (`data.code`), else None.
    sandbox_id: set by run_program when a guest had been created.
    """

    status: int | None
    request_id: str | None
    transient: bool
    retry_after: float | None
    code: str | None
    sandbox_id: str | None

class UnavailableError(CreateOSError):
    """Not retryable: non-429 4xx, or a refused configuration (bad base URL, key over plain HTTP)."""

class ConfigError(UnavailableError):
    """Refused before any request was sent: bad base URL, key with control characters, etc."""

class NotFoundError(UnavailableError):
    """HTTP 404."""

class ConflictError(UnavailableError):
    """HTTP 409 (paused sandbox, duplicate name, fork of a running sandbox)."""

class TransientError(CreateOSError):
    """429, 5xx, or a transport failure (connection refused or reset, DNS failure)."""

class DeadlineError(TransientError):
    """The call's whole deadline (or the connect timeout) passed."""

class ProtocolError(CreateOSError):
    """The server answered with something that is not the documented protocol:
    non-JSON, a wrong or truncated envelope, a field of the wrong type."""

@final
class ExecResult:
    stdout: str
    stderr: str
    exit_code: int  # -1 when a stream ended without an exit frame
    error: str | None  # the service's result.error (command could not start)
    exec_ms: float | None  # the program's own time as reported by the service
    stdout_truncated: bool
    stderr_truncated: bool
    streamed: bool  # False when the server lacked streaming and buffered exec was used
    sandbox_id: str | None  # set by run_program
    timed_out: bool  # the client deadline passed; output is what arrived before it

@final
class Client:
    """Thread-safe client; share one per process and (base_url, api_key)."""

    base_url: str
    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        connect_timeout: float = 10.0,
        control_timeout: float = 60.0,
        user_agent: str | None = None,
    ) -> None: ...
    def __repr__(self) -> str: ...  # never shows the key
    # identity and catalog
    def whoami(self) -> dict[str, Any]: ...
    def shapes(self) -> list[dict[str, Any]]: ...  # every page
    def rootfs(self) -> dict[str, Any]: ...
    # sandboxes
    def create(self, spec: Mapping[str, Any], *, timeout: float | None = None) -> dict[str, Any]: ...
    def get(self, sandbox_id: str) -> dict[str, Any]: ...
    def list(self, *, prefix: str | None = None, status: str | None = None) -> list[dict[str, Any]]: ...
    def delete(self, sandbox_id: str) -> dict[str, Any]: ...
    def pause(self, sandbox_id: str) -> dict[str, Any]: ...
    def resume(self, sandbox_id: str, *, wait: float | None = None) -> dict[str, Any]: ...
    def fork(self, sandbox_id: str, spec: Mapping[str, Any] | None = None) -> dict[str, Any]: ...
    def patch(self, sandbox_id: str, fields: Mapping[str, Any]) -> dict[str, Any]: ...
    def get_egress(self, sandbox_id: str) -> list[str]: ...
    def put_egress(self, sandbox_id: str, rules: Sequence[str] | None) -> list[str]: ...
    # files
    def upload(
        self, sandbox_id: str, path: str, data: bytes | None = None, *, file: str | PathLike[str] | None = None
    ) -> None: ...
    def download(self, sandbox_id: str, path: str, *, max_bytes: int) -> bytes: ...
    # exec
    def exec(
        self,
        sandbox_id: str,
        cmd: str,
        args: Sequence[str] = (),
        *,
        stdin: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float,
        max_output_bytes: int = ...,
        stream: bool = True,
        on_output: Callable[[Literal["stdout", "stderr"], str], None] | None = None,
    ) -> ExecResult:
        """Run a command. With stream=True the NDJSON stream is used (falling back
        to buffered exec when the server answers 404); output seen before the
        deadline is kept and the result has timed_out=True instead of raising."""
    def run_program(
        self,
        create: Mapping[str, Any],
        cmd: str,
        args: Sequence[str] = (),
        *,
        files: Sequence[tuple[str, bytes]] = (),
        stdin: str | None = None,
        timeout: float,
        max_output_bytes: int = ...,
        on_output: Callable[[Literal["stdout", "stderr"], str], None] | None = None,
        delete: Literal["wait", "background"] = "wait",
        sandbox_id: str | None = None,
    ) -> ExecResult:
        """A whole throwaway execution in C: create (or adopt `sandbox_id`, e.g. a
        warm guest) → upload `files` → streaming exec → delete. The delete is
        attempted on every path; with delete="background" it is queued on the
        I/O thread and its outcome is reported by drain_deletes(). Errors carry
        `sandbox_id` when a guest was created."""
    def drain_deletes(self, timeout: float = 0.0) -> list[tuple[str, int | None, str | None]]:
        """Wait up to `timeout` for pending background deletes; return the outcomes
        finished since the last call as (sandbox_id, http_status or None, error or None)."""
    def pending_deletes(self) -> int: ...
    def stats(self) -> dict[str, int]:
        """Counters: requests, connections_opened, bytes_received, ..."""
    def close(self) -> None: ...
