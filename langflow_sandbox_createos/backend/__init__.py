"""The sandbox backend (entry point ``lfx.sandbox_backends:createos``): the Python Interpreter
node's code runs in a throwaway CreateOS guest. lfx loads ``create_backend`` from here; the
work is in ``backend/engine.py``."""

from langflow_sandbox_createos.backend.engine import CreateOSBackend, create_backend

__all__ = ["CreateOSBackend", "create_backend"]
