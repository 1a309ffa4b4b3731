"""Reports: plots (PNG) and one self-contained HTML page per simulation run or comparison.

Where it sits: the last step of ``kallot sim openb`` / ``compare`` / ``replay``; it only reads
the results of ``sim.openb`` and ``sim.replay`` and never changes them. The HTML embeds the PNGs
(base64), so a report is one file that can be mailed or attached to a ticket.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from kallot.sim.openb import Run
from kallot.sim.replay import ReplayResult

ARRIVED = tuple(range(0, 131))


def mean_curve(runs: Sequence[Run], xs: Sequence[int] = ARRIVED) -> list[float]:
    """Mean over runs of the allocation % at each arrived %; NaN where no run has data."""
    curves = np.array([r.curve(xs) for r in runs], dtype=np.float64)
    with np.errstate(all="ignore"):
        return [float(v) for v in np.nanmean(curves, axis=0)]


def allocation_figure(by_policy: Mapping[str, Sequence[Run]], title: str) -> Figure:
    """The paper's Figure: allocation ratio against arrived workload, one line per policy."""
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    xs = [x for x in ARRIVED if x >= 50]
    for policy, runs in by_policy.items():
        ax.plot(xs, mean_curve(runs, xs), label=policy, linewidth=1.6)
    ax.plot(xs, [min(x, 100) for x in xs], color="grey", linestyle=":", label="ideal")
    ax.axvline(100, color="grey", linewidth=0.6)
    ax.set_xlabel("arrived workload (% of GPU capacity)")
    ax.set_ylabel("GPU allocation (% of capacity)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def unallocated_figure(by_policy: Mapping[str, Sequence[Run]], title: str) -> Figure:
    """Bars: unallocated % at arrived = 100%, mean with the seeds' standard deviation."""
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=110)
    names = list(by_policy)
    means = [float(np.mean([r.unallocated_at(100) for r in by_policy[n]])) for n in names]
    sds = [float(np.std([r.unallocated_at(100) for r in by_policy[n]])) for n in names]
    bars = ax.bar(names, means, yerr=sds, color="#4c72b0", capsize=3)
    for bar, value in zip(bars, means, strict=True):
        ax.annotate(
            f"{value:.2f}",
            (bar.get_x() + bar.get_width() / 2, value),
            ha="center",
            va="bottom",
            fontsize=8,
            xytext=(0, 2),
            textcoords="offset points",
        )
    ax.set_ylabel("unallocated GPUs at arrived = 100% (%)")
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def replay_figure(results: Sequence[ReplayResult], title: str) -> Figure:
    """Allocation over time, pending pods over time and the queueing-delay CDF, per policy."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), dpi=100)
    for r in results:
        hours = r.times / 3600.0
        axes[0].step(hours, r.alloc_pct(), where="post", label=r.policy, linewidth=0.8)
        axes[1].step(hours, r.pending, where="post", label=r.policy, linewidth=0.8)
        d = np.sort(r.delays)
        if d.size:
            axes[2].plot(np.maximum(d, 1.0), np.arange(1, d.size + 1) / d.size, label=r.policy)
    axes[0].set(xlabel="time (h)", ylabel="GPU allocation (%)", title="allocation")
    axes[1].set(xlabel="time (h)", ylabel="pending pods", title="pending queue")
    axes[2].set(
        xlabel="queueing delay (s, log; 0 shown as 1)",
        ylabel="share of pods",
        title="delay CDF",
        xscale="log",
    )
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def workloads_figure(by_workload: Mapping[str, Mapping[str, Sequence[Run]]], title: str) -> Figure:
    """Grouped bars: unallocated % at arrived = 100% per workload (groups) and policy (bars),
    means over seeds with their standard deviation."""
    workloads = list(by_workload)
    names = list(next(iter(by_workload.values()))) if workloads else []
    fig, ax = plt.subplots(figsize=(max(7.0, 1.3 * len(workloads) + 2), 3.8), dpi=110)
    width = 0.8 / max(1, len(names))
    xs = np.arange(len(workloads))
    for k, name in enumerate(names):
        values = [[r.unallocated_at(100) for r in by_workload[w][name]] for w in workloads]
        means = [float(np.mean(v)) for v in values]
        sds = [float(np.std(v)) for v in values]
        ax.bar(
            xs + (k - (len(names) - 1) / 2) * width, means, width, yerr=sds, label=name, capsize=2
        )
    ax.set_xticks(xs, workloads, rotation=20)
    ax.set_ylabel("unallocated GPUs at arrived = 100% (%)")
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, ncols=min(4, max(1, len(names))))
    fig.tight_layout()
    return fig


def png_bytes(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def html_page(
    title: str,
    tables: Sequence[tuple[str, Sequence[str], Sequence[Sequence[str]]]],
    images: Sequence[bytes],
    notes: Sequence[str] = (),
) -> str:
    """A self-contained page: ``tables`` as (caption, header, rows), then the PNGs."""
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:system-ui,sans-serif;margin:2em;max-width:72em}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;"
        "padding:.25em .6em;text-align:right}th{background:#f3f3f3}caption{text-align:left;"
        "font-weight:600;margin-bottom:.3em}img{max-width:100%}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    parts += [f"<p>{html.escape(n)}</p>" for n in notes]
    for caption, header, rows in tables:
        parts.append(f"<table><caption>{html.escape(caption)}</caption><tr>")
        parts += [f"<th>{html.escape(h)}</th>" for h in header]
        parts.append("</tr>")
        for row in rows:
            parts.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>")
        parts.append("</table>")
    for png in images:
        parts.append(f"<p><img src='data:image/png;base64,{base64.b64encode(png).decode()}'></p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write(path: Path, page: str, images: Sequence[bytes]) -> list[Path]:
    """Write the HTML to ``path`` and each PNG next to it (``<stem>-<i>.png``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    written = [path]
    for i, png in enumerate(images, start=1):
        p = path.with_name(f"{path.stem}-{i}.png")
        p.write_bytes(png)
        written.append(p)
    return written
