"""Pictures for ``kallot sim tenants``: one PNG comparing FIFO with static quotas and kallot's
queues (fairness over time, each queue's holdings against its fair share, GPU allocation).

Where it sits: called by cli.sim_tenants after ``sim.tenants.compare``; matplotlib only here.
"""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from kallot.sim.tenants import Comparison, RunResult

NAMES = ("fifo", "kallot")
LABELS = {"fifo": "FIFO + static quotas", "kallot": "kallot queues"}
COLORS = {"fifo": "#999999", "kallot": "#1f77b4"}


def _smooth(values: np.ndarray, n: int = 10) -> np.ndarray:
    """Trailing mean over up to ``n`` samples (no dip at the ends)."""
    c = np.cumsum(np.insert(values.astype(np.float64), 0, 0.0))
    i = np.arange(1, values.size + 1)
    lo = np.maximum(i - n, 0)
    out: np.ndarray = (c[i] - c[lo]) / (i - lo)
    return out


def plot(cmp: Comparison, path: str | os.PathLike[str]) -> None:
    """Write the four-panel figure to ``path`` (the format by its extension)."""
    fig = figure(cmp)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def figure(cmp: Comparison) -> Figure:
    """The four-panel figure."""
    runs: dict[str, RunResult] = {"fifo": cmp.fifo, "kallot": cmp.kallot}
    fig, axes = plt.subplots(2, 2, figsize=(14, 9))
    hours = {n: r.times / 3600.0 for n, r in runs.items()}

    ax = axes[0, 0]
    for n, r in runs.items():
        ax.plot(
            hours[n], _smooth(r.jain), color=COLORS[n], label=f"{LABELS[n]} ({r.mean_jain():.3f})"
        )
    ax.set_title("Jain's index of received / fair share (10-min mean)")
    ax.set_xlabel("hours")
    ax.set_ylim(0, 1.05)
    ax.legend(loc="lower left")

    for ax, n in ((axes[0, 1], "fifo"), (axes[1, 0], "kallot")):
        r = runs[n]
        colors = plt.get_cmap("tab10")
        for j, q in enumerate(r.leaves):
            ax.plot(hours[n], r.usage[:, j] / 1000.0, color=colors(j), label=q)
            ax.plot(hours[n], r.entitlement[:, j] / 1000.0, color=colors(j), ls=":", lw=1)
        ax.set_title(f"{LABELS[n]}: GPU value held (solid) vs fair share (dotted)")
        ax.set_xlabel("hours")
        ax.set_ylabel("value units (T4 = 1)")
        ax.legend(loc="upper right", fontsize=8)

    ax = axes[1, 1]
    for n, r in runs.items():
        pct = 100.0 * r.used_milli / max(r.capacity_milli, 1)
        ax.plot(hours[n], pct, color=COLORS[n], label=f"{LABELS[n]} ({r.utilization_pct():.1f}%)")
    ax.set_title("GPU allocation, % of capacity")
    ax.set_xlabel("hours")
    ax.set_ylim(0, 105)
    ax.legend(loc="lower right")
    k = cmp.kallot
    fig.suptitle(
        f"kallot sim tenants: {cmp.n_gpus} GPUs on {cmp.n_nodes} nodes, {cmp.n_tasks} pods, "
        f"load {cmp.offered_load:.2f}, seed {cmp.seed}; kallot evicted {k.evictions} pods "
        f"({k.preempted_gpu_hours:.1f} GPU-hours lost)"
    )
    fig.tight_layout()
    return fig
