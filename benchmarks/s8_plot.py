"""S8's chart: latency and throughput against runs in flight per surface (one worker, one
server), and, when the run measured more topologies, each surface's throughput per topology."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from s8_common import BED_CPU, CLIENT_TIMEOUT, SERVER_CPU, SURFACES

COLORS = {
    "inprocess": "#555555",
    "executor": "#d9534f",
    "executor-reuse": "#8e44ad",
    "backend": "#2e7dd1",
    "component": "#2e9e5b",
    "component-reuse": "#e0a030",
}
HATCHES = ("", "//", "..", "xx")


def topologies(doc: dict[str, Any]) -> list[str]:
    """The topologies the run measured, in the order measured ("1x1" first)."""
    seen = [c.get("topology", "1x1") for c in doc["cells"]]
    return sorted(set(seen), key=seen.index)


def reference_cells(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The one-server, one-worker cells: what S8's targets and curves are about."""
    return [c for c in doc["cells"] if c.get("topology", "1x1") == "1x1"]


def render_plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tops = topologies(doc)
    work = doc["meta"].get("flow", "chat") == "work"
    panels = 2 + (len(tops) > 1) + work
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 5.2), dpi=110)
    ax_lat, ax_tp = axes[0], axes[1]
    cells = reference_cells(doc)
    for surface in SURFACES:
        cs = sorted((c for c in cells if c["surface"] == surface), key=lambda c: c["concurrency"])
        if not cs:
            continue
        xs = [c["concurrency"] for c in cs]
        col = COLORS[surface]
        label = surface + (" (reuse ignored)" if any(c.get("reuse_ignored") for c in cs) else "")
        for q, style in (("p50", "-"), ("p95", "--"), ("p99", ":")):
            ax_lat.plot(
                xs,
                [c["latency_s"][q] for c in cs],
                style,
                color=col,
                marker="o",
                label=f"{label} {q}" if q == "p50" else None,
            )
        for c in cs:
            if c["errors"]:
                ax_lat.annotate(
                    f"{c['errors']}/{c['sent']} failed",
                    (c["concurrency"], c["latency_s"]["p99"]),
                    fontsize=8,
                    color=col,
                )
        ax_tp.plot(xs, [c["throughput"] for c in cs], "-", color=col, marker="o", label=label)
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
        ticks = sorted({c["concurrency"] for c in cells})
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(t) for t in ticks])
        ax.set_xlabel("runs in flight (one server, one worker)")
        ax.grid(alpha=0.25, which="both")
    ax_lat.set_ylabel(
        "latency of the runs answered right, s\n(solid p50, dashed p95, dotted p99; -. 120 s timeout)"
    )
    ax_tp.set_ylabel("runs/s answered right")
    ax_lat.legend(fontsize=8, loc="lower right")
    ax_tp.legend(fontsize=8, loc="center right")
    if len(tops) > 1:
        topology_bars(axes[2], doc, tops)
    if work:
        cpu_bars(axes[-1], doc)
    meta = doc["meta"]
    flow = meta.get("flow", "chat")
    fig.suptitle(
        f"S8 ({flow} flow): Langflow {meta.get('langflow', '')} + createos-local, latency and throughput vs runs "
        f"in flight ({meta['date']}, {meta['cpus']} CPUs; servers on CPU {SERVER_CPU}, guests on CPU {BED_CPU})",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def topology_bars(ax: Any, doc: dict[str, Any], tops: list[str]) -> None:
    """Runs/s of each (surface, in flight) per topology, side by side."""
    groups = [
        (c["surface"], c["concurrency"])
        for c in reference_cells(doc)
        if any(o.get("topology") != "1x1" and o["surface"] == c["surface"] for o in doc["cells"])
    ]
    width = 0.8 / len(tops)
    for t_index, top in enumerate(tops):
        by = {(c["surface"], c["concurrency"]): c for c in doc["cells"] if c.get("topology", "1x1") == top}
        for g_index, key in enumerate(groups):
            c = by.get(key)
            if c is None:
                continue
            ax.bar(
                g_index + (t_index - (len(tops) - 1) / 2) * width,
                c["throughput"],
                width,
                color=COLORS[key[0]],
                hatch=HATCHES[t_index % len(HATCHES)],
                edgecolor="black",
                linewidth=0.5,
                label=top if g_index == 0 else None,
            )
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([f"{s}\n{n} in flight" for s, n in groups], fontsize=8)
    ax.set_ylabel("runs/s answered right")
    ax.set_title("servers x workers each, same CPU for the servers", fontsize=9)
    ax.legend(fontsize=8, title="topology", title_fontsize=8)
    ax.grid(alpha=0.25, axis="y")


def cpu_bars(ax: Any, doc: dict[str, Any]) -> None:
    """The server's CPU per run of each surface (one server, one worker), in-process's dashed."""
    cells = sorted(reference_cells(doc), key=lambda c: (c["concurrency"], SURFACES.index(c["surface"])))
    for i, c in enumerate(cells):
        ax.bar(
            i,
            c["cpu_per_run_ms"]["worker"],
            0.7,
            color=COLORS[c["surface"]],
            edgecolor="black",
            linewidth=0.5,
        )
        ref = next(
            (r for r in cells if r["surface"] == "inprocess" and r["concurrency"] == c["concurrency"]), None
        )
        if ref is not None and c is not ref:
            ax.hlines(0.5 * ref["cpu_per_run_ms"]["worker"], i - 0.4, i + 0.4, colors="black", linestyles=":")
    ax.set_xticks(range(len(cells)))
    ax.set_xticklabels([f"{c['surface']}\n{c['concurrency']} in flight" for c in cells], fontsize=8)
    ax.set_ylabel("server CPU per run, ms (dotted: 0.5 x in-process)")
    ax.set_title("where the flow's work is paid for", fontsize=9)
    ax.grid(alpha=0.25, axis="y")
