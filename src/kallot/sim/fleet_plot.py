"""Picture for ``kallot sim fleet``: GPUs needed per strategy, and the memory and compute
utilization of the GPUs in use, with over-commit and isolation violations marked.

Where it sits: called by cli.sim_fleet after ``sim.fleet.compare``; matplotlib only here.
"""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from kallot.sim.fleet import STRATEGIES, Comparison

COLORS = {
    "integer": "#999999",
    "time-slicing": "#d62728",
    "mps": "#ff7f0e",
    "mig-static": "#9467bd",
    "mig-dynamic": "#8c564b",
    "kallot": "#1f77b4",
}


def plot(cmp: Comparison, path: str | os.PathLike[str]) -> None:
    """Write the two-panel PNG to ``path``."""
    fig = figure(cmp)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def figure(cmp: Comparison) -> Figure:
    """GPUs needed per strategy (with over-commit and isolation violations), and utilization."""
    r = cmp.results
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 5.5))
    x = np.arange(len(STRATEGIES))
    gpus = [r[s].gpus_needed for s in STRATEGIES]
    bars = ax1.bar(x, gpus, color=[COLORS[s] for s in STRATEGIES])
    for b, s in zip(bars, STRATEGIES, strict=True):
        res = r[s]
        note = f"{res.gpus_needed}"
        if res.memory_overcommit_events:
            note += f"\nmem over: {res.memory_overcommit_events}"
        if res.isolation_violations:
            note += f"\niso viol: {res.isolation_violations}"
        ax1.annotate(
            note,
            (b.get_x() + b.get_width() / 2, b.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax1.set_xticks(x, STRATEGIES, rotation=20)
    ax1.set_ylabel("GPUs holding at least one service")
    ax1.text(
        0.99,
        0.98,
        "mem over: GPUs whose tenants' memory exceeds the GPU\n"
        "iso viol: services on a mechanism their isolation rules out",
        transform=ax1.transAxes,
        ha="right",
        va="top",
        fontsize=8,
    )
    ax1.set_title(f"GPUs needed for {len(cmp.services)} LLM-serving services (seed {cmp.seed})")
    ax1.set_ylim(0, max(gpus) * 1.25)

    w = 0.38
    ax2.bar(
        x - w / 2, [100 * r[s].memory_util for s in STRATEGIES], w, label="memory", color="#1f77b4"
    )
    ax2.bar(
        x + w / 2,
        [100 * r[s].compute_util for s in STRATEGIES],
        w,
        label="compute",
        color="#2ca02c",
    )
    ax2.set_xticks(x, STRATEGIES, rotation=20)
    ax2.set_ylabel("% of the GPUs in use (real demand, capped at the GPU)")
    ax2.set_title("Utilization of the GPUs in use")
    ax2.set_ylim(0, 105)
    ax2.legend()
    fig.tight_layout()
    return fig
