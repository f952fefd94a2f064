"""S8: the targets, and the results as JSON, markdown, latest.md's block and the plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from s8_common import (
    EXECUTOR_POOL,
    EXECUTOR_SURFACES,
    LATEST_BEGIN,
    LATEST_END,
    ORDER,
    RESULTS,
    REUSE_SETTING,
)
from s8_plot import reference_cells, render_plot, topologies

FLOW_TEXT = {
    "chat": "chat: Chat Input → Chat Output, or a one-line program (`print(6 * 7)`) in the surface's guest",
    "work": "work: about 50 ms of CPU and one call to an OpenAI-compatible model server in a network namespace "
    "per run (benchmarks/s8_flows.py)",
}

# --- targets -------------------------------------------------------------------------------


def verdicts(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """S8's targets for the one-server, one-worker cells (the other topologies are reported
    beside them, with no target)."""
    cells = {(c["surface"], c["concurrency"]): c for c in reference_cells(doc)}
    capacity = doc.get("capacity", {}).get("guests_per_s")
    flow = doc["meta"].get("flow", "chat")
    out: list[dict[str, Any]] = []

    def add(surface: str, conc: int | None, what: str, value: str, met: bool | None) -> None:
        out.append({"surface": surface, "concurrency": conc, "target": what, "value": value, "met": met})

    judged = (doc.get("executor_reuse") or {}).get("1x1")
    if judged and not judged["honoured"]:
        add("executor-reuse", None, f"{REUSE_SETTING}=true honoured by the server", judged["evidence"], False)
    for (surface, conc), c in sorted(cells.items()):
        ref = cells.get(("inprocess", conc))
        if c.get("reuse_ignored"):
            continue  # the executor without reuse under another name: no reuse target applies
        if surface in EXECUTOR_SURFACES:
            executor_verdicts(add, c, ref, capacity if flow == "chat" else None, flow)
        if surface != "inprocess":
            lag = c["lag_ms"]["p99"]
            ref_lag = ref["lag_ms"]["p99"] if ref else float("nan")
            within = lag <= 50 and (ref is None or lag <= 2 * max(ref_lag, 1e-9))
            add(
                surface,
                conc,
                "lag p99 <= 50 ms and <= 2x in-process",
                f"{lag:.1f} ms (in-process {ref_lag:.1f} ms)",
                within,
            )
            add(
                surface,
                conc,
                "RSS back within 32 MiB",
                f"{c['rss_mib']['delta']:+.1f} MiB"
                + ("" if c["idle_after"].get("idle") else " (measured before the server was idle)"),
                c["rss_mib"]["delta"] <= 32,
            )
    return out


def executor_verdicts(
    add: Any, c: dict[str, Any], ref: dict[str, Any] | None, capacity: float | None, flow: str
) -> None:
    """Issue 30's executor targets, and issue 45's: the warm executor at least 0.5 of in-process
    throughput and at most 1.2x its CPU per run; in the work flow either executor at most 0.5x
    in-process CPU per run; every caller answered (a result or a refusal) within the timeout."""
    surface, conc = c["surface"], c["concurrency"]
    add(surface, conc, "0 errors (120 s client timeout)", f"{c['errors']}/{c['sent']}", c["errors"] == 0)
    timeouts = c.get("timeouts", c["error_kinds"].get("timeout", 0))
    add(
        surface,
        conc,
        "every caller answered within the client timeout (a result or a refusal)",
        f"{timeouts} timed out, {c.get('refused', 0)} refused",
        timeouts == 0,
    )
    if capacity and surface == "executor":
        ratio = c["throughput"] / capacity
        add(
            surface,
            conc,
            "throughput >= 0.8 x bed capacity",
            f"{c['throughput']:.3f} / {capacity:.3f} = {ratio:.2f}",
            ratio >= 0.8,
        )
    if ref is None:
        return
    if surface == "executor-reuse":
        ratio = c["throughput"] / ref["throughput"] if ref["throughput"] else 0.0
        add(
            surface,
            conc,
            "throughput >= 0.5 x in-process",
            f"{c['throughput']:.2f} / {ref['throughput']:.2f} = {ratio:.2f}",
            ratio >= 0.5,
        )
    factor = 0.5 if flow == "work" else (1.2 if surface == "executor-reuse" else 1.0)
    mine, theirs = c["cpu_per_run_ms"]["worker"], ref["cpu_per_run_ms"]["worker"]
    add(
        surface,
        conc,
        f"server CPU/run <= {'' if factor == 1.0 else f'{factor:g} x '}in-process CPU/run",
        f"{mine:.0f} vs {theirs:.0f} ms"
        + (f" ({mine / theirs:.2f})" if theirs > 0 else "")
        + ("" if c.get("clean") else " (server not idle around the cell)"),
        mine <= factor * theirs,
    )


# --- report ----------------------------------------------------------------------------------


def _s(v: float) -> str:
    if v != v:
        return "n/a"
    return f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s"


def label(c: dict[str, Any]) -> str:
    """A cell's surface, with its topology when it is not one server of one worker."""
    name = c["surface"] + (" (reuse ignored)" if c.get("reuse_ignored") else "")
    top = c.get("topology", "1x1")
    return name if top == "1x1" else f"{name} @ {top}"


