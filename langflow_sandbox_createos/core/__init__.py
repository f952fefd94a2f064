"""What the three surfaces share: settings, the control-plane endpoint and its errors, network
rules, guest shapes, the warm pool and its keeper, admission control and time helpers."""

import os as _os


def with_this_package_importable(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the directory holding this package first on PYTHONPATH: a child process
    started with ``python -m langflow_sandbox_createos...`` imports this copy, wherever it was
    loaded from (a source tree, a wheel, a test's scratch copy)."""
    root = _os.path.dirname(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))))
    env["PYTHONPATH"] = _os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env
