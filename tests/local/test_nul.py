"""createos-local refuses NUL in what it would pass to the kernel (argv, env) with a 400,
instead of cutting the string at the NUL when it spawns the guest."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from cp_helpers import SHAPE, failure, run


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"cmd": "/bin/echo", "args": ["a\x00b"]}, "args[0]"),
        ({"cmd": "/bin/echo\x00x"}, "cmd"),
        ({"cmd": "/bin/sh", "args": ["-c", "echo $V"], "env": {"V": "x\x00y"}}, "env.V"),
    ],
)
def test_exec_with_a_nul_is_refused(
    client: httpx.Client, sandbox_factory: Any, body: dict[str, Any], field: str
) -> None:
    sb = sandbox_factory(envs={"V": "declared"})
    # e8f911e: echo printed "a" and the env value arrived as "x"
    refused = failure(client.post(f"/v1/sandboxes/{sb['id']}/exec", json=body), 400)
    assert "NUL" in str(refused)
    assert field in str(refused)
    assert run(client, sb["id"], "/bin/echo", "a", "b")["stdout"] == "a b\n"


def test_create_with_a_nul_env_value_is_refused(client: httpx.Client) -> None:
    before = client.get("/v1/sandboxes").json()["data"]
    refused = failure(client.post("/v1/sandboxes", json={"shape": SHAPE, "envs": {"V": "x\x00y"}}), 400)
    assert "envs.V" in str(refused)
    assert client.get("/v1/sandboxes").json()["data"] == before
