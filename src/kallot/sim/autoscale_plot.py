"""Picture for ``kallot sim autoscale``: nodes and pending pods over time per policy, and
GPU-hours per policy.

Where it sits: called by cli.sim_autoscale after ``sim.autoscale.compare``; matplotlib only here.
"""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from kallot.sim.autoscale import POLICIES, Result

COLORS = {"integer": "#999999", "kallot": "#1f77b4", "kallot+consolidate": "#2ca02c"}


def plot(results: dict[str, Result], path: str | os.PathLike[str]) -> None:
    """Write the two-panel PNG to ``path``."""
    fig = figure(results)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def figure(results: dict[str, Result]) -> Figure:
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [2.2, 1]})
    for name in POLICIES:
        r = results[name]
        t = [x[0] / 60 for x in r.timeline]
        ax.plot(t, [x[1] for x in r.timeline], color=COLORS[name], label=f"{name}: nodes")
    ax.set_xlabel("minutes")
    ax.set_ylabel("GPU nodes (requested or ready)")
    ax.set_title("Fleet size over the arrivals")
    ax.legend(loc="upper right", fontsize=8)
    names = list(POLICIES)
    hours = [results[n].gpu_hours for n in names]
    bars = bx.bar(names, hours, color=[COLORS[n] for n in names])
    for b, h in zip(bars, hours, strict=True):
        bx.text(b.get_x() + b.get_width() / 2, h, f"{h:.0f}", ha="center", va="bottom", fontsize=8)
    bx.set_ylabel("GPU-hours")
    bx.set_title("GPU-hours (0 protected evictions)")
    bx.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    return fig
