"""The guest runner: the program that runs one whole flow inside a CreateOS guest.

It is never imported in the guest. The host sends its text on the exec's stdin with the run
spec and a per-run secret, and `BOOTSTRAP` (``python3 -c ...``) compiles it and calls its
`main`; nothing is written to the guest's disk. The text is one program assembled from the
modules `RUNNER_MODULES` names, in that order (`runner_source`): the frame format shared with
the host (`executor/framing.py`), then this folder's modules, one job each:

- `frames.py`: the channel to the host (authenticated frames out, reply files in);
- `install.py`: lfx in the guest (found, its version, the per-run install fallback);
- `memory.py`: chat memory bridged to the host's;
- `sandbox_bridge.py`: sandboxed nodes, run by the host;
- `variables.py`: global variables, as the host's variable service resolved them;
- `tracing.py`: lfx's tracing calls, relayed to the host's tracing service;
- `flow_api.py`: Langflow's flow lookups, answered from the flows the host shipped;
- `graph_run.py`: the flow rebuilt, run and harvested;
- `main.py`: the entry point (a cold run, or a pooled runner waiting for its spec);
- `zygote.py`: a warm runner serving the runs of one trust domain (`zygote_main`).

Each module uses only the standard library at import time (lfx is imported inside functions,
once it is known to be there), and may import names from the modules before it in the order:
those imports, and every `from __future__` line, are left out of the assembled text, which
starts with one `from __future__ import annotations` of its own.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import ast

# The bootstrap reads one JSON document from stdin: {"runner": source, "token": hex, "spec": {...}}
# and calls `main` (or the function `entry` names: `zygote_main`).
BOOTSTRAP = (
    "import json,sys;b=json.loads(sys.stdin.buffer.read());g={'__name__':'__createos_runner__'};"
    "exec(compile(b.pop('runner'),'createos-runner.py','exec'),g);g[b.pop('entry','main')](b)"
)

# The runner's modules, in the order of its text: each may import from those before it only.
RUNNER_MODULES = (
    "langflow_sandbox_createos.executor.framing",
    "langflow_sandbox_createos.executor.guest.frames",
    "langflow_sandbox_createos.executor.guest.install",
    "langflow_sandbox_createos.executor.guest.memory",
    "langflow_sandbox_createos.executor.guest.sandbox_bridge",
    "langflow_sandbox_createos.executor.guest.variables",
    "langflow_sandbox_createos.executor.guest.tracing",
    "langflow_sandbox_createos.executor.guest.flow_api",
    "langflow_sandbox_createos.executor.guest.graph_run",
    "langflow_sandbox_createos.executor.guest.main",
    "langflow_sandbox_createos.executor.guest.zygote",
)


def module_text(name: str) -> str:
    """The source of one of RUNNER_MODULES, read as package data (never imported)."""
    package, _, module = name.rpartition(".")
    return resources.files(package).joinpath(f"{module}.py").read_text("utf-8")


@lru_cache(maxsize=1)
def runner_source() -> str:
    """The runner's one text: RUNNER_MODULES in order, without their `from __future__` lines
    and their imports of each other. Raises ValueError when a module imports a name that no
    module before it defines (the text would fail in the guest)."""
    import ast

    parts = [
        "# The CreateOS executor's guest runner, assembled by "
        "langflow_sandbox_createos.executor.guest.runner_source.\n"
        "from __future__ import annotations\n"
    ]
    defined: dict[str, set[str]] = {}
    for name in RUNNER_MODULES:
        text = module_text(name)
        tree = ast.parse(text)
        left_out: set[int] = set()  # line numbers
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and _is_left_out(node, name, defined):
                left_out.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
        lines = text.splitlines(keepends=True)
        kept = "".join(line for number, line in enumerate(lines, 1) if number not in left_out)
        defined[name] = _top_level_names(tree)
        parts.append(f"\n# --- {name}\n{kept}")
    return "".join(parts)


def _is_left_out(node: ast.ImportFrom, importer: str, defined: dict[str, set[str]]) -> bool:
    """Whether the import is one the assembled text leaves out (checking that it may)."""
    if node.module == "__future__":
        return True
    if node.level or node.module not in RUNNER_MODULES:
        if node.level or (node.module or "").startswith("langflow_sandbox_createos."):
            raise ValueError(f"{importer}: a runner module imports from {node.module!r} at its top")
        return False
    if node.module not in defined:
        raise ValueError(f"{importer} imports from {node.module}, which comes later in RUNNER_MODULES")
    for alias in node.names:
        if alias.asname or alias.name not in defined[node.module]:
            raise ValueError(f"{importer}: {node.module} defines no {alias.name!r} (or it is renamed)")
    return True


def _top_level_names(tree: ast.Module) -> set[str]:
    import ast

    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names
