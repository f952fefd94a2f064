"""Exec: run a command in a sandbox, answered buffered or as a stream of frames."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import Response

from ..envelope import ApiError, bad_request, success
from ..execution import ExecStreamResponse, run_buffered
from ..images import GUEST_HOME
from ..jailer import ExecRequest
from ..store import Sandbox
from .parsing import authorized, envs, json_object, no_nul, sandbox, string_list, typed


async def exec_(request: Request) -> Response:
    plane = authorized(request)
    sb = sandbox(plane, request)
    body = await json_object(request)
    cmd = typed(body, "cmd", str, "a string")
    if not cmd:
        raise bad_request("cmd is required", "cmd")
    no_nul(cmd, "cmd")
    args = string_list(body, "args") or []
    env = envs(body, "env") or {}
    stdin = typed(body, "stdin", str, "a string")
    stream_flag = typed(body, "stream", bool, "a boolean")
    stream = request.query_params.get("stream", "").lower() in ("1", "true") or bool(stream_flag)
    if stream and not plane.streaming_enabled:
        raise ApiError(404, "streaming exec is not supported by this control plane", "not_found")
    plane.store.require_running(sb)
    undeclared = sorted(set(env) - set(sb.envs))
    if undeclared:
        raise bad_request(
            f"env keys must be declared at create; not declared: {', '.join(undeclared)}",
            "env",
            "env_not_declared",
        )
    sb.last_activity = time.monotonic()
    req = _exec_request(sb, cmd, args, env)
    stdin_bytes = stdin.encode() if stdin is not None else None
    if stream:
        return ExecStreamResponse(plane.runner, sb, req, stdin_bytes, plane.config.heartbeat_seconds)
    result = await run_buffered(
        plane.runner, sb, req, stdin_bytes, plane.config.max_exec_output_bytes, request.receive
    )
    if result is None:
        return Response(status_code=499)
    return success(result)


def _exec_request(sb: Sandbox, cmd: str, args: list[str], env: dict[str, str]) -> ExecRequest:
    """What the jailer needs to run ``cmd`` in ``sb``, with the guest's environment: the image's,
    then the plane's, then the sandbox's declared values, then this exec's."""
    guest_env = {
        **dict(sb.image.env),
        "HOME": GUEST_HOME,
        "LANG": "C.UTF-8",
        "HOSTNAME": sb.name or sb.id,
        "CREATEOS_SANDBOX_ID": sb.id,
        "CREATEOS_SANDBOX_NAME": sb.name,
        **sb.envs,
        **env,
    }
    return ExecRequest(
        sandbox_id=sb.id,
        hostname=sb.name or sb.id,
        layout=sb.layout,
        image=sb.image,
        egress=sb.egress_rules,
        env=guest_env,
        cmd=cmd,
        args=args,
        cgroups=sb.cgroups,
        mem_mib=sb.shape.mem_mib,
    )
