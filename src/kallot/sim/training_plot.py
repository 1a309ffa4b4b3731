"""Pictures for ``kallot sim training``: one PNG comparing the topology-blind and the
topology-aware policy (locality shares, per-job slowdown from communication, GPU time).

Where it sits: called by cli.sim_training after ``sim.training.compare``; matplotlib only here.
"""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from kallot.sim.training import Comparison, PolicyRun


def _slowdowns(run: PolicyRun) -> np.ndarray:
    return np.sort([(r.end - r.start) / r.job.compute_s for r in run.results.values()])


def plot(cmp: Comparison, path: str | os.PathLike[str]) -> None:
    """Write the three-panel figure to ``path`` (the format by its extension)."""
    fig = figure(cmp)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def figure(cmp: Comparison) -> Figure:
    """The three-panel figure."""
    summary = cmp.summary()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    names = ("blind", "kallot")
    labels = (f"topology-blind ({cmp.blind.policy})", f"kallot ({cmp.aware.policy})")
    colors = ("#999999", "#1f77b4")

    ax = axes[0]
    metrics = (
        ("in_one_island_pct", "one NVLink island\n(jobs of 2-8 GPUs)"),
        ("in_one_rack_pct", "one rack\n(multi-pod jobs)"),
    )
    x = np.arange(len(metrics))
    for i, (name, label, color) in enumerate(zip(names, labels, colors, strict=True)):
        values = [summary[m][name] for m, _ in metrics]  # type: ignore[index]
        bars = ax.bar(x + (i - 0.5) * 0.38, values, 0.38, label=label, color=color)
        ax.bar_label(bars, fmt="%.0f%%")
    ax.set_xticks(x, [t for _, t in metrics])
    ax.set_ylim(0, 110)
    ax.set_ylabel("% of jobs")
    ax.set_title("Locality")

    ax = axes[1]
    for run, label, color in zip((cmp.blind, cmp.aware), labels, colors, strict=True):
        s = _slowdowns(run)
        ax.plot(s, np.arange(1, s.size + 1) / s.size, label=label, color=color)
    ax.set_xscale("log")
    ax.set_xlabel("job time / compute time (all-reduce cost model)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title("Slowdown from communication (CDF)")

    ax = axes[2]
    # Ratios to topology-blind: the tick says what the blind policy's absolute value is (the
    # axis itself has no unit).
    keys = (
        ("gpu_hours", "GPU-hours", 1.0, "{:.0f} GPU-h"),
        ("mean_completion_s", "mean completion", 3600.0, "{:.1f} h"),
    )
    x = np.arange(len(keys))
    top = 1.0
    for i, (name, label, color) in enumerate(zip(names, labels, colors, strict=True)):
        ratios = [
            float(summary[k][name]) / float(summary[k]["blind"])  # type: ignore[index]
            for k, _, _, _ in keys
        ]
        top = max(top, *ratios)
        bars = ax.bar(x + (i - 0.5) * 0.38, ratios, 0.38, label=label, color=color)
        ax.bar_label(bars, fmt="%.2f")
    ticks = [
        f"{t}\n(blind: {fmt.format(float(summary[k]['blind']) / unit)})"  # type: ignore[index]
        for k, t, unit, fmt in keys
    ]
    ax.set_xticks(x, ticks)
    ax.set_ylim(0, top * 1.15)
    ax.set_ylabel("ratio to topology-blind")
    ax.set_title("Efficiency")
    handles, names_ = axes[0].get_legend_handles_labels()
    # One legend for the three panels, under the title: inside a panel it covered bars.
    fig.legend(handles, names_, loc="upper center", bbox_to_anchor=(0.5, 0.93), ncols=2, fontsize=9)
    fig.suptitle(
        f"kallot sim training: {summary['jobs']} jobs ({summary['gangs']} gangs) on "
        f"{summary['nodes']} nodes / {summary['gpus']} GPUs, seed {summary['seed']}"
    )
    fig.tight_layout(rect=(0, 0, 1, 0.88))
    return fig
