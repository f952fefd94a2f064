"""Fixtures for the createos-local suite: an httpx client and a self-cleaning sandbox factory."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from cp_helpers import SandboxFactory, make_client, sandbox_factory_for

from langflow_sandbox_createos.local.testing import LocalControlPlane


@pytest.fixture
def client(cp: LocalControlPlane) -> Iterator[httpx.Client]:
    with make_client(cp) as c:
        yield c


@pytest.fixture
def sandbox_factory(client: httpx.Client) -> Iterator[SandboxFactory]:
    yield from sandbox_factory_for(client)


@pytest.fixture
def sandbox(sandbox_factory: SandboxFactory) -> dict[str, Any]:
    return sandbox_factory()
