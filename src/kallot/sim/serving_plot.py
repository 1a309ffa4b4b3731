"""Picture for ``kallot sim serving``: over the hour, the GPUs serving replicas hold, the p99 time
to first token per 5 minutes, and the cumulative cold starts (weights pulled from remote), per
placement policy.

Where it sits: called by cli.sim_serving after ``sim.serving.compare``; matplotlib only here.
"""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from kallot.sim.serving import POLICIES, Comparison

COLORS = {"blind": "#999999", "cache_aware": "#ff7f0e", "prewarm": "#1f77b4"}
# The three policies' lines often coincide (same GPUs held for minutes): a style each, the
# first widest and lowest, so a line on top of another leaves it visible.
STYLES = {
    "blind": {"linestyle": "-", "linewidth": 3.0, "zorder": 2},
    "cache_aware": {"linestyle": "--", "linewidth": 1.8, "zorder": 3},
    "prewarm": {"linestyle": ":", "linewidth": 1.6, "zorder": 4},
}
BIN_S = 300.0


def plot(cmp: Comparison, path: str | os.PathLike[str]) -> None:
    """Write the three-panel PNG to ``path``."""
    fig = figure(cmp)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def figure(cmp: Comparison) -> Figure:
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(16, 5))
    for name in POLICIES:
        r = cmp.results.get(name)
        if r is None:
            continue
        color = COLORS[name]
        style = STYLES[name]
        ax1.step(r.timeline_t / 60, r.timeline_gpus, where="post", color=color, label=name, **style)
        edges = np.arange(0.0, float(r.arrival.max(initial=0.0)) + BIN_S, BIN_S)
        which = np.digitize(r.arrival, edges) - 1
        p99 = [
            float(np.percentile(r.ttft[which == b], 99)) if np.any(which == b) else np.nan
            for b in range(edges.size)
        ]
        ax2.plot(edges / 60 + BIN_S / 120, p99, marker="o", ms=3, color=color, label=name, **style)
        cold = sorted(t for t, tier in r.start_log if tier == "remote")
        ax3.step(
            [0.0, *(t / 60 for t in cold), float(r.timeline_t[-1]) / 60],
            [0, *range(1, len(cold) + 1), len(cold)],
            where="post",
            color=color,
            label=f"{name} ({len(cold)})",
            **style,
        )
    ax1.set_xlabel("minute")
    ax1.set_ylabel("GPUs held by serving replicas")
    ax2.set_xlabel("minute")
    ax2.set_ylabel("time to first token p99 per 5 min (s)")
    ax2.set_yscale("log")
    ax3.set_xlabel("minute")
    ax3.set_ylabel("cold starts (weights pulled from remote), cumulative")
    for ax in (ax1, ax2, ax3):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(
        f"kallot sim serving: {len(cmp.services)} services from the Azure LLM trace 2023, "
        f"seed {cmp.seed}"
    )
    fig.tight_layout()
    return fig
