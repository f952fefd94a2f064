"""A client whose helper thread cannot start (pthread_create fails: a process at its thread
limit, made here by an LD_PRELOAD shim): the run still returns, and its background delete,
which needs that thread, is reported as a failed delete instead of being dropped in silence."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from langflow_sandbox_createos.local.testing import LocalControlPlane

from .conftest import SHAPE, build_shim, preloading

SCRIPT = textwrap.dedent(
    """
    import ctypes, json, sys
    from langflow_sandbox_createos import _createos

    url, key, shape = sys.argv[1:4]
    shim = ctypes.CDLL(None)
    client = _createos.Client(url, key, control_timeout=20.0)
    client.whoami()
    shim.shim_refuse_threads(1)
    try:
        r = client.run_program({"shape": shape}, "echo", ["ran"], timeout=20, delete="background")
        out = {
            "stdout": r.stdout,
            "sandbox_id": r.sandbox_id,
            "pending": client.pending_deletes(),
            "outcomes": client.drain_deletes(timeout=1.0),
            "failed": client.stats()["deletes_failed"],
        }
    finally:
        shim.shim_refuse_threads(0)
    client.close()
    print(json.dumps(out), flush=True)
    """
)


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_shim(tmp_path_factory, "refuse_threads")


def test_a_background_delete_without_a_helper_thread_is_a_reported_failure(
    shim: Path, cp: LocalControlPlane
) -> None:
    env = preloading(shim)
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, cp.url, cp.api_key, SHAPE],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    sandbox_id = out["sandbox_id"]
    try:
        assert out["stdout"] == "ran\n"
        assert out["pending"] == 0  # nothing queued that nobody drives
        assert out["outcomes"] == [[sandbox_id, None, "could not start the client's helper thread"]]
        assert out["failed"] == 1
        # the delete was never sent: the guest is still there, for its owner to delete
        assert sandbox_id in {sb["id"] for sb in cp.live_sandboxes()}
    finally:
        cp.delete_sandbox(sandbox_id)
