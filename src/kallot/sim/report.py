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
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
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


def _label_bars(ax: Axes, bars: Any, values: Sequence[float]) -> None:
    for bar, value in zip(bars, values, strict=True):
        ax.annotate(
            f"{value:.2f}",
            (bar.get_x() + bar.get_width() / 2, value),
            ha="center",
            va="bottom",
            fontsize=8,
            xytext=(0, 2),
            textcoords="offset points",
        )


def _bound_marks(ax: Axes, xs: Sequence[float], runs: Sequence[Sequence[Run]]) -> None:
    """``--bounds`` (sim.bounds): the packing references (unallocated % of the best packing)
    as marks on each bar, where every run of the bar has them."""
    for key, label, marker in (
        ("lp_pct", "lp (best packing of the arrived pods)", "_"),
        ("lp_given_placed_pct", "lp|placed (best packing of the placed pods)", "x"),
    ):
        points = [
            (x, float(np.mean([r.extra[key] for r in group])))
            for x, group in zip(xs, runs, strict=True)
            if group and all(key in r.extra for r in group)
        ]
        if points:
            px, py = zip(*points, strict=True)
            ax.scatter(px, py, marker=marker, s=120, color="black", zorder=3, label=label)


def unallocated_figure(by_policy: Mapping[str, Sequence[Run]], title: str) -> Figure:
    """Bars: unallocated % at arrived = 100%, mean with the seeds' standard deviation; with one
    policy, a bar per seed (one bar alone says nothing a table does not). With ``--bounds``,
    the packing references are marked on the bars."""
    fig, ax = plt.subplots(figsize=(9, 3.6), dpi=110)
    names = list(by_policy)
    if len(names) == 1:
        runs = list(by_policy[names[0]])
        labels = [f"seed {r.seed}" for r in runs]
        means = [r.unallocated_at(100) for r in runs]
        groups: list[Sequence[Run]] = [[r] for r in runs]
        bars = ax.bar(labels, means, color="#4c72b0")
        mean = float(np.mean(means))
        ax.axhline(mean, color="grey", linestyle="--", linewidth=0.8, label=f"mean {mean:.2f}")
        ax.set_title(f"{title}: {names[0]}, by seed")
        if len(labels) > 8:
            ax.tick_params(axis="x", labelrotation=45)
    else:
        means = [float(np.mean([r.unallocated_at(100) for r in by_policy[n]])) for n in names]
        sds = [float(np.std([r.unallocated_at(100) for r in by_policy[n]])) for n in names]
        groups = [by_policy[n] for n in names]
        bars = ax.bar(names, means, yerr=sds, color="#4c72b0", capsize=3)
        ax.set_title(title)
    _label_bars(ax, bars, means)
    _bound_marks(ax, [float(b.get_x() + b.get_width() / 2) for b in bars], groups)
    ax.set_ylim(0, max([*means, 1.0]) * 1.25)  # room for the labels and the legend
    ax.set_ylabel("unallocated GPUs at arrived = 100% (%)")
    ax.grid(axis="y", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # beside the bars, not over their labels
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    return fig


# Replay lines: each policy its own style, so one that overlaps another (fgd and kallot often
# do for hours) still shows; the later ones are drawn thinner and on top.
_STYLES = ("-", "--", ":", "-.")


BINS = 200  # the allocation panel's resolution: the raw series swings every few pods


def _binned(t: Any, values: Any) -> tuple[Any, Any]:
    """A step series (``values[i]`` holds from ``t[i]``) as its mean over ``BINS`` equal spans
    of time, sampled at 10 points a span: raw, two policies' lines swing so fast that the one
    drawn on top hides the other."""
    t = np.asarray(t, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    if t.size < 2 or t[-1] <= t[0]:
        return t, v
    fine = np.linspace(t[0], t[-1], BINS * 10)
    sampled = v[np.clip(np.searchsorted(t, fine, side="right") - 1, 0, v.size - 1)]
    means = sampled.reshape(BINS, 10).mean(axis=1)
    centres = fine.reshape(BINS, 10).mean(axis=1)
    return centres, means


def replay_figure(results: Sequence[ReplayResult], title: str) -> Figure:
    """Allocation over time, pending pods over time and how long pods waited, per policy."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), dpi=100)
    waited_any = False
    for k, r in enumerate(results):
        hours = r.times / 3600.0
        style = {
            "linestyle": _STYLES[k % len(_STYLES)],
            "linewidth": 1.8 if k == 0 else 1.1,
            "zorder": 2 + k,
        }
        grid, mean = _binned(hours, r.alloc_pct())
        axes[0].plot(grid, mean, label=r.policy, **style)
        axes[1].step(hours, r.pending, where="post", label=r.policy, **style)
        d = np.sort(np.asarray(r.delays, dtype=np.float64))
        waiting = d[d > 0]
        if waiting.size:
            waited_any = True
            # share of all pods that waited longer than t: at the defaults most pods wait not
            # at all, and a CDF of every pod is then a flat line at 1
            share = 1.0 - np.searchsorted(d, waiting, side="right") / d.size
            label = f"{r.policy} ({100 * waiting.size / d.size:.1f}% waited)"
            axes[2].step(waiting / 60.0, share, where="post", label=label, **style)
    axes[0].set(
        xlabel="time (h)",
        ylabel="GPU allocation (%)",
        title=f"allocation (mean per {BINS}th of the run)",
    )
    axes[1].set(xlabel="time (h)", ylabel="pending pods", title="pending queue")
    axes[2].set(xlabel="queueing delay t (min, log)", title="pods that waited longer than t")
    axes[2].set_ylabel("share of all pods (log)")
    if waited_any:
        axes[2].set(xscale="log", yscale="log")
    else:
        axes[2].text(
            0.5, 0.5, "no pod waited", ha="center", va="center", transform=axes[2].transAxes
        )
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
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
    top = 1.0
    for k, name in enumerate(names):
        values = [[r.unallocated_at(100) for r in by_workload[w][name]] for w in workloads]
        means = [float(np.mean(v)) for v in values]
        sds = [float(np.std(v)) for v in values]
        top = max(top, *(m + s for m, s in zip(means, sds, strict=True)))
        at = xs + (k - (len(names) - 1) / 2) * width
        ax.bar(at, means, width, yerr=sds, label=name, capsize=2)
        groups = [by_workload[w][name] for w in workloads]
        if k == 0:
            _bound_marks(ax, [float(x) for x in at], groups)
        else:  # one legend entry per bound
            _bound_marks_unlabelled(ax, [float(x) for x in at], groups)
    ax.set_xticks(xs, workloads, rotation=20)
    ax.set_ylim(0, top * 1.1)
    ax.set_ylabel("unallocated GPUs at arrived = 100% (%)")
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    # Beside the plot, not over it: a legend inside covered the tallest bar.
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    return fig


def _bound_marks_unlabelled(ax: Axes, xs: Sequence[float], runs: Sequence[Sequence[Run]]) -> None:
    before = len(ax.collections)
    _bound_marks(ax, xs, runs)
    for coll in ax.collections[before:]:
        coll.set_label("_nolegend_")


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
        "padding:.25em .6em;text-align:right}td:first-child,th:first-child{text-align:left}"
        "th{background:#f3f3f3}caption{text-align:left;"
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
