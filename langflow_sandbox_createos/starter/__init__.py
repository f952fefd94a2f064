"""The starter flow: a Python Interpreter node and a CreateOS Sandbox component.

It ships twice, kept in step by tests/unit/test_starter.py:

``createos_starter_flow.json``
    A real Langflow flow export, as Langflow's own "Export" writes it: open Langflow, then
    Import (or drag the file onto the projects page). It embeds each component's code and
    template as of the Langflow it was built against (``last_tested_version``); save a copy
    anywhere with ``python -m langflow_sandbox_createos.starter --save FILE``.
``createos_starter_recipe.json``
    The recipe the export is built from (which component, which field values, where on the
    canvas). ``make run`` imports the flow through the REST API by building the nodes from
    the running server's own catalog (``GET /api/v1/all``), so the nodes always match the
    Langflow they go into, even after a patch release changed a component's code.

Stdlib only, so it runs in any environment::

    python -m langflow_sandbox_createos.starter --url http://127.0.0.1:7860

With authentication on (``LANGFLOW_AUTO_LOGIN=false``) it logs in with an API key
(``LANGFLOW_API_KEY``) or the superuser's credentials (``LANGFLOW_SUPERUSER`` and
``LANGFLOW_SUPERUSER_PASSWORD``, the variables Langflow itself reads); secrets are read
from the environment only, never from the command line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from langflow_sandbox_createos.starter.client import (
    LangflowClient,
    LangflowError,
    build_export,
    import_starter_flow,
    write_json,
)
from langflow_sandbox_createos.starter.flow import (
    EXPORT_FILE,
    RECIPE_FILE,
    build_flow,
    export_document,
    load_export,
    load_recipe,
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m langflow_sandbox_createos.starter",
        description=(
            "Import the CreateOS starter flow into a running Langflow. Authentication: LANGFLOW_API_KEY, "
            "else LANGFLOW_SUPERUSER and LANGFLOW_SUPERUSER_PASSWORD, else auto-login."
        ),
    )
    p.add_argument("--url", default="http://127.0.0.1:7860", help="Langflow base URL")
    p.add_argument("--wait", type=float, default=0.0, help="seconds to wait for /health_check first")
    p.add_argument("--print-id", action="store_true", help="print only the new flow's id")
    p.add_argument("--save", type=Path, metavar="FILE", help="write the shipped flow export to FILE and exit")
    p.add_argument(
        "--build-export",
        type=Path,
        metavar="FILE",
        help="write a flow export built from the running Langflow's catalog to FILE (regenerates the shipped one)",
    )
    args = p.parse_args(argv)
    if args.save:
        write_json(args.save, load_export())
        print(f"wrote {args.save}: import it with Langflow's Import")
        return 0
    client = LangflowClient(args.url)
    try:
        if args.wait:
            client.wait_healthy(args.wait)
        if args.build_export:
            write_json(args.build_export, build_export(client))
            print(f"wrote {args.build_export}")
            return 0
        flow = import_starter_flow(client)
    except LangflowError as exc:
        print(f"starter flow import failed: {exc}", file=sys.stderr)
        return 1
    if args.print_id:
        print(flow["id"])
    else:
        print(f"imported '{flow['name']}': {client.base_url}/flow/{flow['id']}")
    return 0


__all__ = [
    "EXPORT_FILE",
    "RECIPE_FILE",
    "LangflowClient",
    "LangflowError",
    "build_export",
    "build_flow",
    "export_document",
    "import_starter_flow",
    "load_export",
    "load_recipe",
    "main",
    "write_json",
]
