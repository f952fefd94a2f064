"""The guest lease's contract (core/lease.py), the same for every surface and both warm pools.

No guest of a run or a pool outlives its process: a run's guest (cold, or taken from a warm
pool) is held by the guest keeper from its create until its delete is done, so a process that
ends mid-run, however it ends, leaves it to the keeper; a run that ends releases it; a guest
whose delete failed stays held, for the keeper; a fork child holds and deletes only its own.
Each rule is checked on each surface (the sandbox backend, the CreateOS Sandbox component, the
whole-flow executor) by a real run in a child process against the test's createos-local, and
the lease's own steps are checked without a surface. The one exception to the rule is a
surface's own: the component's reused guest (Guest Reuse) is kept, not held.

The benchmark that found the rule (docs/performance.md, S8 finding 3) killed a Langflow server
mid-load and found 8 `lf-x-` guests of runs in flight still running.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

import pytest
from keeper_child import KEEPER_LINE, REPO, WAYS, every_id, run_child, status, wait_exited, wait_gone

from langflow_sandbox_createos.core import budget, connection, guest_spec, lease, pool_keeper, settings
from langflow_sandbox_createos.local.images import TEMPLATE_NAME

pytestmark = pytest.mark.timeout(300)

# --- each surface's run, as a child process does it ------------------------------------------

_BACKEND_RUN = """
import threading
from langflow_sandbox_createos.backend.engine import create_backend
backend = create_backend()

def start(seconds):
    threading.Thread(target=backend.run, args=(f"import time\\ntime.sleep({seconds})",), daemon=True).start()

def clean():
    result = backend.run("print('done')")
    assert result.stdout == "done\\n", result
    backend.shutdown()  # waits for the background delete and collects its outcome

def fill_pool():
    backend.run("print('warm-up')")  # goes cold and starts the pool
    assert backend._pool.wait_full(20)

def settled():  # no create of a refill in flight at the kill
    assert backend._pool.wait_full(20)
"""

_COMPONENT_RUN = """
import threading
from langflow_sandbox_createos.component import engine

def request(program):
    fields = {"python_code": program, "timeout_seconds": 150}
    return engine.build_request(fields, component_id="lease-node", flow_id="lease-flow", user_id="u", session_id=None)

def start(seconds):
    threading.Thread(target=engine.run, args=(request(f"import time\\ntime.sleep({seconds})"),), daemon=True).start()

def clean():
    outcome = engine.run(request("print('done')"))
    assert outcome.stdout == "done\\n", outcome

def kept():
    fields = {"python_code": "print('kept')", "session_mode": "flow", "timeout_seconds": 150}
    req = engine.build_request(fields, component_id="lease-node", flow_id="lease-kept", user_id="u", session_id=None)
    outcome = engine.run(req)
    assert outcome.stdout == "kept\\n" and outcome.reused_guest is False, outcome
    return outcome.sandbox_id
"""

_EXECUTOR_RUN = f"""
import asyncio, threading
sys.path.insert(0, {str(REPO / "tests" / "executor" / "flow_components")!r})
from sleeper import Sleeper
from lfx.components.input_output import ChatInput, ChatOutput
from lfx.execution.types import Unit
from lfx.graph import Graph
from lfx.schema.schema import InputValueRequest
from langflow_sandbox_createos.core import connection, lease, settings
from langflow_sandbox_createos.executor import CreateOSExecutor, pool

def unit(middle):
    chat_in, chat_out = ChatInput(_id="chat-in"), ChatOutput(_id="chat-out")
    if middle:
        nap = Sleeper(_id="middle")
        nap.set(input_value=chat_in.message_response)
        chat_out.set(input_value=nap.nap)
    else:
        chat_out.set(input_value=chat_in.message_response)
    graph = Graph(chat_in, chat_out)
    return Unit(graph=graph, runtime_options={{"initial_inputs": InputValueRequest(input_value="x")}})

async def drain(middle):
    return [item async for item in CreateOSExecutor().execute(unit(middle))]

def start(seconds):  # ChatInput -> Sleeper (120 s) -> ChatOutput
    threading.Thread(target=asyncio.run, args=(drain(True),), daemon=True).start()

def clean():
    asyncio.run(drain(False))
    lease.wait_for_deletes(60)  # the run returned before its guest's delete did

def fill_pool():
    pool.take(connection.endpoints.get(), settings.executor_settings(), {{}})
    assert pool.pool().wait_full(240), pool.pool().stats()