def table(doc: dict[str, Any]) -> list[str]:
    lines = [
        "| Surface | In flight | Runs/s | p50 | p95 | p99 | Errors | Server CPU/run (worker; tree) | Lag p99 (max) | RSS before → after |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in doc["cells"]:
        lat, cpu, lag, rss = c["latency_s"], c["cpu_per_run_ms"], c["lag_ms"], c["rss_mib"]
        errs = f"{c['errors']}/{c['sent']}"
        if c["error_kinds"]:
            errs += " (" + ", ".join(f"{k}: {n}" for k, n in c["error_kinds"].items()) + ")"
        lines.append(
            f"| {label(c)} | {c['concurrency']} | {c['throughput']:.2f} | {_s(lat['p50'])} | {_s(lat['p95'])} | "
            f"{_s(lat['p99'])} | {errs} | {cpu['worker']:.0f} ms; {cpu['tree']:.0f} ms | "
            f"{lag['p99']:.1f} ms ({lag['max']:.0f}) | {rss['before']:.0f} → {rss['after']:.0f} MiB "
            f"({rss['delta']:+.1f}) |"
        )
    return lines


def detail_lines(doc: dict[str, Any]) -> list[str]:
    lines = [
        "| Surface | In flight | Idle before / after | Runs/s in the cell's seconds | Runs the server ended (ok), "
        "time inside it p50 / max | CPU/run gross (worker) | CPU 0 busy (the worker's share) | Bed CPU/run "
        "| Lag p50 | RSS peak | Guests |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in doc["cells"]:
        side = c.get("server_side")
        if side:
            ended = (
                f"{side['ended']} ({side['ok']}), {_s(side['took_s']['p50'])} / {_s(side['took_s']['max'])}; "
                f"{side['waited_in_line']} waited in line, {side.get('gave_up_in_line', 0)} gave up there"
                + (f"; {side['distinct_guests']} guests" if "distinct_guests" in side else "")
            )
        else:
            ended = f"{c['cpu_per_run_ms']['runs']} (answers)"
        before, after = c["idle_before"], c["idle_after"]
        idle = " / ".join(
            ("yes" if w.get("idle") else f"**no** ({w.get('waited_s', 0):.0f} s: {w.get('live')})")
            for w in (before, after)
        )
        guests = f"{c['distinct_guests']} distinct" if "distinct_guests" in c else ""
        if c.get("reused_runs"):
            guests += f", {c['reused_runs']} runs on a reused guest"
        if c.get("model_calls") is not None:
            guests += f"{'; ' if guests else ''}{c['model_calls']} model calls"
        # until the last answer: the worker's CPU seconds per second of wall time, against CPU 0's
        worker_share = c["cpu_per_run_ms"]["worker_until_last_answer"] * c["sent"] / 1000 / c["wall_s"]
        lines.append(
            f"| {label(c)} | {c['concurrency']} | {idle} | {c['throughput_window']:.2f} | {ended} | "
            f"{c['cpu_per_run_ms']['worker_gross']:.0f} ms | {c['cpu_busy']['server_cpu']:.0%} "
            f"({worker_share:.0%}) | {c['cpu_per_run_ms']['bed']:.0f} ms | "
            f"{c['lag_ms']['p50']:.1f} ms | {c['rss_mib']['peak']:.0f} MiB | {guests} |"
        )
    return lines


def target_lines(doc: dict[str, Any]) -> list[str]:
    lines = ["| Surface | In flight | Target | Measured | Met? |", "|---|---|---|---|---|"]
    for v in doc["verdicts"]:
        mark = "yes" if v["met"] else "**no**"
        conc = "-" if v["concurrency"] is None else v["concurrency"]
        lines.append(f"| {v['surface']} | {conc} | {v['target']} | {v['value']} | {mark} |")
    return lines


def cpu_lines(doc: dict[str, Any]) -> list[str]:
    """The server's CPU per run of each surface against in-process at the same load (one server,
    one worker): what a surface takes off the server, or adds to it."""
    cells = {(c["surface"], c["concurrency"]): c for c in reference_cells(doc)}
    lines = [
        "| Surface | In flight | Server CPU/run (worker) | ÷ in-process | Bed CPU/run |",
        "|---|---|---|---|---|",
    ]
    for (_, conc), c in sorted(cells.items(), key=lambda kv: (kv[0][1], ORDER.index(kv[0][0]))):
        ref = cells.get(("inprocess", conc))
        mine = c["cpu_per_run_ms"]["worker"]
        ratio = (
            f"{mine / ref['cpu_per_run_ms']['worker']:.2f}"
            if ref and ref["cpu_per_run_ms"]["worker"] > 0
            else "n/a"
        )
        lines.append(
            f"| {label(c)} | {conc} | {mine:.0f} ms | {ratio} | {c['cpu_per_run_ms']['bed']:.0f} ms |"
        )
    return lines


def scaling_lines(doc: dict[str, Any]) -> list[str]:
    """Each surface's cells on the other topologies beside one server of one worker."""
    tops = [t for t in topologies(doc) if t != "1x1"]
    if not tops:
        return []
    head = "| Surface | In flight | 1 server x 1 worker: runs/s, CPU/run | " + " | ".join(
        f"{t.split('x')[0]} server(s) x {t.split('x')[1]} worker(s): runs/s (÷ 1x1), CPU/run, errors"
        for t in tops
    )
    lines = [head + " |", "|---|---|---|" + "---|" * len(tops)]
    by = {(c.get("topology", "1x1"), c["surface"], c["concurrency"]): c for c in doc["cells"]}
    for c in reference_cells(doc):
        row = [
            f"| {c['surface']} | {c['concurrency']} | {c['throughput']:.2f}, "
            f"{c['cpu_per_run_ms']['worker']:.0f} ms"
        ]
        for top in tops:
            o = by.get((top, c["surface"], c["concurrency"]))
            if o is None:
                row.append("not measured")
                continue
            ratio = o["throughput"] / c["throughput"] if c["throughput"] else float("nan")
            row.append(
                f"{o['throughput']:.2f} ({ratio:.2f}), {o['cpu_per_run_ms']['worker']:.0f} ms, "
                f"{o['errors']}/{o['sent']}"
            )
        lines.append(" | ".join(row) + " |")
    return lines


def reuse_line(doc: dict[str, Any]) -> list[str]:
    judged = doc.get("executor_reuse") or {}
    return [
        f"**executor-reuse ({top})**: {REUSE_SETTING}=true "
        + ("honoured" if j["honoured"] else "**ignored by the server's executor**")
        + f": {j['evidence']}."
        for top, j in judged.items()
    ]


def render_markdown(doc: dict[str, Any]) -> str:
    meta, cap = doc["meta"], doc.get("capacity") or {}
    lines = [
        "# S8: a Langflow server under concurrent runs"
        + ("" if meta.get("flow", "chat") == "chat" else f" ({meta['flow']} flow)"),
        "",
        "Generated by `benchmarks/server_bench.py` (`make bench` runs it short, `make bench-server` long).",
        "Each cell holds C runs in flight through `POST /api/v1/run` for the cell's seconds (120 s client",
        "timeout), then lets the last C drain. See docs/performance.md (S8) for the method.",
        "",
        "| | |",
        "|---|---|",
        f"| Date | {meta['date']} |",
        f"| Machine | {meta['host']}, {meta['cpus']} CPUs, {meta['mem_gib']} GiB RAM, {meta['cpu']} |",
        f"| Load average (start → end) | {', '.join(f'{x:.1f}' for x in meta['loadavg_start'])} → "
        f"{', '.join(f'{x:.1f}' for x in meta.get('loadavg_end', ()))} |",
        f"| Langflow | {meta.get('langflow', '?')} with langflow-sandbox-createos {meta.get('plugin', '?')} "
        f"(.venv-langflow); topologies (servers x gunicorn workers each) {', '.join(topologies(doc))} |",
        f"| Flow | {FLOW_TEXT.get(meta.get('flow', 'chat'), '?')}"
        + (f"; model server {meta['model_server']}" if meta.get("model_server") else "")
        + " |",
        f"| Confinement | {meta['confinement']} |",
        f"| Cell | {meta['seconds']:.0f} s per cell; executor warm pool {EXECUTOR_POOL}, "
        f"CREATEOS_EXECUTOR_MAX_GUESTS={meta.get('executor_max_guests', 8)}, "
        f"CREATEOS_EXECUTOR_MAX_WAIT_SECONDS default (120) |",
        f"| Duration | {meta.get('duration_s', 0):.0f} s{' (quick: not a result)' if meta.get('quick') else ''} |",
        "",
    ]
    if cap:
        lines += [
            f"**Bed capacity**: {cap['guests_per_s']:.3f} guests/s booted and run to the first vertex "
            f"({cap['runs']} cold executor runs of Chat Input → Chat Output through `CreateOSExecutor`, "
            f"{cap['concurrency']} at a time, no pool; each took {_s(cap['first_vertex_s']['p50'])} median "
            f"to its first vertex; {cap['errors']} errors).",
            "",
        ]
    lines += [*reuse_line(doc), ""] if doc.get("executor_reuse") else []
    lines += [
        *table(doc),
        "",
        "Runs/s: runs answered right per second from the first run sent to the last answer (the last C",
        "runs drain after the cell's seconds). Server CPU/run: utime+stime of the gunicorn worker (and of",
        "Langflow's whole process tree) from the first run sent until the server and the bed were idle",
        "again, less the server's idle rate over that time, per run the server ended (the executor's",
        "own log line per run; a run whose caller timed out still runs to its end). Lag: how late a",
        "10 ms sleep on the server's event loop woke up, over the cell. RSS: the worker's VmRSS before",
        "the cell and once idle after it.",
        "",
        *detail_lines(doc),
        "",
        "Server CPU per run against in-process (one server, one worker):",
        "",
        *cpu_lines(doc),
        "",
        *(
            [
                "Other topologies beside one server of one worker (the servers share CPU 0):",
                "",
                *scaling_lines(doc),
                "",
            ]
            if scaling_lines(doc)
            else []
        ),
        "Targets (reported, not asserted):",
        "",
        *target_lines(doc),
    ]
    notes = doc.get("notes") or []
    if notes:
        lines += ["", "Observed:", ""] + [f"- {n}" for n in notes]
    lines.append("")
    return "\n".join(lines)


def write_results(doc: dict[str, Any], out: Path, plot: bool = True, name: str = "s8") -> None:
    """NAME.json (without the per-run latencies), NAME.md, NAME.png; for s8, latest.md's S8 block."""
    summary = json.loads(json.dumps(doc))
    for c in summary["cells"]:
        c.pop("latencies", None)
    (out / f"{name}.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / f"{name}.md").write_text(render_markdown(summary))
    if plot:
        render_plot(doc, out / f"{name}.png")
    if name == "s8":
        update_latest(out)


def latest_section(results: Path = RESULTS) -> str:
    """The S8 block of latest.md (benchmarks/report.py adds it when s8.json exists)."""
    path = results / "s8.json"
    if not path.exists():
        return ""
    doc = json.loads(path.read_text())
    cap = doc.get("capacity") or {}
    met = sum(1 for v in doc["verdicts"] if v["met"])
    lines = [
        LATEST_BEGIN,
        "",
        f"## S8: a Langflow server under concurrent runs ({doc['meta']['date']})",
        "",
        f"From `benchmarks/server_bench.py` ([s8.md](s8.md), [s8.png](s8.png)); bed capacity "
        f"{cap.get('guests_per_s', float('nan')):.3f} guests/s; {met} of {len(doc['verdicts'])} targets met.",
        "",
        *table(doc),
        "",
        LATEST_END,
    ]
    return "\n".join(lines)


def update_latest(results: Path) -> None:
    latest = results / "latest.md"
    if not latest.exists():
        return
    text = latest.read_text()
    section = latest_section(results)
    if LATEST_BEGIN in text and LATEST_END in text:
        head, rest = text.split(LATEST_BEGIN, 1)
        tail = rest.split(LATEST_END, 1)[1]
        text = head + section + tail
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    latest.write_text(text)
