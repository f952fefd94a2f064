"""The `createos-langflow` command's launcher, a top-level module on purpose.

The pure-Python plugin 0.2.0 uses the same import name, `langflow_sandbox_createos`. When a
copy of it comes first on `sys.path` (a `pip install --user` copy, a `--target` directory on
`PYTHONPATH`), `import langflow_sandbox_createos.cli` would find that copy, which has no CLI,
and the command would die with a ModuleNotFoundError. This launcher sits beside this
installation's package, imports that package from its own directory, and runs the CLI, whose
doctor then reports the shadowing instead of crashing on it.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

PACKAGE = "langflow_sandbox_createos"


def _load_this_installation() -> None:
    ours = Path(__file__).resolve().parent / PACKAGE
    if PACKAGE in sys.modules or not (ours / "__init__.py").is_file():
        return
    found = importlib.util.find_spec(PACKAGE)
    if found is not None and found.origin and Path(found.origin).resolve().parent == ours:
        return  # the normal case: nothing shadows this installation
    spec = importlib.util.spec_from_file_location(
        PACKAGE, ours / "__init__.py", submodule_search_locations=[str(ours)]
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {PACKAGE} from {ours}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = module
    spec.loader.exec_module(module)


def main() -> int:
    _load_this_installation()
    from langflow_sandbox_createos.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
