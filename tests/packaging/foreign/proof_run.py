"""Runs inside the Debian 13 root with the wheel pip-installed (tests/packaging/
test_foreign_roots.py): the native module imports from the wheel, then a backend run (lfx's own
Python Interpreter component, the `createos` sandbox backend picked through lfx's registry from
the environment, as Langflow does) and a component run (the CreateOS Sandbox component, loaded
by lfx from the installed package, in a Graph) against createos-local on the host's loopback.
Prints one JSON report on its last line.

    CREATEOS_SANDBOX_API_KEY=... python proof_run.py BASE_URL
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

base_url, api_key = sys.argv[1], os.environ["CREATEOS_SANDBOX_API_KEY"]
os.environ.update(
    LANGFLOW_SANDBOX_BACKEND_PLUGINS="createos",
    LANGFLOW_SANDBOX_BACKEND="createos",
    CREATEOS_SANDBOX_API_KEY=api_key,
    CREATEOS_SANDBOX_BASE_URL=base_url,
    LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS="true",
)
report: dict[str, object] = {}

import langflow_sandbox_createos  # noqa: E402
from langflow_sandbox_createos import _createos  # noqa: E402

report["python"] = sys.version.split()[0]
report["native"] = _createos.__file__
report["curl"] = _createos.curl_version
report["jansson"] = _createos.jansson_version

# 1. the backend: lfx resolves it from its registry, its Python Interpreter runs on a guest
from lfx.components.utilities.python_repl_core import PythonREPLComponent  # noqa: E402
from lfx.utils.sandbox import resolve_sandbox_backend  # noqa: E402

started = time.monotonic()
backend = resolve_sandbox_backend("createos")
report["backend_class"] = f"{type(backend).__module__}.{type(backend).__qualname__}"
component = PythonREPLComponent(
    global_imports="math",
    python_code="import os, math\nprint('guest', os.environ['CREATEOS_SANDBOX_ID'], math.floor(2.5))",
)
try:
    report["backend_result"] = component.run_python_repl().data
finally:
    backend.shutdown()
report["backend_seconds"] = round(time.monotonic() - started, 2)

# 2. the component, as Langflow loads it (lfx's extension loader), in a Graph
from lfx.extension.loader import load_extension  # noqa: E402
from lfx.graph.graph.base import Graph  # noqa: E402

started = time.monotonic()
loaded = load_extension(Path(langflow_sandbox_createos.__file__).parent)
report["extension_errors"] = [str(e) for e in loaded.errors]
cls = next(c.klass for c in loaded.components if c.klass.display_name == "CreateOS Sandbox")
node = cls(_id="CreateOSSandbox-proof", python_code="import sys\nprint(6 * 7, sys.platform)")
graph = Graph(node, node, flow_id="flow-proof", user_id="00000000-0000-0000-0000-000000000001")


async def go() -> None:
    async for _ in graph.async_start():
        pass


asyncio.run(go())
results = graph.get_vertex("CreateOSSandbox-proof").results["results"].data
report["component_result"] = {k: results.get(k) for k in ("result", "exit_code", "stderr", "sandbox_id")}
report["component_seconds"] = round(time.monotonic() - started, 2)
print(json.dumps(report, default=str))
