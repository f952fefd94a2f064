"""The control plane's shape catalog: read once per endpoint, and the smallest shape that gives a
run the memory it asks for."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from lfx.utils.sandbox.base import SandboxUnavailableError

from langflow_sandbox_createos.core import connection, failures
from langflow_sandbox_createos.core.settings import MIN_SHAPE_MEMORY_MIB

logger = logging.getLogger("langflow_sandbox_createos")


# --- shapes ------------------------------------------------------------------------------


def parse_catalog(rows: Iterable[dict]) -> tuple[tuple[int, str], ...]:
    shapes = []
    for row in rows:
        shape_id, mem = row.get("id"), row.get("mem_mib")
        if isinstance(shape_id, str) and isinstance(mem, int) and not isinstance(mem, bool):
            shapes.append((mem, shape_id))
        else:
            logger.debug("skipping unreadable shape row %r", row)
    return tuple(sorted(shapes))


def catalog(endpoint: connection.Endpoint) -> tuple[tuple[int, str], ...]:
    """The shape catalog, every page, fetched once per endpoint."""
    with endpoint.lock:
        if endpoint.shapes is None:
            # classified like every other call: a 429, 5xx, transport or protocol fault here is
            # as transient as it is anywhere else
            with failures.native_errors("read the shape catalog"):
                rows = endpoint.client.shapes()
            endpoint.shapes = parse_catalog(rows)
        return endpoint.shapes


def pick_shape(shapes: Sequence[tuple[int, str]], memory_mb: int, pinned: str | None) -> str:
    """The smallest shape with at least max(memory_mb, 4096) MiB, or the pinned one if it
    is in the catalog and not below the floor. Never rounds down."""
    if not shapes:
        raise SandboxUnavailableError(
            "CreateOS returned an empty shape catalog, so no shape can be chosen safely. "
            "Check CREATEOS_SANDBOX_BASE_URL points at a CreateOS control plane."
        )
    floor = max(memory_mb, MIN_SHAPE_MEMORY_MIB)
    if pinned is not None:
        by_id = {shape_id: mem for mem, shape_id in shapes}
        if pinned not in by_id:
            raise SandboxUnavailableError(
                f"CREATEOS_SANDBOX_SHAPE={pinned!r} is not in the CreateOS shape catalog. "
                f"Available: {', '.join(s for _, s in shapes)}."
            )
        if by_id[pinned] < memory_mb:
            raise SandboxUnavailableError(
                f"CREATEOS_SANDBOX_SHAPE={pinned!r} has {by_id[pinned]} MiB, below "
                f"LANGFLOW_SANDBOX_MEMORY_MB={memory_mb}. Pin a larger shape or lower the memory setting."
            )
        return pinned
    for mem, shape_id in shapes:
        if mem >= floor:
            return shape_id
    raise SandboxUnavailableError(
        f"No CreateOS shape has at least {floor} MiB (max(LANGFLOW_SANDBOX_MEMORY_MB={memory_mb}, "
        f"{MIN_SHAPE_MEMORY_MIB})); the largest is {shapes[-1][1]} with {shapes[-1][0]} MiB. "
        "Lower LANGFLOW_SANDBOX_MEMORY_MB or pin a shape with CREATEOS_SANDBOX_SHAPE."
    )
