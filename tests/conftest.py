"""Shared fixtures: a real createos-local control plane for every suite."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from langflow_sandbox_createos.local.images import TEMPLATE_NAME
from langflow_sandbox_createos.local.testing import LocalControlPlane

# `make test` runs the suite in pytest-xdist workers, a test file to one worker as a whole (its
# module fixtures run once: the fault matrix runs every case up front), with two exceptions,
# each run by one worker: the end-to-end files (one Langflow server for the session) and the two
# that build this source tree (`python -m build`, `pip wheel`). The scheduler below does it.
# (xdist's own `--dist loadgroup` does not, under pytest 9: it renames each item's `_nodeid`,
# which pytest 9 no longer reads, so every test was its own group; files were spread over both
# workers and their module fixtures, the fault matrix's 545 cases among them, ran in each.)
SAME_WORKER = {
    "tests/e2e/": "e2e",
    "tests/packaging/": "builds",
    "tests/component/test_component_wheel.py": "builds",
}
# Started first, the longest groups do not end the run alone on one worker.
FIRST = ("tests/e2e/", "tests/reliability/", "tests/executor/")


def _group(path: str) -> str:
    return next((group for prefix, group in SAME_WORKER.items() if path.startswith(prefix)), path)


def _rank(item: pytest.Item) -> int:
    path = item.nodeid.split("::", 1)[0]
    return next((i for i, prefix in enumerate(FIRST) if path.startswith(prefix)), len(FIRST))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=_rank)  # stable: a file's tests keep their order


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Whole groups (a file, or one of SAME_WORKER's) to one worker, in collection order."""
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid.split("::", 1)[0])

    config.option.loadscopereorder = False  # keep FIRST's order, not the largest group first
    return ByGroup(config, log)


# Sandboxes whose names start with this are deliberately kept between tests (reused guests).
KEEP_PREFIX = "lf-c-"


@pytest.fixture(scope="session")
def control_plane() -> Iterator[LocalControlPlane]:
    """One createos-local for the whole session (boot delay 0)."""
    with LocalControlPlane(boot_delay_ms=0) as plane:
        yield plane


@pytest.fixture
def cp(control_plane: LocalControlPlane) -> Iterator[LocalControlPlane]:
    """The session control plane with no faults; fails the test if it leaves a live sandbox
    behind (names starting with ``lf-c-`` excepted)."""
    control_plane.clear_faults()
    yield control_plane
    control_plane.clear_faults()
    leaked = control_plane.wait_until_no_live(timeout=5.0, ignore_prefix=KEEP_PREFIX)
    if leaked:
        for sb in leaked:
            control_plane.delete_sandbox(sb["id"])
        pytest.fail(f"test left live sandboxes behind: {leaked}")


@pytest.fixture
def createos_env(monkeypatch: pytest.MonkeyPatch, control_plane: LocalControlPlane) -> LocalControlPlane:
    """Point the plugin at the local control plane through its environment variables; the
    executor's guests use createos-local's lfx template, as a deployment uses its template
    (``devbox:1`` is a plain image without lfx)."""
    monkeypatch.setenv("CREATEOS_SANDBOX_API_KEY", control_plane.api_key)
    monkeypatch.setenv("CREATEOS_SANDBOX_BASE_URL", control_plane.url)
    monkeypatch.setenv("CREATEOS_EXECUTOR_ROOTFS", TEMPLATE_NAME)
    # createos-local's guests are namespaces, not microVMs: the backend refuses them unless
    # told that is accepted (tests/backend/test_isolation_report.py checks the refusal)
    monkeypatch.setenv("CREATEOS_SANDBOX_ACCEPT_LOCAL_ISOLATION", "true")
    return control_plane
