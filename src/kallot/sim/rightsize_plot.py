"""Picture for ``kallot sim rightsize``: GPUs needed as requested and right-sized, the fleet's
memory use against what each placement reserves over the held-out part, and each pod's held-out
peak against its right-sized share (above 1 would be an overrun).

Where it sits: called by cli.sim_rightsize after ``sim.rightsize.run``; matplotlib only here.
"""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from kallot.sim.rightsize import Result

GIB = 1024


def plot(res: Result, path: str | os.PathLike[str]) -> None:
    """Write the three-panel PNG to ``path``."""
    fig = figure(res)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def figure(res: Result) -> Figure:
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(16, 5), width_ratios=(1, 2, 1.4))
    names = ["as requested", "right-sized"]
    gpus = [res.as_requested.gpus_needed, res.rightsized.gpus_needed]
    bars = ax1.bar(names, gpus, color=["#999999", "#1f77b4"])
    for b, g in zip(bars, gpus, strict=True):
        ax1.annotate(str(g), (b.get_x() + b.get_width() / 2, g), ha="center", va="bottom")
    ax1.set_ylabel("GPUs holding at least one pod")
    ax1.set_title(f"{len(res.services)} services, seed {res.seed}")

    minutes = np.arange(res.fleet_mem_used.size) / 60
    ax2.plot(minutes, res.fleet_mem_used / GIB, color="#2ca02c", lw=1, label="memory used")
    ax2.axhline(res.fleet_mem_alloc_rs / GIB, color="#1f77b4", label="right-sized shares")
    ax2.axhline(res.fleet_mem_alloc_req / GIB, color="#999999", ls="--", label="whole GPUs")
    ax2.set_xlabel("minutes into the held-out part of the trace")
    ax2.set_ylabel("fleet GPU memory (GiB)")
    ax2.set_ylim(0, res.fleet_mem_alloc_req / GIB * 1.05)
    ax2.legend(loc="lower right", fontsize=8)
    ax2.set_title(
        f"held-out {res.replay_s / 60:.0f} min: {res.memory_overruns} pods over their share"
    )

    ratios = np.array(sorted(res.peak_ratio.values()))
    ax3.hist(ratios, bins=20, range=(0.5, 1.1), color="#1f77b4")
    ax3.axvline(1.0, color="#d62728", ls="--", label="share (overrun above)")
    ax3.set_xlabel("held-out peak memory / right-sized share")
    ax3.set_ylabel("pods")
    ax3.legend(fontsize=8)
    fig.tight_layout()
    return fig
