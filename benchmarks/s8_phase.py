"""S8: one topology of Langflow servers on the shared bed, and every cell measured on it.

A topology is "SxW": S servers of each kind side by side, W gunicorn workers each. "1x1" is S8's
reference (as since issue 30); "1x2" is `--workers 2` (Langflow's own `--workers`, through
LANGFLOW_WORKERS: every worker its own process with its own pools, keeper and admission line);
"2x1" is `--servers 2` (two `make run` Langflows against one createos-local, the load dealt
round them). A server's kind is what its surfaces need: "plain" (in-process, the backend and
the component), "executor" (LANGFLOW_EXECUTOR_KIND=createos), "executor-reuse" (the same with
CREATEOS_EXECUTOR_REUSE=true). Each topology starts its servers, measures, stops them with
Ctrl-C as `make run` is stopped, and looks at what was left on the bed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from s8_bed import Bed, by_prefix, measure_capacity
from s8_cell import cell
from s8_common import (
    EXECUTOR_MAX_GUESTS,
    EXECUTOR_POOL,
    EXECUTOR_SURFACES,
    ORDER,
    REUSE_SETTING,
    log,
    tests_importable,
)
from s8_load import warm_up
from s8_server import Fleet, Server, plugin_reads, servers

# the names of throwaway guests (a run's own): never kept between cells
THROWAWAY = ("lf-", "lf-x-", "lf-w-")


def kind_of(surface: str) -> str:
    return surface if surface in EXECUTOR_SURFACES else "plain"


def parse_topology(topology: str) -> tuple[int, int]:
    servers_, workers = (int(x) for x in topology.split("x"))
    return servers_, workers


@dataclass
class Run:
    """What every topology of one S8 run shares."""

    bed: Bed
    scratch: Path
    surfaces: list[str]
    levels: list[int]
    seconds: float
    idle_timeout: float
    capacity_runs: int
    flow: str = "chat"
    model: Any = None  # the work flow's model server (tests/e2e/model_server.py)
    measure_ignored: bool = False
    doc: dict[str, Any] = field(default_factory=dict)

    def env(self, kind: str) -> dict[str, str]:
        """The environment `make run` gets for a server of `kind`."""
        env: dict[str, str] = {}
        if kind in EXECUTOR_SURFACES:
            env |= {
                "EXECUTOR": "createos",
                "CREATEOS_EXECUTOR_WARM_POOL": str(EXECUTOR_POOL),
                "CREATEOS_EXECUTOR_MAX_GUESTS": str(EXECUTOR_MAX_GUESTS),
            }
        if kind == "executor-reuse":
            env[REUSE_SETTING] = "true"
        if self.flow == "work":
            tests_importable()
            from e2e.conftest import model_env

            env |= model_env(self.model)  # Langflow may call the model server, with a key it holds
            if kind == "plain" and "backend" in self.surfaces:
                # the Python Interpreter's program calls the model: the backend's guests need
                # egress, which is one setting for the whole server (the component has a field)
                env["LANGFLOW_SANDBOX_ALLOW_NETWORK"] = "true"
        return env

    @property
    def model_url(self) -> str:
        return str(self.model.base_url) if self.model is not None else ""


def phase(run: Run, topology: str) -> None:
    """Start the topology's servers, measure each surface on them, stop them, check the bed."""
    doc = run.doc
    n_servers, n_workers = parse_topology(topology)
    kinds = sorted({kind_of(s) for s in run.surfaces})
    names = {
        kind: [kind] if n_servers == 1 else [f"{kind}-{i + 1}" for i in range(n_servers)] for kind in kinds
    }
    wanted = {name: (run.env(kind), n_workers) for kind in kinds for name in names[kind]}
    log(
        f"topology {topology}: {n_servers} server(s) of each kind ({', '.join(kinds)}), {n_workers} worker(s) each"
    )
    with servers(run.bed, run.scratch, wanted, topology) as made:
        doc["meta"].setdefault("affinity", {})[topology] = {name: s.affinity for name, s in made.items()}
        doc["meta"].setdefault("idle_cpu_per_s", {})[topology] = {
            name: s.idle_rate for name, s in made.items()
        }
        fleets: dict[str, Fleet] = {}
        for kind in kinds:
            members = [made[name] for name in names[kind]]
            for s in members:
                s.prepare([x for x in run.surfaces if kind_of(x) == kind], run.flow, run.model_url)
            fleets[kind] = Fleet(topology, members, run.flow)
        if topology == "1x1" and set(run.surfaces) & set(EXECUTOR_SURFACES) and "capacity" not in doc:
            doc["capacity"] = measure_capacity(run.bed, run.capacity_runs, 4, run.scratch)
            for sb in run.bed.live():
                run.bed.delete(sb["id"])
        for surface in (s for s in ORDER if s in run.surfaces):
            fleet = fleets[kind_of(surface)]
            others = [o for o in made.values() if o not in fleet.servers]
            if not surface_ready(run, fleet, surface, topology):
                continue
            for conc in run.levels:
                one_cell(run, fleet, others, surface, conc)
        doc.setdefault("rss_server_mib", {})[topology] = {
            name: round(s.rss_mib(), 1) for name, s in made.items()
        }
    left_behind(run, topology)


