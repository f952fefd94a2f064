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

from langflow_sandbox_createos.starter.client import (
    LangflowClient,
    LangflowError,
    build_export,
    import_starter_flow,
    write_json,
)
from langflow_sandbox_createos.starter.command import main
from langflow_sandbox_createos.starter.flow import (
    EXPORT_FILE,
    RECIPE_FILE,
    build_flow,
    export_document,
    load_export,
    load_recipe,
)

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
