"""Fixtures for the native client's tests: a Client on the real createos-local (tests/conftest.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from langflow_sandbox_createos import _createos
from langflow_sandbox_createos.local.testing import LocalControlPlane

SHAPE = "s-1vcpu-256mb"


@pytest.fixture
def client(cp: LocalControlPlane) -> Iterator[_createos.Client]:
    c = _createos.Client(cp.url, cp.api_key, connect_timeout=5.0, control_timeout=20.0)
    yield c
    c.close()


@pytest.fixture
def sandbox(client: _createos.Client) -> Iterator[dict[str, Any]]:
    """A running guest, deleted afterwards."""
    view = client.create({"shape": SHAPE})
    yield view
    with contextlib.suppress(_createos.NotFoundError):
        client.delete(view["id"])


def route_count(cp: LocalControlPlane, route: str) -> int:
    return int(cp.stats()["requests"].get(route, 0))
