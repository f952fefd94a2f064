"""Type stub for the native CreateOS control-plane client (`csrc/`).

Every network wait releases the GIL. No Python code runs on the I/O thread:
streamed output is handed to `on_output` on the calling thread, with the GIL
held, between network waits. See docs/native-client.md.

Redaction: every string a server or a guest chose that reaches Python (exception
message, request_id, code, ExecResult.error, the state in resume's DeadlineError,
drain_deletes' error texts, and the sandbox ids of exc.sandbox_id, ExecResult.sandbox_id
and drain_deletes) has the API key removed, including any run of 8 or
more characters copied from it in any case (a server may reflect the header cut
short or case-folded), control characters escaped (as backslash escapes: n, r, t, xHH, uHHHH;
C1 controls, U+2028/9 and bidi formatting characters included)
and ill-formed UTF-8 replaced by '?'; at most ~500 characters of server text are
kept in a message. A sandbox id create answers with that this would change is refused
(ProtocolError). Success answers (whoami, views, lists) keep their data as sent but for the
key: every run of it in a string or key is replaced by "[redacted]".
"""

import builtins
from collections.abc import Callable, Mapping, Sequence
from os import PathLike
from typing import Any, Literal, final

__version__: str
curl_version: str  # the libcurl loaded at run time
jansson_version: str  # the jansson loaded at run time
build_curl_version: str  # the libcurl headers built with (at least 7.74.0)
build_jansson_version: str  # the jansson headers built with (at least 2.13)
# what those headers allow: "quick_exit" (libcurl >= 7.87: a stuck resolver never holds the
# I/O thread), "json_keys_with_nul" (jansson >= 2.14: object keys holding NUL can be sent)
build_features: frozenset[str]
callers_drive: bool  # callers drive their own transfers with the libcurl loaded (docs/native-client.md)

DEFAULT_MAX_OUTPUT_BYTES: int  # 16 MiB per stream
MAX_OUTPUT_BYTES_LIMIT: int  # 1 GiB: the largest max_output_bytes accepted (ValueError above)

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
    """Immutable. Also constructible with keyword arguments (all optional), for
    tests and fakes: ExecResult(stdout="", stderr="", exit_code=-1, error=None,
    exec_ms=None, stdout_truncated=False, stderr_truncated=False, streamed=False,
    sandbox_id=None, timed_out=False)."""

    def __init__(
        self,
        *,
        stdout: str = "",
        stderr: str = "",
        exit_code: int = -1,
        error: str | None = None,
        exec_ms: float | None = None,
        stdout_truncated: bool = False,
        stderr_truncated: bool = False,
        streamed: bool = False,
        sandbox_id: str | None = None,
        timed_out: bool = False,
    ) -> None: ...
    stdout: str
    stderr: str
    exit_code: int  # -1 only with timed_out=True (no exit status before the deadline)
    error: str | None  # the service's result.error (command could not start), sanitized
    exec_ms: float | None  # the program's own time as reported by the service
    stdout_truncated: bool
    stderr_truncated: bool
    streamed: bool  # False when the server lacked streaming and buffered exec was used
    sandbox_id: str | None  # set by run_program
    timed_out: bool  # the client deadline passed; output is what arrived before it