def surface_ready(run: Run, fleet: Fleet, surface: str, topology: str) -> bool:
    """Warm the surface up; for executor-reuse, judge whether the servers honour the setting.
    False: do not measure it (the reason is in the notes)."""
    log(f"{topology} {surface}: warm-up")
    since = time.time()
    warm = warm_up(fleet, surface, run.scratch)
    bad = [r for r in warm if "error" in r]
    if bad:
        run.doc["notes"].append(
            f"{topology} {surface}: warm-up run failed: {bad[0].get('error')}: {bad[0].get('detail')}"
        )
    if surface != "executor-reuse":
        return True
    judged = judge_reuse(fleet, since, time.time() + 1)
    run.doc.setdefault("executor_reuse", {})[topology] = judged
    if judged["honoured"]:
        # its warm guests stay between cells by design, like the pool's: learn their names
        live = [sb for sb in run.bed.live() if sb["id"] in set(judged["guests"])]
        fleet.kept += tuple(p for p in by_prefix(live) if p not in THROWAWAY)
        return True
    note = (
        f"{topology} executor-reuse: the server's executor ignored {REUSE_SETTING}=true "
        f"({judged['evidence']}); "
        + (
            "measured anyway (--measure-ignored): its cells are the executor without reuse"
            if run.measure_ignored
            else "not measured (--measure-ignored measures it anyway)"
        )
    )
    log(note)
    run.doc["notes"].append(note)
    return run.measure_ignored


def judge_reuse(fleet: Fleet, since: float, until: float) -> dict[str, Any]:
    """Whether the warm executor was on in the warm-up just run: the plugin the servers run
    must name the setting, and its runs (the executor's own line per run) must not each have
    had a guest of their own."""
    runs = fleet.executor_runs(since, until)
    guests = list(runs["guests"])
    if not plugin_reads(REUSE_SETTING):
        return {
            "honoured": False,
            "guests": guests,
            "evidence": f"the plugin installed in .venv-langflow never names {REUSE_SETTING}; "
            f"its {len(guests)} warm-up run(s) ran on {len(set(guests))} guest(s)",
        }
    if len(guests) >= 2 and len(set(guests)) == len(guests):
        return {
            "honoured": False,
            "guests": guests,
            "evidence": f"each of its {len(guests)} warm-up runs ran on a guest of its own",
        }
    return {
        "honoured": True,
        "guests": guests,
        "evidence": f"{len(guests)} warm-up run(s) on {len(set(guests))} guest(s)",
    }


def one_cell(run: Run, fleet: Fleet, others: list[Server], surface: str, conc: int) -> None:
    idle_cpu = [o.cpu()[1] for o in others]
    t0 = time.monotonic()
    c = cell(fleet, surface, conc, run.seconds, run.scratch, run.idle_timeout, run.model)
    c["other_servers_cpu_s"] = round(
        sum(o.cpu()[1] - cpu for o, cpu in zip(others, idle_cpu, strict=True)), 2
    )
    c["cell_wall_s"] = round(time.monotonic() - t0, 1)
    judged = run.doc.get("executor_reuse", {}).get(fleet.topology)
    if surface == "executor-reuse" and judged and not judged["honoured"]:
        c["reuse_ignored"] = True
    run.doc["cells"].append(c)
    if c["error_samples"]:
        waits = fleet.log_tail(r"waits in line|timed out|Traceback|ERROR", 3)
        if waits:
            c["server_log"] = waits


def left_behind(run: Run, topology: str) -> None:
    """The servers are stopped: what is left on the bed? A reused guest (lf-c-) stays by design
    (make run's Ctrl-C reaps it); anything else was left behind."""
    time.sleep(5)
    left = run.bed.live()
    run.doc.setdefault("left_after_stop", {})[topology] = by_prefix(left)
    unexpected = {p: n for p, n in by_prefix(left).items() if p != "lf-c-"}
    if unexpected:
        run.doc["notes"].append(
            f"{topology}: guests still live 5 s after the servers stopped: {unexpected} (deleted by the harness)"
        )
    for sb in left:
        run.bed.delete(sb["id"])
