"""createos-local: an offline CreateOS control plane that runs real, namespaced guests.

Start it with ``createos-local`` (see ``docs/local-control-plane.md``) or, from tests,
with :class:`langflow_sandbox_createos.local.testing.LocalControlPlane`.
"""
