"""Guest Reuse = flow, run by lfx inside a real Graph on createos-local."""

from __future__ import annotations

import concurrent.futures
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lfx.exceptions.component import ComponentBuildError
from lfx.utils.sandbox.base import SandboxUnavailableError
from waiting import wait_status

from langflow_sandbox_createos.component import reuse
from langflow_sandbox_createos.core import network
from langflow_sandbox_createos.local.testing import LocalControlPlane, NamespaceHost

from .conftest import USER_ID, client, run_flow

COUNTER = (
    "import pathlib\n"
    "p = pathlib.Path('/workspace/counter')\n"
    "n = int(p.read_text()) + 1 if p.exists() else 1\n"
    "p.write_text(str(n))\n"
    "print(n)\n"
)


def run_reused(component_cls: type, **params: Any) -> dict[str, Any]:
    params.setdefault("python_code", COUNTER)
    return run_flow(component_cls, session_mode="flow", **params).results


def live_named(plane: LocalControlPlane, name: str) -> list[dict[str, Any]]:
    return [sb for sb in plane.live_sandboxes() if sb.get("name") == name]


def test_three_runs_share_one_guest(component_cls: type, reuse_env: LocalControlPlane) -> None:
    runs = [run_reused(component_cls) for _ in range(3)]
    assert [r["result"] for r in runs] == ["1", "2", "3"]
    assert len({r["sandbox_id"] for r in runs}) == 1
    assert [r["reused_guest"] for r in runs] == [False, True, True]
    name = reuse.reuse_name("flow-test", "CreateOSSandbox-t0001", network.DENY_ALL, (f"user:{USER_ID}",))
    assert name.startswith("lf-c-") and len(name) == 22
    [guest] = live_named(reuse_env, name)  # kept after the runs, not deleted
    assert guest["id"] == runs[0]["sandbox_id"] and guest["status"] == "running"


def test_reuse_survives_a_worker_restart(component_cls: type, reuse_env: LocalControlPlane) -> None:
    first = run_reused(component_cls)
    reuse.guest_ids.clear()  # a new process knows nothing: it finds the guest by name
    second = run_reused(component_cls)
    assert second["sandbox_id"] == first["sandbox_id"] and second["result"] == "2"


def test_other_flows_and_components_get_their_own_guest(
    component_cls: type, reuse_env: LocalControlPlane
) -> None:
    a = run_reused(component_cls)
    b = run_reused(component_cls, flow_id="flow-other")
    c = run_reused(component_cls, component_id="CreateOSSandbox-t0002")
    assert len({a["sandbox_id"], b["sandbox_id"], c["sandbox_id"]}) == 3
    assert [a["result"], b["result"], c["result"]] == ["1", "1", "1"]


def test_paused_guest_is_resumed(component_cls: type, reuse_env: LocalControlPlane) -> None:
    first = run_reused(component_cls)
    client().pause(first["sandbox_id"])
    wait_status(client(), first["sandbox_id"], "paused")
    second = run_reused(component_cls)
    assert second["sandbox_id"] == first["sandbox_id"]
    assert second["result"] == "2" and second["reused_guest"] is True
    assert client().get(first["sandbox_id"])["status"] == "running"  # resumed


def test_paused_guest_is_found_without_the_process_cache(
    component_cls: type, reuse_env: LocalControlPlane
) -> None:
    first = run_reused(component_cls)
    client().pause(first["sandbox_id"])
    wait_status(client(), first["sandbox_id"], "paused")
    reuse.guest_ids.clear()
    second = run_reused(component_cls)
    assert second["sandbox_id"] == first["sandbox_id"] and second["result"] == "2"
    assert client().get(first["sandbox_id"])["status"] == "running"  # resumed


