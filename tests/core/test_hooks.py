"""The process's fork and exit hooks run from one registry, in its stated order."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from langflow_sandbox_createos.core import hooks

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _in_child(body: str) -> list[str]:
    """Run ``body`` in a fresh interpreter (its own registry); the JSON list it prints last."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(body)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_exit_hooks_run_in_the_registrys_order_whatever_the_registration_order() -> None:
    """Registered backwards, one of them failing: all run, in AT_EXIT's order."""
    ran = _in_child(
        """
        import json, sys
        from langflow_sandbox_createos.core import hooks
        ran = []
        for name in reversed(hooks.AT_EXIT):
            def hook(name=name):
                ran.append(name)
                if name == hooks.AT_EXIT[0]:
                    raise RuntimeError("a failing hook")
            hooks.at_exit(name, hook)
        hooks.run_at_exit()
        print(json.dumps(ran))
        """
    )
    assert ran == list(hooks.AT_EXIT)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX fork")
def test_fork_hooks_run_in_the_child_in_the_registrys_order() -> None:
    ran = _in_child(
        """
        import json, os
        from langflow_sandbox_createos.core import hooks
        read, write = os.pipe()
        for name in reversed(hooks.AFTER_FORK):
            hooks.after_fork(name, lambda name=name: os.write(write, (name + "\\n").encode()))
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.close(write)
        os.waitpid(pid, 0)
        with os.fdopen(read) as pipe:
            print(json.dumps(pipe.read().split()))
        """
    )
    assert ran == [word for name in hooks.AFTER_FORK for word in name.split()]


def test_the_package_registers_every_hook_under_a_stated_name() -> None:
    """Every module with per-process state is imported; each name it used is one of the lists'."""
    ran = _in_child(
        """
        import json
        from langflow_sandbox_createos.core import hooks
        import langflow_sandbox_createos.backend, langflow_sandbox_createos.component.engine
        import langflow_sandbox_createos.executor
        print(json.dumps([sorted(hooks._after_fork), sorted(hooks._at_exit)]))
        """
    )
    assert ran == [sorted(hooks.AFTER_FORK), sorted(hooks.AT_EXIT)]
    with pytest.raises(ValueError, match="not an exit hook"):
        hooks.at_exit("something else", lambda: None)