def settled():
    assert pool.pool().wait_full(240), pool.pool().stats()
"""

IN_FLIGHT = """
client = connection.endpoints.get().client
LIVE = ("creating", "running")
if POOLED:
    fill_pool()
ready = set(pool_ids())
before = {row["id"] for row in client.list(prefix=PREFIX) if row["status"] in LIVE}
start(120)
deadline = time.monotonic() + 240
ours = set()
while time.monotonic() < deadline and not ours:  # the run's guest, as the pool or the control plane sees it
    if POOLED:
        ours = ready - set(pool_ids())
    else:
        ours = {row["id"] for row in client.list(prefix=PREFIX) if row["status"] in LIVE} - before
    time.sleep(0.05)
if POOLED:
    settled()
wait_held(ours)  # the create has returned
time.sleep(1.0)  # the run is under way
report(run=sorted(ours))
die(HOW)
"""

CLEAN = """
clean()
report(run=[])
die(HOW)
"""


@dataclass(frozen=True)
class Surface:
    name: str
    run: str  # defines start(seconds), clean(), and for pooled surfaces fill_pool(), settled()
    prefix: str  # the names of a run's own guests
    pooled_prefix: str | None  # the names of its warm pool's guests (None: no pool)
    pool_ids: str  # an expression: the ids its pool holds ready
    pool_variable: str | None

    def script(self, body: str, *, pooled: bool = False) -> str:
        prefix = self.pooled_prefix if pooled else self.prefix
        head = "from langflow_sandbox_createos.core import connection\n" + self.run
        head += f"\ndef pool_ids():\n    return {self.pool_ids}\n"
        return head + body.replace("POOLED", repr(pooled)).replace("PREFIX", repr(prefix))


SURFACES = {
    "backend": Surface(
        "backend", _BACKEND_RUN, "lf-", "lf-w-", "backend._pool.ready_ids()", "CREATEOS_SANDBOX_WARM_POOL"
    ),
    "component": Surface("component", _COMPONENT_RUN, "lf-c-", None, "[]", None),
    "executor": Surface(
        "executor", _EXECUTOR_RUN, "lf-x-", "lf-xw-", "pool.pool().ready_ids()", "CREATEOS_EXECUTOR_WARM_POOL"
    ),
}


@pytest.fixture
def plane(cp: Any, createos_env: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """createos-local with every surface's settings at a runnable baseline: nothing of the
    developer's shell but the key and the URL the session's control plane set."""
    for name in list(os.environ):
        if name.startswith(("CREATEOS_", "LANGFLOW_SANDBOX", "LANGFLOW_EXECUTOR")) and name not in (
            "CREATEOS_SANDBOX_API_KEY",
            "CREATEOS_SANDBOX_BASE_URL",
        ):
            monkeypatch.delenv(name)
    # lfx's settings service keeps the environment it read first: here only the environment decides
    monkeypatch.setattr(settings, "_lfx_sandbox_settings", lambda: None)
    monkeypatch.setenv("LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS", "true")
    monkeypatch.setenv("CREATEOS_SANDBOX_ACCEPT_LOCAL_ISOLATION", "true")  # createos-local
    monkeypatch.setenv("LANGFLOW_SANDBOX_TIMEOUT_SECONDS", "150")
    monkeypatch.setenv("CREATEOS_EXECUTOR_TIMEOUT_SECONDS", "180")
    monkeypatch.setenv("CREATEOS_EXECUTOR_ROOTFS", TEMPLATE_NAME)
    return cp


# --- the contract, on every surface ------------------------------------------------------------

KILLED = [(surface, how, False) for surface in SURFACES for how in WAYS] + [
    (surface, "SIGKILL", True) for surface, s in SURFACES.items() if s.pooled_prefix
]


@pytest.mark.parametrize(("surface", "how", "pooled"), KILLED)
def test_a_killed_process_leaves_no_guest_of_a_run_in_flight(
    plane: Any, surface: str, how: str, pooled: bool
) -> None:
    """The run's guest (a pooled one the run took, too: the pool used to let go of a guest at
    take) is held while the run is in flight, and the keeper deletes every guest the process
    made when it dies without atexit."""
    s = SURFACES[surface]
    env = dict(os.environ)
    if pooled:
        env[str(s.pool_variable)] = "1"
    before = every_id(plane)
    report, stderr = run_child(s.script(IN_FLIGHT, pooled=pooled), how, env)
    (guest,) = report["run"]
    assert guest in report["held"], report
    assert KEEPER_LINE in stderr, stderr
    created = every_id(plane) - before
    assert guest in created
    wait_gone(plane, created)  # the run's guest, and any pooled one
    wait_exited(report["keeper"])


@pytest.mark.parametrize("surface", list(SURFACES))
def test_a_clean_run_leaves_the_keeper_nothing_to_do(plane: Any, surface: str) -> None:
    before = every_id(plane)
    report, stderr = run_child(SURFACES[surface].script(CLEAN), "exit", dict(os.environ))
    assert report["held"] == []  # the run's guest was released once its delete was done
    wait_exited(report["keeper"])
    assert KEEPER_LINE not in stderr, stderr
    created = every_id(plane) - before
    assert created
    assert all(status(plane, guest) in ("destroying", "destroyed") for guest in created)


# the backend's delete is queued in the background, and the native client retries a failed
# one once; the others delete with one plain call
DELETE_ATTEMPTS = {"backend": 2, "component": 1, "executor": 1}


@pytest.mark.parametrize("surface", list(SURFACES))
def test_a_guest_whose_delete_failed_stays_held_for_the_keeper(plane: Any, surface: str) -> None:
    attempts = DELETE_ATTEMPTS[surface]
    plane.set_faults({"rules": [{"route": "delete", "status": 500, "times": attempts}]})
    before = every_id(plane)
    report, stderr = run_child(SURFACES[surface].script(CLEAN), "os._exit", dict(os.environ))
    assert plane.fault_hits() == [attempts]  # the run's own delete failed...
    (guest,) = every_id(plane) - before
    assert report["held"] == [guest]  # ...so the guest stayed held...
    wait_gone(plane, [guest])  # ...and the keeper deleted it
    assert "deleted 1" in stderr, stderr
    wait_exited(report["keeper"])


def test_a_kept_reused_guest_outlives_a_killed_process(plane: Any) -> None:
    """Guest Reuse keeps the guest between runs on purpose, and other workers of the flow share
    it (the product page), so the keeper leaves it: a worker recycled while another one runs on
    the guest must not take it away. Idle expiry, the sweep, auto-pause and reap bound it."""
    report, stderr = run_child(
        SURFACES["component"].script("report(run=[kept()])\ndie(HOW)\n"), "SIGKILL", dict(os.environ)
    )
    (guest,) = report["run"]
    assert guest not in report["held"]
    wait_exited(report["keeper"])
    assert KEEPER_LINE not in stderr, stderr
    assert status(plane, guest) == "running"
    plane.delete_sandbox(guest)  # so the cp fixture's check holds


# --- a fork child (the blocking surfaces: the executor's runs live in an event loop, which a
# fork child does not get; the rule is the keeper's own at-fork hook, the same for all) --------


def _start_in_thread(surface: str, seconds: int) -> threading.Thread:
    program = f"import time\ntime.sleep({seconds})"
    if surface == "backend":
        from langflow_sandbox_createos.backend.engine import create_backend

        target: Any = lambda: create_backend().run(program)  # noqa: E731
    else:
        from langflow_sandbox_createos.component import engine

        fields = {"python_code": program, "timeout_seconds": 150}
        request = engine.build_request(
            fields, component_id="fork-node", flow_id="f", user_id="u", session_id=None
        )
        target = lambda: engine.run(request)  # noqa: E731
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def _new_held(before: set[str], thread: threading.Thread) -> str:
    deadline = time.monotonic() + 60
    while not pool_keeper.keepers.held_ids() - before:
        assert thread.is_alive() and time.monotonic() < deadline
        time.sleep(0.01)
    (guest,) = pool_keeper.keepers.held_ids() - before
    return guest


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX fork")
@pytest.mark.parametrize("surface", ["backend", "component"])
def test_a_fork_child_holds_and_deletes_only_its_own_guests(plane: Any, surface: str) -> None:
    """A fork child starts with nothing held: its keeper, when it dies, never deletes the
    parent's guest of a run in flight."""
    before = pool_keeper.keepers.held_ids()
    thread = _start_in_thread(surface, 20)
    parent_guest = _new_held(before, thread)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one run of its own, then die without atexit
        code = 1
        try:
            inherited = sorted(pool_keeper.keepers.held_ids())
            own = _new_held(set(), _start_in_thread(surface, 20))
            keeper = pool_keeper.keepers.for_endpoint(connection.endpoints.get()).pid
            os.write(write_fd, json.dumps({"inherited": inherited, "own": [own], "keeper": keeper}).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    _, code = os.waitpid(pid, 0)
    with os.fdopen(read_fd) as pipe:
        report = json.loads(pipe.read() or "{}")
    assert os.waitstatus_to_exitcode(code) == 0, report
    assert report["inherited"] == []
    (child_guest,) = report["own"]
    wait_gone(plane, [child_guest])  # the child's keeper deleted the child's guest...
    wait_exited(report["keeper"])
    assert status(plane, parent_guest) == "running"  # ...and only it
    assert parent_guest in pool_keeper.keepers.held_ids()
    thread.join(60)
    lease.wait_for_deletes(30)
    lease.drain_deletes(10)  # the backend's background delete: released once collected
    assert parent_guest not in pool_keeper.keepers.held_ids()


# --- the lease's own steps ---------------------------------------------------------------------


def _guest_spec() -> guest_spec.GuestSpec:
    return guest_spec.GuestSpec.of(
        connection.endpoints.get(),
        shape="s-1vcpu-256mb",
        rootfs="devbox:1",
        egress=["*"],
        budget=budget.backend(5),
    )


def _deletes(plane: Any) -> int:
    return int(plane.stats()["requests"].get("delete", 0))


def test_a_lease_holds_its_guest_from_create_to_end_and_ends_once(plane: Any) -> None:
    guest = lease.Lease.create(connection.endpoints.get(), _guest_spec(), guest_spec.random_name("lf-t-"))
    assert guest.held and guest.sandbox_id in pool_keeper.keepers.held_ids()
    assert status(plane, guest.sandbox_id) == "running"
    deletes = _deletes(plane)
    failed: list[BaseException] = []
    assert guest.end(failed.append) is True
    assert guest.end(failed.append) is False  # once, whoever asks again
    assert failed == [] and _deletes(plane) == deletes + 1
    assert guest.sandbox_id not in pool_keeper.keepers.held_ids()
    assert status(plane, guest.sandbox_id) in ("destroying", "destroyed")


def test_a_lease_whose_delete_failed_keeps_its_guest_held(plane: Any) -> None:
    guest = lease.Lease.create(connection.endpoints.get(), _guest_spec(), guest_spec.random_name("lf-t-"))
    plane.set_faults({"rules": [{"route": "delete", "status": 500, "times": 1}]})
    failed: list[BaseException] = []
    assert guest.end(failed.append) is False
    assert [getattr(exc, "status", None) for exc in failed] == [500]
    assert guest.sandbox_id in pool_keeper.keepers.held_ids()  # the keeper tries at exit
    plane.clear_faults()
    plane.delete_sandbox(guest.sandbox_id)  # what the keeper would do; so the cp fixture's check holds
    pool_keeper.release(guest.sandbox_id)


def test_a_kept_guest_is_leased_unheld(plane: Any) -> None:
    """Guest Reuse's guests outlive the process on purpose: never held, never reaped."""
    name = guest_spec.random_name("lf-t-")
    guest = lease.Lease.create(connection.endpoints.get(), _guest_spec(), name, kept=True)
    assert not guest.held and guest.sandbox_id not in pool_keeper.keepers.held_ids()
    assert guest.view["name"] == name
    assert guest.end(lambda exc: None) is True
    assert status(plane, guest.sandbox_id) in ("destroying", "destroyed")


def test_a_create_whose_answer_was_lost_leaves_no_guest(plane: Any) -> None:
    """The create lands but its answer is cut: the lease finds the guest by its name and
    deletes it before the error goes up."""
    from langflow_sandbox_createos import _createos as native

    name = guest_spec.random_name("lf-t-")
    plane.set_faults({"rules": [{"route": "create", "reset": True, "after_bytes": 20, "times": 1}]})
    with pytest.raises(native.CreateOSError):
        lease.Lease.create(connection.endpoints.get(), _guest_spec(), name)
    assert plane.fault_hits() == [1]
    made = [row for row in plane.sandboxes() if row["name"] == name]
    assert made, "the fault did not let the create land"
    assert all(row["status"] in ("destroying", "destroyed") for row in made)
    assert not {row["id"] for row in made} & pool_keeper.keepers.held_ids()


def test_a_slot_is_given_back_once() -> None:
    from langflow_sandbox_createos.core import admission

    line = admission.Line("test")
    assert line.try_enter_spare(2)
    slot = lease.Slot(line)
    slot.leave()
    slot.leave()
    assert line.in_flight == 0
