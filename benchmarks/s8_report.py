"""S8: the targets, and the results as JSON, markdown, latest.md's block and the plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from s8_common import (
    BED_CPU,
    CLIENT_TIMEOUT,
    EXECUTOR_POOL,
    LATEST_BEGIN,
    LATEST_END,
    RESULTS,
    SERVER_CPU,
    SURFACES,
)

# --- targets -------------------------------------------------------------------------------


def verdicts(doc: dict[str, Any]) -> list[dict[str, Any]]:
    cells = {(c["surface"], c["concurrency"]): c for c in doc["cells"]}
    capacity = doc.get("capacity", {}).get("guests_per_s")
    out: list[dict[str, Any]] = []

    def add(surface: str, conc: int, what: str, value: str, met: bool | None) -> None:
        out.append({"surface": surface, "concurrency": conc, "target": what, "value": value, "met": met})

    for (surface, conc), c in sorted(cells.items()):
        ref = cells.get(("inprocess", conc))
        if surface == "executor":
            add(
                surface,
                conc,
                "0 errors (120 s client timeout)",
                f"{c['errors']}/{c['sent']}",
                c["errors"] == 0,
            )
            if capacity:
                ratio = c["throughput"] / capacity
                add(
                    surface,
                    conc,
                    "throughput >= 0.8 x bed capacity",
                    f"{c['throughput']:.3f} / {capacity:.3f} = {ratio:.2f}",
                    ratio >= 0.8,
                )
            if ref:
                mine, theirs = c["cpu_per_run_ms"]["worker"], ref["cpu_per_run_ms"]["worker"]
                add(
                    surface,
                    conc,
                    "server CPU/run <= in-process CPU/run",
                    f"{mine:.0f} vs {theirs:.0f} ms"
                    + ("" if c.get("clean") else " (server not idle around the cell)"),
                    mine <= theirs,
                )
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


# --- report ----------------------------------------------------------------------------------


def _s(v: float) -> str:
    if v != v:
        return "n/a"
    return f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s"


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
            f"| {c['surface']} | {c['concurrency']} | {c['throughput']:.2f} | {_s(lat['p50'])} | {_s(lat['p95'])} | "
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
        # until the last answer: the worker's CPU seconds per second of wall time, against CPU 0's
        worker_share = c["cpu_per_run_ms"]["worker_until_last_answer"] * c["sent"] / 1000 / c["wall_s"]
        lines.append(
            f"| {c['surface']} | {c['concurrency']} | {idle} | {c['throughput_window']:.2f} | {ended} | "
            f"{c['cpu_per_run_ms']['worker_gross']:.0f} ms | {c['cpu_busy']['server_cpu']:.0%} "
            f"({worker_share:.0%}) | {c['cpu_per_run_ms']['bed']:.0f} ms | "
            f"{c['lag_ms']['p50']:.1f} ms | {c['rss_mib']['peak']:.0f} MiB | {guests} |"
        )
    return lines


def target_lines(doc: dict[str, Any]) -> list[str]:
    lines = ["| Surface | In flight | Target | Measured | Met? |", "|---|---|---|---|---|"]
    for v in doc["verdicts"]:
        mark = "yes" if v["met"] else "**no**"
        lines.append(f"| {v['surface']} | {v['concurrency']} | {v['target']} | {v['value']} | {mark} |")
    return lines


def render_markdown(doc: dict[str, Any]) -> str:
    meta, cap = doc["meta"], doc.get("capacity") or {}
    lines = [
        "# S8: a Langflow server under concurrent runs",
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
        f"(.venv-langflow), one gunicorn worker |",
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
        "Targets (reported, not asserted):",
        "",
        *target_lines(doc),
    ]
    notes = doc.get("notes") or []
    if notes:
        lines += ["", "Observed:", ""] + [f"- {n}" for n in notes]
    lines.append("")
    return "\n".join(lines)


def write_results(doc: dict[str, Any], out: Path, plot: bool = True) -> None:
    """s8.json (without the per-run latencies), s8.md, s8.png and latest.md's S8 block."""
    summary = json.loads(json.dumps(doc))
    for c in summary["cells"]:
        c.pop("latencies", None)
    (out / "s8.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "s8.md").write_text(render_markdown(summary))
    if plot:
        render_plot(doc, out / "s8.png")
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


def render_plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {
        "inprocess": "#555555",
        "executor": "#d9534f",
        "backend": "#2e7dd1",
        "component": "#2e9e5b",
        "component-reuse": "#e0a030",
    }
    fig, (ax_lat, ax_tp) = plt.subplots(1, 2, figsize=(13, 5.2), dpi=110)
    for surface in SURFACES:
        cs = sorted((c for c in doc["cells"] if c["surface"] == surface), key=lambda c: c["concurrency"])
        if not cs:
            continue
        xs = [c["concurrency"] for c in cs]
        col = colors[surface]
        for q, style in (("p50", "-"), ("p95", "--"), ("p99", ":")):
            ax_lat.plot(
                xs,
                [c["latency_s"][q] for c in cs],
                style,
                color=col,
                marker="o",
                label=f"{surface} {q}" if q == "p50" else None,
            )
        for c in cs:
            if c["errors"]:
                ax_lat.annotate(
                    f"{c['errors']}/{c['sent']} failed",
                    (c["concurrency"], c["latency_s"]["p99"]),
                    fontsize=8,
                    color=col,
                )
        ax_tp.plot(xs, [c["throughput"] for c in cs], "-", color=col, marker="o", label=surface)
    cap = (doc.get("capacity") or {}).get("guests_per_s")
    if cap:
        ax_tp.axhline(cap, color="#d9534f", linestyle="--", linewidth=1)
        ax_tp.axhline(0.8 * cap, color="#d9534f", linestyle=":", linewidth=1)
        ax_tp.text(
            ax_tp.get_xlim()[0], cap, f" bed capacity {cap:.2f}/s (dotted: 0.8x)", fontsize=8, va="bottom"
        )
    ax_lat.axhline(CLIENT_TIMEOUT, color="black", linewidth=0.8, linestyle="-.")
    ax_lat.set_yscale("log")
    ax_lat.set_xscale("log", base=2)
    ax_tp.set_xscale("log", base=2)
    ax_tp.set_yscale("log")
    for ax in (ax_lat, ax_tp):
        ticks = sorted({c["concurrency"] for c in doc["cells"]})
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(t) for t in ticks])
        ax.set_xlabel("runs in flight")
        ax.grid(alpha=0.25, which="both")
    ax_lat.set_ylabel(
        "latency of the runs answered right, s\n(solid p50, dashed p95, dotted p99; -. 120 s timeout)"
    )
    ax_tp.set_ylabel("runs/s answered right")
    ax_lat.legend(fontsize=8, loc="lower right")
    ax_tp.legend(fontsize=8, loc="center right")
    meta = doc["meta"]
    fig.suptitle(
        f"S8: Langflow {meta.get('langflow', '')} + createos-local, latency and throughput vs runs in flight "
        f"({meta['date']}, {meta['cpus']} CPUs; server on CPU {SERVER_CPU}, guests on CPU {BED_CPU})",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
