"""`python -m langflow_sandbox_createos.starter`: save the shipped export, build it from a running
Langflow, or import the starter flow into one."""

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
    load_export,
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
