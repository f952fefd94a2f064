"""The native client's errors as lfx's two error classes, mapped in one place
(:func:`native_errors`), and a malformed setting as lfx's refusal."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

from lfx.integrations.errors import IntegrationError
from lfx.utils.sandbox.base import SandboxExecutionError, SandboxUnavailableError

from langflow_sandbox_createos.core.native import load_native
from langflow_sandbox_createos.core.settings import SettingsError

logger = logging.getLogger("langflow_sandbox_createos")


# --- errors ------------------------------------------------------------------------------

_STATUS_HINTS = {
    400: (
        "the control plane rejected the request; check the shape and image settings "
        "(CREATEOS_SANDBOX_SHAPE, CREATEOS_SANDBOX_ROOTFS; for the executor CREATEOS_EXECUTOR_SHAPE, "
        "CREATEOS_EXECUTOR_ROOTFS) and the egress settings"
    ),
    401: "the API key was refused; check CREATEOS_SANDBOX_API_KEY (or CREATEOS_API_KEY)",
    402: "the CreateOS account has no credit left; add credit to the account",
    403: "the account is not allowed to do this (quota or permissions); check the account's limits",
    404: "the sandbox or file does not exist (it may have been deleted)",
    409: "the sandbox is not in a state that allows this (paused, or the name is taken)",
    422: "the control plane rejected the request as invalid",
    429: "the control plane is rate limiting this account; retry later",
}


# The native ProtocolError's code when an exec stream ended cleanly without its exit frame.
NO_EXIT_FRAME = "no_exit_frame"


def describe(exc: BaseException) -> str:
    """A one-paragraph description of a native error with the fix, key-free."""
    status = getattr(exc, "status", None)
    native = load_native()
    if getattr(exc, "code", None) == NO_EXIT_FRAME:
        hint = (
            "the exec stream ended without an exit status (the guest agent may have crashed, or "
            "the network dropped the stream): the program's fate is unknown; retry the run"
        )
    elif status in _STATUS_HINTS:
        hint = _STATUS_HINTS[status]
    elif isinstance(status, int) and status >= 500:
        hint = "the CreateOS control plane failed; retry later"
    elif isinstance(exc, native.DeadlineError):
        hint = "the control plane did not answer in time; check CREATEOS_SANDBOX_BASE_URL and the network"
    elif isinstance(exc, native.ProtocolError):
        hint = "the control plane answered with something that is not the CreateOS API; check CREATEOS_SANDBOX_BASE_URL"
    elif isinstance(exc, native.ConfigError):
        hint = "fix the setting named above"
    elif status is None and isinstance(exc, native.TransientError):
        hint = "the control plane could not be reached; check CREATEOS_SANDBOX_BASE_URL and the network"
    else:
        hint = ""
    retry_after = getattr(exc, "retry_after", None)
    if retry_after:
        hint += f" (Retry-After: {retry_after:g} s)"
    text = str(exc)
    return f"{text} — {hint}" if hint else text


def to_lfx_error(exc: BaseException, action: str) -> SandboxExecutionError:
    """Map a native error onto lfx's classes: refusals and non-429 4xx fail closed as
    SandboxUnavailableError; 429, 5xx, transport and protocol faults are SandboxExecutionError.
    An error that names its guest (run_program's) says the guest is being deleted."""
    native = load_native()
    message = f"CreateOS: could not {action}: {describe(exc)}"
    guest = getattr(exc, "sandbox_id", None)
    if guest:
        message += f" (guest {guest}, which is being deleted)"
    if isinstance(exc, native.UnavailableError):
        return SandboxUnavailableError(message)
    return SandboxExecutionError(message)


# The HTTP status a refusal for lack of capacity carries (Langflow's run API answers with it).
CAPACITY_STATUS = 503


class CapacityError(IntegrationError):
    """Why a run was refused for lack of capacity, in the form Langflow's run API answers with
    a status: the :class:`SandboxUnavailableError` a run raises is chained ``from`` it, and
    Langflow (``langflow.api.utils.execution_errors.integration_http_error``) follows the
    chain to an :class:`IntegrationError` and answers 503 with a typed body (``error_code``
    ``provider-unavailable``, ``retryable``, ``retry_after``, ``hint``). Its text is ours and
    names no key; Langflow shows the ``hint`` to every caller, the message to the flow's owner."""

    code = "provider-unavailable"

    def __init__(self, message: str, *, hint: str, retry_after: float | None) -> None:
        super().__init__(message, hint=hint, provider="createos", retryable=True, http_status=CAPACITY_STATUS)
        self.retry_after = retry_after


class Doing:
    """What a run is doing, named by the error if a native call fails meanwhile."""

    __slots__ = ("action",)

    def __init__(self, action: str) -> None:
        self.action = action


@contextlib.contextmanager
def native_errors(
    action: str, *, refine: Callable[[BaseException], BaseException | None] | None = None
) -> Iterator[Doing]:
    """The one place native errors become lfx's (httpx's ``map_httpcore_exceptions`` is the
    model): a native error raised in the body is raised again as :func:`to_lfx_error` makes
    it, naming ``action``, or what the body set ``doing.action`` to since (``with
    native_errors("create a guest") as doing: ...``). ``refine`` may answer an error its own
    way first (None: the common mapping). The native error is not chained: it may quote what
    a server sent."""
    doing = Doing(action)
    native = load_native()
    try:
        yield doing
    except native.CreateOSError as exc:
        raise (refine(exc) if refine is not None else None) or to_lfx_error(exc, doing.action) from None


@contextlib.contextmanager
def refusing_bad_settings() -> Iterator[None]:
    """A malformed setting fails closed, before any guest exists: lfx's SandboxUnavailableError
    with the setting's own message, which names the variable and the fix."""
    try:
        yield
    except SettingsError as exc:
        raise SandboxUnavailableError(str(exc)) from None