def test_guest_that_pauses_between_lookup_and_exec_is_resumed_and_retried(
    component_cls: type, reuse_env: LocalControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = run_reused(component_cls)
    paused: list[str] = []

    def pause_now(c: Any, sandbox_id: str) -> None:
        if not paused:
            c.pause(sandbox_id)
            wait_status(c, sandbox_id, "paused")
            paused.append(sandbox_id)

    monkeypatch.setattr(reuse, "after_acquire", pause_now)
    second = run_reused(component_cls)
    assert paused == [first["sandbox_id"]]  # the exec met a paused guest (409)...
    assert second["sandbox_id"] == first["sandbox_id"]  # ...which was resumed and the run retried once
    assert second["result"] == "2" and second["exit_code"] == 0
    assert client().get(first["sandbox_id"])["status"] == "running"


def test_allow_network_gives_a_different_guest(component_cls: type, reuse_env: LocalControlPlane) -> None:
    closed = run_reused(component_cls)
    opened = run_reused(component_cls, allow_network=True)
    closed_again = run_reused(component_cls)
    assert opened["sandbox_id"] != closed["sandbox_id"]
    assert opened["result"] == "1"  # a different machine, so a different filesystem
    assert closed_again["sandbox_id"] == closed["sandbox_id"] and closed_again["result"] == "2"
    assert client().get_egress(closed["sandbox_id"]) == list(network.DENY_ALL)
    assert network.egress_matches(client().get_egress(opened["sandbox_id"]), network.ALLOW_ALL)


def test_guest_whose_egress_drifted_is_refused(component_cls: type, reuse_env: LocalControlPlane) -> None:
    first = run_reused(component_cls)
    client().put_egress(first["sandbox_id"], ["*"])  # opened behind the component's back
    for forget in (False, True):
        if forget:
            reuse.guest_ids.clear()
        with pytest.raises(ComponentBuildError) as failed:  # how lfx's Graph reports a failed vertex
            run_reused(component_cls)
        assert isinstance(failed.value.__cause__, SandboxUnavailableError)
        assert "Refusing to reuse guest " + first["sandbox_id"] in str(failed.value.__cause__)
    assert client().get(first["sandbox_id"])["status"] == "running"  # refused, not touched


def test_stale_files_from_earlier_runs_do_not_come_back(
    component_cls: type, reuse_env: LocalControlPlane
) -> None:
    one = run_flow(
        component_cls,
        session_mode="flow",
        collect_artifacts=True,
        command="echo 1 > /workspace/artifacts/one.txt",
    )
    two = run_flow(
        component_cls,
        session_mode="flow",
        collect_artifacts=True,
        command="echo 2 > /workspace/artifacts/two.txt",
    )
    assert one.results["sandbox_id"] == two.results["sandbox_id"]
    assert list(one.files["path"]) == ["one.txt"]
    assert list(two.files["path"]) == ["two.txt"]
    # the per-run archive was removed after the download
    leftovers = client().exec(
        one.results["sandbox_id"],
        "/bin/sh",
        ["-c", "ls -d /tmp/createos-run-* 2>/dev/null | wc -l"],
        timeout=30,
    )
    assert leftovers.stdout.strip() == "0"


def test_timed_out_run_on_a_reused_guest_returns_only_its_own_files(
    component_cls: type, reuse_env: LocalControlPlane
) -> None:
    run_flow(
        component_cls,
        session_mode="flow",
        collect_artifacts=True,
        command="echo old > /workspace/artifacts/old",
    )
    run = run_flow(
        component_cls,
        session_mode="flow",
        collect_artifacts=True,
        timeout_seconds=2,
        command="echo new > /workspace/artifacts/new; sleep 60",
    )
    assert run.results["timed_out"] is True
    assert list(run.files["path"]) == ["new"]


def test_concurrent_runs_share_one_guest_and_keep_their_own_files(
    component_cls: type, reuse_env: LocalControlPlane
) -> None:
    workers = 3
    barrier = threading.Barrier(workers)

    def one(i: int) -> Any:
        barrier.wait()
        return run_flow(
            component_cls,
            session_mode="flow",
            collect_artifacts=True,
            python_code=(
                "import time\n"
                f"open('/workspace/artifacts/w{i}.txt', 'w').write('{i}')\n"
                "time.sleep(0.5)\n"
                "import os\nprint(sorted(os.listdir('/workspace/artifacts')))\n"
            ),
        )

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        runs = list(pool.map(one, range(workers)))
    assert len({r.results["sandbox_id"] for r in runs}) == 1
    for i, r in enumerate(runs):
        assert r.results["exit_code"] == 0, r.results
        assert list(r.files["path"]) == [f"w{i}.txt"]
        assert r.results["result"] == str([f"w{i}.txt"])  # never saw another run's file
    name = reuse.reuse_name("flow-test", "CreateOSSandbox-t0001", network.DENY_ALL, (f"user:{USER_ID}",))
    assert len(live_named(reuse_env, name)) == 1


def test_a_reused_run_is_two_requests(component_cls: type, reuse_env: LocalControlPlane) -> None:
    """After the first run: one GET (the guest is still this component's, running, with the
    same egress) and one exec carrying the program on stdin."""
    run_reused(component_cls)
    before = dict(reuse_env.stats()["requests"])
    second = run_reused(component_cls)
    after = reuse_env.stats()["requests"]
    delta = {k: n - before.get(k, 0) for k, n in after.items() if not k.startswith("local_")}
    assert second["result"] == "2"
    assert {k: n for k, n in delta.items() if n} == {"get": 1, "exec_stream": 1}, delta


# pip installs from a package index of the test's own: a test host (a network namespace the
# test makes) serving one wheel, reached through the guest's open egress; never the internet
PIP_INSTALL = (
    "import subprocess, sys\n"
    "done = subprocess.run([sys.executable, '-m', 'pip', 'install', '--user', '--break-system-packages',\n"
    "    '--disable-pip-version-check', '--no-input', '-q', '--no-index', '--find-links', '{index}',\n"
    "    '--trusted-host', '{host}',\n"
    "    'createos-tinypkg'], capture_output=True, text=True)\n"
    "print('pip', done.returncode, done.stderr[-400:])\n"
)
IMPORT_IT = (
    "try:\n"
    "    import createos_tinypkg\n"
    "    print('imported', createos_tinypkg.__file__)\n"
    "except ImportError:\n"
    "    print('missing')\n"
)


def _tiny_wheel(directory: Path) -> None:
    info = "createos_tinypkg-1.0.dist-info"
    files = {
        "createos_tinypkg/__init__.py": "VALUE = 1\n",
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: createos-tinypkg\nVersion: 1.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(directory / "createos_tinypkg-1.0-py3-none-any.whl", "w") as wheel:
        for name, text in {**files, f"{info}/RECORD": record}.items():
            wheel.writestr(name, text)


@pytest.fixture
def package_index(tmp_path: Path) -> Iterator[NamespaceHost]:
    _tiny_wheel(tmp_path)
    with NamespaceHost(serve_dir=tmp_path) as host:
        yield host


def test_packages_installed_in_a_reused_guest_stay_in_that_guest(
    component_cls: type, reuse_env: LocalControlPlane, package_index: NamespaceHost
) -> None:
    """A reused guest is a machine: what run 1 installs from the package index (into the
    guest user's site, on the guest's own disk) is importable in run 2, and in no other guest."""
    params = {"allow_network": True, "timeout_seconds": 120}
    first = run_reused(
        component_cls,
        python_code=PIP_INSTALL.format(index=package_index.url, host=package_index.address),
        **params,
    )
    assert first["result"].startswith("pip 0"), first
    second = run_reused(component_cls, python_code=IMPORT_IT, **params)
    assert second["sandbox_id"] == first["sandbox_id"]
    where = second["result"]
    assert where.startswith("imported /root/.local/lib/python3"), second
    assert where.endswith("/site-packages/createos_tinypkg/__init__.py"), second
    other = run_reused(component_cls, python_code=IMPORT_IT, component_id="CreateOSSandbox-t0009", **params)
    assert other["sandbox_id"] != first["sandbox_id"]
    assert other["result"] == "missing"
