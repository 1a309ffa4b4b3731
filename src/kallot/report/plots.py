"""Pictures of the waste report: the fleet's GPU-equivalents allocated vs used over time,
allocated / used / idle GPU-hours per namespace, and the distribution of use / allocation per
workload (the worst offenders). matplotlib only here; called by cli.report_waste.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import datetime as dt

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from kallot.report.waste import Waste


def fleet_figure(w: Waste) -> Figure:
    fig, ax = plt.subplots(figsize=(12, 4))
    t = np.array([dt.datetime.fromtimestamp(x, tz=dt.UTC) for x in w.t])
    ax.fill_between(t, w.fleet_allocated, step="mid", color="#c7d7ea", label="allocated")
    ax.fill_between(t, w.fleet_used, step="mid", color="#1f77b4", label="used")
    ax.set_ylabel("GPU-equivalents")
    ax.set_title("fleet: allocated vs used")
    ax.legend(loc="upper left")
    fig.autofmt_xdate()
    fig.tight_layout()
    return fig


def namespaces_figure(w: Waste) -> Figure:
    rows = sorted(w.namespaces.values(), key=lambda r: -r.allocated_h)[:20]
    fig, ax = plt.subplots(figsize=(12, 4))
    x = np.arange(len(rows))
    ax.bar(x - 0.2, [r.allocated_h for r in rows], 0.4, color="#c7d7ea", label="allocated")
    ax.bar(x + 0.2, [r.used_h for r in rows], 0.4, color="#1f77b4", label="used")
    for i, r in enumerate(rows):
        ax.annotate(
            f"idle {r.idle_h:.2f}", (i, r.allocated_h), ha="center", va="bottom", fontsize=8
        )
    ax.set_xticks(x, [r.name for r in rows], rotation=20)
    ax.set_ylabel("GPU-hours")
    ax.set_title("per namespace")
    ax.legend()
    fig.tight_layout()
    return fig


def workloads_figure(w: Waste, top: int = 10) -> Figure:
    worst = [r.name for r in w.worst(top) if r.name in w.per_workload_used]
    fig, ax = plt.subplots(figsize=(12, 0.5 + 0.45 * max(1, len(worst))))
    data = [w.per_workload_used[n][~np.isnan(w.per_workload_used[n])] for n in worst]
    if any(d.size for d in data):
        ax.boxplot(
            [d if d.size else np.zeros(1) for d in data],
            orientation="horizontal",
            tick_labels=worst,
        )
    ax.set_xlim(0, 1.05)
    ax.set_xlabel("used / allocated (GPU-equivalents), per step")
    ax.set_title(f"worst offenders (most idle GPU-hours, top {len(worst)})")
    ax.invert_yaxis()
    fig.tight_layout()
    return fig


def close(fig: Figure) -> None:
    plt.close(fig)
