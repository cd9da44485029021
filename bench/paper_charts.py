#!/usr/bin/env python3
"""Bar charts of `drove bench paper`, in the style of the paper's figures.

Usage: paper_charts.py OUTDIR   (OUTDIR holds results.csv and indexes.csv)

Writes OUTDIR/throughput.png (mean per-client MB/s per X, with and without the
delay, of every system in results.csv: drove with each write policy measured, then
the centralized baseline), OUTDIR/parallelism_impact_ratio.png and
OUTDIR/latency_impact_ratio.png (the two indexes per operation and X), and prints
the file names, one per line. Bars of CPU-bound points are hatched. Indexes are
read from indexes.csv (computed by drove from results.csv), never recomputed here.
"""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

OPS = ["block-write", "block-read", "small-write", "small-read"]
# Systems in the order drove runs them; "drove" is the sync policy (its name from
# before there were two policies). Colors: (no delay, delay).
SYSTEMS = ["drove", "drove-zone-sync", "baseline"]
LABELS = {"drove": "drove sync", "drove-zone-sync": "drove zone-sync", "baseline": "baseline"}
COLORS = {
    "drove": ("#1f77b4", "#aec7e8"),
    "drove-zone-sync": ("#2ca02c", "#98df8a"),
    "baseline": ("#d62728", "#ff9896"),
}


def num(s):
    try:
        return float(s)
    except ValueError:
        return None  # "n/a"


def grouped(ax, xs, series, ylabel, title):
    """series: list of (label, color, {x: (value or None, cpu_bound)})."""
    n = len(series)
    width = 0.8 / max(n, 1)
    for k, (label, color, vals) in enumerate(series):
        pos = [i + (k - (n - 1) / 2) * width for i in range(len(xs))]
        heights = [(vals.get(x, (None, False))[0] or 0.0) for x in xs]
        bars = ax.bar(pos, heights, width, label=label, color=color, edgecolor="black", linewidth=0.4)
        for b, x in zip(bars, xs):
            v, cpu = vals.get(x, (None, False))
            if cpu:
                b.set_hatch("//")
            if v is None:
                ax.text(b.get_x() + b.get_width() / 2, 0, "n/a", ha="center", va="bottom", fontsize=6)
    ax.set_xticks(range(len(xs)))
    ax.set_xticklabels([str(x) for x in xs])
    ax.set_xlabel("X (clients at once)")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)


def legend(fig, axes):
    """One legend for the figure, below the panels, so it never hides a bar."""
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), fontsize=8, frameon=False)


def main():
    out = sys.argv[1]
    with open(os.path.join(out, "results.csv")) as f:
        rows = list(csv.DictReader(f))
    with open(os.path.join(out, "indexes.csv")) as f:
        idx = list(csv.DictReader(f))
    present = {r["system"] for r in rows}
    systems = [s for s in SYSTEMS if s in present]
    xs = sorted({int(r["x"]) for r in rows})
    delays = sorted({int(r["delay_ms"]) for r in rows})
    d = max(delays)
    note = "hatched = CPU-bound point (machine > 90% busy)"
    written = []

    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for ax, op in zip(axes.flat, OPS):
        rows_op = [r for r in rows if r["op"] == op]
        series = []
        for system in systems:
            for j, delay in enumerate(delays):
                vals = {int(r["x"]): (num(r["mean_per_client_mbps"]), r["cpu_bound"] == "true")
                        for r in rows_op if r["system"] == system and int(r["delay_ms"]) == delay}
                series.append((f"{LABELS[system]} {delay} ms", COLORS[system][j % 2], vals))
        grouped(ax, xs, series, "MB/s per client", op)
    legend(fig, axes)
    fig.suptitle(f"Mean per-client throughput, with and without {d} ms between zones\n{note}", fontsize=11)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(os.path.join(out, "throughput.png"), dpi=110)
    plt.close(fig)
    written.append("throughput.png")

    def ix(kind, system, op, delay):
        return {int(r["x"]): (num(r["value"]), r["cpu_bound"] == "true")
                for r in idx if r["index"] == kind and r["system"] == system
                and r["op"] == op and int(r["delay_ms"]) == delay}

    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for ax, op in zip(axes.flat, OPS):
        series = []
        for j, delay in enumerate(delays):
            for system in systems:
                series.append((f"{LABELS[system]} {delay} ms", COLORS[system][j % 2],
                               ix("parallelism", system, op, delay)))
        grouped(ax, xs, series, "ParallelismImpactRatio", op)
        ax.axhline(1.0, color="gray", linewidth=0.8, linestyle="--")
    legend(fig, axes)
    fig.suptitle("ParallelismImpactRatio = per-client throughput at X / at X=1\n" + note, fontsize=11)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(os.path.join(out, "parallelism_impact_ratio.png"), dpi=110)
    plt.close(fig)
    written.append("parallelism_impact_ratio.png")

    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for ax, op in zip(axes.flat, OPS):
        series = [(LABELS[system], COLORS[system][0], ix("latency", system, op, d)) for system in systems]
        grouped(ax, xs, series, "LatencyImpactRatio", op)
        ax.axhline(1.0, color="gray", linewidth=0.8, linestyle="--")
    legend(fig, axes)
    fig.suptitle(f"LatencyImpactRatio = throughput with {d} ms / with 0 ms\n" + note, fontsize=11)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(os.path.join(out, "latency_impact_ratio.png"), dpi=110)
    plt.close(fig)
    written.append("latency_impact_ratio.png")

    for w in written:
        print(w)


if __name__ == "__main__":
    main()
