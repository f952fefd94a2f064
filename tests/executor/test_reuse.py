"""A warm executor per trust domain (CREATEOS_EXECUTOR_REUSE=true, issue 45), on createos-local.

The runs of one flow and owner share guests with a warm runner (lfx already imported): each run
is forked from it, so it pays neither a boot nor an import, and behaves as in-process (the
parity suite also runs with reuse on: parity/test_parity_reuse.py). Other flows, other owners
and a changed guest policy never share a guest; guests serve a bounded number of runs at once,
go when idle, and are held by the guest keeper."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from langflow_sandbox_createos.executor import CreateOSExecutor, reuse
from langflow_sandbox_createos.executor.results import GuestStatus

from .conftest import drain
from .flow_components.sleeper import Sleeper
from .parity.test_parity import (
    FLOW_ID,
    USER_ID,
    HostMemory,
    assert_same,
    both,
    live_values_graph,
    memory,
)

__all__ = ["memory"]
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]

OTHER_USER = str(uuid.UUID(int=8))
OTHER_FLOW = str(uuid.UUID(int=43))


@pytest.fixture
def reusing(executor_env: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("CREATEOS_EXECUTOR_REUSE", "true")
    yield executor_env
    reuse.domains.shutdown()  # this test's reused guests go before the plane is checked


def reused_guests(cp: Any) -> list[dict[str, Any]]:
    """The reused guests on the plane that are not deleted (other tests' ones are)."""
    return [
        sb
        for sb in cp.sandboxes()
        if (sb.get("name") or "").startswith(reuse.NAME_PREFIX)
        and sb["status"] not in ("destroyed", "destroying")
    ]


def standby_waits(guest: reuse.WarmGuest) -> bool:
    standby = guest.standby
    return standby is not None and "waiting" in standby.early_kinds()


def graph_for(user: str = USER_ID, flow: str = FLOW_ID) -> Any:
    graph = live_values_graph()
    graph.user_id, graph.flow_id = user, flow
    return graph


async def until(check: Any, what: str, seconds: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not check():
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.1)


async def statuses(graph: Any) -> list[GuestStatus]:
    from lfx.execution.types import Unit

    unit = Unit(graph=graph, inputs=[{"input_value": "hi"}], runtime_options={"session_id": "s-reuse"})
    return [
        item.payload
        for item in await drain(CreateOSExecutor().execute(unit))
        if isinstance(getattr(item, "payload", None), GuestStatus)
    ]


async def test_runs_of_one_flow_and_owner_share_a_warm_guest_and_match_in_process(
    reusing: Any, memory: HostMemory
) -> None:
    reference, first = await both(graph_for, memory, "s-reuse-1")
    assert_same(reference, first)
    made = reused_guests(reusing)
    assert len(made) == 1, made
    (guest,) = reuse.domains.guests()
    for session in ("s-reuse-2", "s-reuse-3"):  # each served by the process forked ahead for it
        await until(lambda: guest.runs == 0 and standby_waits(guest), "no standby run waits")
        reference, ours = await both(graph_for, memory, session)
        assert_same(reference, ours)
    assert guest.served_ahead == 2, guest.served_ahead
    assert [sb["id"] for sb in reused_guests(reusing)] == [made[0]["id"]]  # no other guest made
    (status,) = await statuses(graph_for())
    assert status.reused and status.sandbox_id == made[0]["id"], status


async def test_other_owners_flows_and_policies_get_guests_of_their_own(
    reusing: Any, memory: HostMemory, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = {}
    for name, graph in (
        ("a", graph_for()),
        ("b", graph_for(user=OTHER_USER)),
        ("c", graph_for(flow=OTHER_FLOW)),
    ):
        (status,) = await statuses(graph)
        ids[name] = status.sandbox_id
    monkeypatch.setenv("CREATEOS_EXECUTOR_EGRESS", "10.213.0.0/16")  # a changed policy
    (status,) = await statuses(graph_for())
    ids["a-narrowed"] = status.sandbox_id
    assert len(set(ids.values())) == 4, ids
    (status,) = await statuses(graph_for())  # and the policy's guest serves it again
    assert status.sandbox_id == ids["a-narrowed"], (status, ids)


async def test_a_run_without_an_owner_gets_a_throwaway_guest(reusing: Any) -> None:
    before = {sb["id"] for sb in reused_guests(reusing)}
    (status,) = await statuses(graph_for(user=None))  # type: ignore[arg-type]
    assert not status.reused and status.sandbox_id
    assert {sb["id"] for sb in reused_guests(reusing)} == before  # no reused guest made for it


async def test_runs_beyond_a_guests_limit_get_another_guest(
    reusing: Any, memory: HostMemory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CREATEOS_EXECUTOR_REUSE_MAX_RUNS", "1")
    found = await asyncio.gather(statuses(graph_for()), statuses(graph_for()))
    assert len({s.sandbox_id for (s,) in found}) == 2, found
    assert all(s.reused for (s,) in found)


async def test_idle_guests_are_deleted(reusing: Any) -> None:
    (status,) = await statuses(graph_for())
    (guest,) = reuse.domains.guests()
    assert guest.sandbox_id == status.sandbox_id
    await until(lambda: guest.runs == 0, "the run was never given back")
    assert reuse.domains.reap_idle() == []  # just used: kept
    far = float("inf")
    assert reuse.domains.reap_idle(now=far) == [status.sandbox_id]
    reusing.wait_until_no_live(timeout=30.0, ignore_prefix="lf-c-")
    assert status.sandbox_id not in {sb["id"] for sb in reused_guests(reusing)}


async def test_a_cancelled_run_is_ended_in_the_guest_which_serves_the_next(reusing: Any) -> None:
    """A consumer that closes the stream of a run still running in a reused guest: the run's
    process group is killed there, the guest is given back, and the next run is served."""
    from lfx.execution.types import Unit

    from .conftest import middle_graph

    sleepy = middle_graph(Sleeper, "nap")
    sleepy.user_id, sleepy.flow_id = USER_ID, FLOW_ID
    stream = CreateOSExecutor().execute(Unit(graph=sleepy, inputs=[{"input_value": "x"}], runtime_options={}))
    first = await stream.__anext__()
    assert isinstance(first.payload, GuestStatus) and first.payload.reused
    await stream.aclose()
    guest = next(iter(reuse.domains.guests()))
    await until(lambda: guest.runs == 0, "the cancelled run was never given back")
    assert guest.runner_pid

    def runs_in_guest() -> list[str]:  # the warm runner's children: one per run (zombies too)
        out = guest.lease.exec(
            "sh", ["-c", f"cat /proc/{guest.runner_pid}/task/*/children"], timeout=30, stream=False
        )
        assert out.exit_code == 0, out
        standby = guest.standby.guest_process if guest.standby is not None else None
        return [pid for pid in out.stdout.split() if standby is None or pid != str(standby[0])]

    await until(lambda: runs_in_guest() == [], "the cancelled run still runs in the guest", 30.0)
    (status,) = await statuses(graph_for())
    assert status.sandbox_id == guest.sandbox_id


async def test_a_run_on_a_warm_guest_with_a_run_to_spare_takes_no_place_in_the_line(
    reusing: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CREATEOS_EXECUTOR_MAX_GUESTS paces guests, not the runs of a warm one: with one place in
    the line, held by a run asleep on the domain's reused guest, a second run of the domain is
    served on that guest at once instead of waiting behind it (it would wait out the 5 s wait
    and be refused if it took a place)."""
    from lfx.execution.types import Unit

    from .conftest import middle_graph

    monkeypatch.setenv("CREATEOS_EXECUTOR_MAX_GUESTS", "1")
    monkeypatch.setenv("CREATEOS_EXECUTOR_MAX_WAIT_SECONDS", "5")
    sleepy = middle_graph(Sleeper, "nap")
    sleepy.user_id, sleepy.flow_id = USER_ID, FLOW_ID
    asleep = CreateOSExecutor().execute(Unit(graph=sleepy, inputs=[{"input_value": "x"}], runtime_options={}))
    first = await asleep.__anext__()
    assert isinstance(first.payload, GuestStatus) and first.payload.reused
    try:
        (status,) = await statuses(graph_for())
        assert status.reused and status.sandbox_id == first.payload.sandbox_id, status
    finally:
        await asleep.aclose()


async def test_the_warm_runner_is_warmed_with_the_domains_own_flow(reusing: Any) -> None:
    """A reused guest's warm runner builds the first run's flow once at start (never runs it),
    so what the flow's components import is loaded before any run is forked: the component's
    code was built by the runner (before it forked its daemon) and then by the run."""
    from lfx.execution.types import Unit

    from .conftest import middle_graph
    from .flow_components.built_by import BuiltBy

    graph = middle_graph(BuiltBy, "echo")
    graph.user_id, graph.flow_id = USER_ID, str(uuid.UUID(int=45))
    items = await drain(
        CreateOSExecutor().execute(Unit(graph=graph, inputs=[{"input_value": "x"}], runtime_options={}))
    )
    (status,) = [i.payload for i in items if isinstance(getattr(i, "payload", None), GuestStatus)]
    (guest,) = [g for g in reuse.domains.guests() if g.sandbox_id == status.sandbox_id]
    notes = guest.lease.exec("cat", ["/tmp/createos-built-by"], timeout=30, stream=False)
    assert notes.exit_code == 0, notes
    builders = notes.stdout.split()  # the warm runner at its start, then the run's own process
    assert len(builders) >= 2 and builders[0] != builders[-1], builders


async def test_the_warm_runner_loads_what_a_run_imported_on_first_use(reusing: Any) -> None:
    """A component that imports a module only when it runs (the OpenAI model imports its client,
    0.8 s of CPU, on first use) made every run forked from the warm runner import it again: 1.3 s
    of guest CPU per work-flow run in S8 (issue 45). Now a run that ended well names the modules
    it imported to the runner, which imports them from the image: the first run's process had
    to import the module, the later runs (three processes, one guest) start with it."""
    from lfx.execution.types import Unit

    from .conftest import middle_graph
    from .flow_components.lazy_importer import LAZY, LazyImporter

    seen, guests = [], set()
    for _ in range(3):
        graph = middle_graph(LazyImporter, "use")
        graph.user_id, graph.flow_id = USER_ID, str(uuid.UUID(int=46))
        items = await drain(
            CreateOSExecutor().execute(Unit(graph=graph, inputs=[{"input_value": "x"}], runtime_options={}))
        )
        (status,) = [i.payload for i in items if isinstance(getattr(i, "payload", None), GuestStatus)]
        guests.add(status.sandbox_id)
        outputs = items[-1].outputs[0].outputs
        (text,) = [r.results["message"].text for r in outputs if r and "message" in (r.results or {})]
        pid, had = text.split(":")
        seen.append((pid, had))
        # the next run is forked once this one has ended (its process gone, its modules told)
        await until(lambda: all(g.runs == 0 for g in reuse.domains.guests()), "the run was never given back")
    assert len(guests) == 1 and len({pid for pid, _ in seen}) == 3, (guests, seen)
    assert [had for _, had in seen] == ["False", "True", "True"], (LAZY, seen)


async def test_a_later_run_finds_its_process_forked_ahead_and_hands_it_only_the_spec(reusing: Any) -> None:
    """Once a run of a domain gave its guest back, the warm runner forks the next run's process
    ahead of need (a standby, waiting for a spec as a pooled runner does): the next run uploads
    its spec to it instead of starting an exec and a connector on its path (about 60 ms of S7's
    reused run). The run that came is served by that very process, with its own result."""
    from lfx.execution.types import Unit

    from .conftest import middle_graph
    from .flow_components.lazy_importer import LazyImporter

    async def run_once() -> tuple[GuestStatus, str]:
        graph = middle_graph(LazyImporter, "use")
        graph.user_id, graph.flow_id = USER_ID, str(uuid.UUID(int=47))
        items = await drain(
            CreateOSExecutor().execute(Unit(graph=graph, inputs=[{"input_value": "x"}], runtime_options={}))
        )
        (status,) = [i.payload for i in items if isinstance(getattr(i, "payload", None), GuestStatus)]
        outputs = items[-1].outputs[0].outputs
        (text,) = [r.results["message"].text for r in outputs if r and "message" in (r.results or {})]
        return status, text.split(":")[0]

    first, first_pid = await run_once()
    assert first.reused and not first.standby, first  # the domain's first run: forked on its path
    (guest,) = reuse.domains.guests()

    def waiting_pid() -> int | None:
        standby = guest.standby
        if standby is None or "waiting" not in standby.early_kinds() or standby.guest_process is None:
            return None
        return standby.guest_process[0]

    await until(lambda: waiting_pid() is not None, "no run process waits in the reused guest")
    ahead = waiting_pid()
    second, second_pid = await run_once()
    assert second.reused and second.standby and second.sandbox_id == first.sandbox_id, second
    assert int(second_pid) == ahead != int(first_pid), (ahead, first_pid, second_pid)
    await until(lambda: waiting_pid() not in (None, ahead), "no new standby after the second run")


async def test_a_run_whose_standby_died_forks_its_own_on_the_same_guest(reusing: Any) -> None:
    """The process forked ahead is gone (killed in the guest, as flow code of the domain could):
    the next run is not lost and the guest is kept: the run forks its own process through the
    connector, and a new standby is forked after it."""
    (first,) = await statuses(graph_for())
    (guest,) = reuse.domains.guests()
    await until(lambda: guest.runs == 0 and standby_waits(guest), "no standby run waits")
    standby = guest.standby
    assert standby is not None and standby.guest_process is not None
    killed = guest.lease.exec("kill", ["-9", str(standby.guest_process[0])], timeout=30, stream=False)
    assert killed.exit_code == 0, killed
    await until(lambda: not standby.alive(), "the killed standby's exec did not end")
    (second,) = await statuses(graph_for())
    assert second.reused and not second.standby and second.sandbox_id == first.sandbox_id, second
    await until(lambda: guest.runs == 0 and standby_waits(guest), "no new standby after the run")
    (third,) = await statuses(graph_for())
    assert third.standby and third.sandbox_id == first.sandbox_id, third


async def _busy_domain(monkeypatch: pytest.MonkeyPatch, max_wait: int) -> tuple[Any, GuestStatus]:
    """The domain's only guest busy with a run that sleeps (one run per guest), which also holds
    the line's only place (it made the guest), and a line that expects a new guest to take
    1000 s: a second run of the domain is refused by the line at once."""
    from lfx.execution.types import Unit

    from langflow_sandbox_createos.core import lease

    from .conftest import middle_graph

    monkeypatch.setenv("CREATEOS_EXECUTOR_REUSE_MAX_RUNS", "1")
    monkeypatch.setenv("CREATEOS_EXECUTOR_MAX_GUESTS", "1")
    monkeypatch.setenv("CREATEOS_EXECUTOR_MAX_WAIT_SECONDS", str(max_wait))
    sleepy = middle_graph(Sleeper, "nap")
    sleepy.user_id, sleepy.flow_id = USER_ID, FLOW_ID
    asleep = CreateOSExecutor().execute(Unit(graph=sleepy, inputs=[{"input_value": "x"}], runtime_options={}))
    first = await asleep.__anext__()
    assert isinstance(first.payload, GuestStatus) and first.payload.reused
    line = lease.EXECUTOR.line
    monkeypatch.setattr(line, "_mean_hold", None)  # the process's line, restored after the test
    line.observe_hold(1000.0)
    return asleep, first.payload


async def test_a_run_the_line_refuses_is_served_when_its_domains_guest_frees_a_run(
    reusing: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The line's estimate counts guests to be made, not the runs of warm ones: S8 at 64 in
    flight refused 27 of 168 runs of a reused flow with 503 while its guests freed a run every
    fraction of a second. A run whose domain's guests are busy now waits for the first of a
    spare run there or a place in the line, and the line's refusal stands only if no run frees
    within CREATEOS_EXECUTOR_MAX_WAIT_SECONDS."""
    asleep, first = await _busy_domain(monkeypatch, max_wait=60)
    second = asyncio.ensure_future(statuses(graph_for()))
    try:
        await asyncio.sleep(1.0)
        assert not second.done(), second  # refused by the line at once before: not any more
    finally:
        await asleep.aclose()  # the sleeping run ends (killed in its guest): its run comes free
    (status,) = await asyncio.wait_for(second, 60)
    assert status.reused and status.sandbox_id == first.sandbox_id, status


@pytest.mark.parametrize("mean_run", [None, 1000.0])
async def test_the_lines_refusal_stands_when_no_run_of_the_domain_comes_free(
    reusing: Any, monkeypatch: pytest.MonkeyPatch, mean_run: float | None
) -> None:
    """No run of the domain frees within CREATEOS_EXECUTOR_MAX_WAIT_SECONDS (3 s): the run is
    refused after waiting that long for one; at once where the domain's runs are known to hold
    their place far longer (a mean run of 1000 s), so the refusal stays prompt."""
    from lfx.utils.sandbox.base import SandboxUnavailableError

    asleep, _ = await _busy_domain(monkeypatch, max_wait=3)
    monkeypatch.setattr(
        reuse.domains,
        "_mean_run",
        {} if mean_run is None else dict.fromkeys([g.key for g in reuse.domains.guests()], mean_run),
    )
    try:
        started = asyncio.get_running_loop().time()
        with pytest.raises(SandboxUnavailableError) as caught:
            await statuses(graph_for())
        waited = asyncio.get_running_loop().time() - started
    finally:
        await asleep.aclose()
    assert "refused at once" in str(caught.value), caught.value
    if mean_run is None:  # it waited out the 3 s for a spare run
        assert waited >= 2.5, waited
    else:
        assert waited < 2.5, waited


async def test_a_run_cancelled_while_it_waits_for_a_spare_run_takes_none(
    reusing: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Langflow cancels a run whose caller went away: one waiting for a spare run of its domain
    leaves without taking one, so the guest's one place is free again once its run ends, and
    the next run is served there (a place taken and never given back would send it elsewhere)."""
    asleep, first = await _busy_domain(monkeypatch, max_wait=60)
    second = asyncio.ensure_future(statuses(graph_for()))
    try:
        await asyncio.sleep(1.0)
        second.cancel()
        with pytest.raises(asyncio.CancelledError):
            await second
    finally:
        await asleep.aclose()
    (guest,) = reuse.domains.guests()
    await until(lambda: guest.runs == 0, "a place of the guest was never given back")
    (status,) = await statuses(graph_for())
    assert status.reused and status.sandbox_id == first.sandbox_id, status