@final
class Client:
    """Thread-safe client; share one per process and (base_url, api_key).

    The constructor refuses (ConfigError, before any request) a base URL that is
    not http(s), has user info, a query or a fragment, or is plain http:// to a
    non-loopback host; and an API key that is empty, longer than 512 characters
    or has whitespace, control or non-ASCII characters. `base_url` is the URL
    normalised without its trailing slash (a path prefix is kept). TLS is always
    verified; SSL_CERT_FILE / CURL_CA_BUNDLE (read at construction) name the CA
    bundle. Redirects are refused (UnavailableError with the 3xx status).

    Works after os.fork() in the child (the parent's connections and I/O thread
    are abandoned, never closed). A closed client raises UnavailableError.
    Usable as a context manager (close() on exit).
    """

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
    def get_egress(self, sandbox_id: str) -> builtins.list[str]: ...
    def put_egress(self, sandbox_id: str, rules: Sequence[str] | None) -> builtins.list[str]: ...
    # files
    def upload(
        self,
        sandbox_id: str,
        path: str,
        data: bytes | None = None,
        *,
        file: str | PathLike[str] | None = None,
    ) -> None:
        """Upload bytes, or stream a regular file from disk. The file is opened without
        blocking the interpreter; anything but a regular file (a FIFO, a device, a
        directory) raises OSError naming it, before anything is read."""
    def download(self, sandbox_id: str, path: str, *, max_bytes: int) -> bytes:
        """A 2xx Content-Length above max_bytes is refused before the body; a body
        that passes max_bytes aborts the transfer. Both raise UnavailableError with
        code "too_large" (status = the HTTP status)."""
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
        deadline is kept and the result has timed_out=True instead of raising.

        `timeout` is the whole deadline of the call. With no stream started (no
        2xx status line yet) the deadline raises DeadlineError. A stream cut off
        mid-way (connection reset/closed before EOF) raises ProtocolError, and so
        does a stream that ends cleanly without an exit frame (code
        "no_exit_frame": the guest agent died; the program's fate is unknown).
        stdin is sent whole, NUL characters included. max_output_bytes is
        0..MAX_OUTPUT_BYTES_LIMIT (1 GiB), else ValueError.
        stdout and stderr are each capped at max_output_bytes (cut on a UTF-8
        boundary, *_truncated set); the rest of the stream is read and dropped, so
        memory stays near the cap whatever the guest prints. A buffered (non
        streaming) answer is one JSON document parsed whole: over 64 MiB it
        raises ProtocolError (code "too_large") as soon as it passes, whatever
        max_output_bytes allows (from its Content-Length, before any body byte).
        on_output receives what arrived since the previous wait (at most every
        ~100 ms, or as soon as output arrives), stdout before stderr within one
        delivery; an exception from it (or KeyboardInterrupt) cancels the request
        (closing its connection) and propagates."""
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
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        """A whole throwaway execution in C: create (or adopt `sandbox_id`, e.g. a
        warm guest) → upload `files` → streaming exec → delete. The delete is
        attempted on every path; with delete="background" it is queued on the
        I/O thread and its outcome is reported by drain_deletes(). Errors carry
        `sandbox_id` when a guest was created.

        `create` is ignored when `sandbox_id` is given (the adopted guest is
        deleted too). `env` is passed to the exec (as in exec()); the control
        plane accepts only keys declared in the guest's `envs` at create. create and uploads use control_timeout; the exec uses
        `timeout` (see exec). A synchronous delete that fails is queued once more
        in the background (see drain_deletes); the result is still returned. On
        KeyboardInterrupt or an exception from on_output the delete is queued in
        the background, so the interrupt is not delayed."""
    def drain_deletes(self, timeout: float = 0.0) -> builtins.list[tuple[str, int | None, str | None]]:
        """Wait up to `timeout` for pending background deletes; return the outcomes
        finished since the last call as (sandbox_id, http_status or None, error or None).
        error is None when the guest is gone (2xx, or 404: already deleted). A
        transient failure is retried once before it is reported."""
    def pending_deletes(self) -> int: ...
    def stats(self) -> dict[str, int]:
        """Counters since construction: requests, connections_opened (libcurl
        CURLINFO_NUM_CONNECTS), bytes_received, bytes_sent, streams, fallbacks,
        http_errors, transport_errors, timeouts, cancelled, deletes_queued,
        deletes_done, deletes_failed, outcomes_dropped, pending_deletes."""
    def close(self) -> None:
        """Stop the I/O thread. In-flight calls of other threads fail with
        UnavailableError; queued background deletes finish first (each bounded by
        control_timeout). Idempotent."""
    def __enter__(self) -> Client: ...
    def __exit__(self, *exc_info: object) -> None: ...
