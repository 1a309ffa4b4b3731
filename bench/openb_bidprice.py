"""Bid-price re-optimisation of kallot's tail values on openb (an experiment, not a policy).

kallot's share score prices tails with the packing LP of the target workload, solved once for
an empty cluster (``kallot.core.packing``, design note 002 section 5.4). This script tries the
natural next step: every ``K`` scorings, re-solve a *multi-stock* LP for the cluster as it is
(one row per free level present, its GPU count; one row per share size, the target's
proportions scaled to the free milli left), price its columns with the same knapsack (which
gives ``U(l)`` for every level at once), and score with ``V(l) = l - U(l)`` from its duals.
It swaps ``KallotFrag.deltas`` in this process only; results are in design note 002 section 8.

    python bench/openb_bidprice.py --openb ../shared/data/openb --workload gpushare40 \
        --seeds 52..57 --every 50,500 --mix 1,0.5
"""

from __future__ import annotations

import argparse
import itertools
import os
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import highspy
import numpy as np

from kallot.cli.sim_openb import load, parse_seeds
from kallot.core import packing
from kallot.core.helpers import kallot_frag
from kallot.core.resources import MILLI
from kallot.sim import openb

MAX_ROUNDS = 200
STATIC_DELTAS = kallot_frag.KallotFrag.deltas  # the unpatched method (pool workers are reused)


def multi_stock_values(stock: Mapping[int, int], demand: Mapping[int, float]) -> np.ndarray:
    """``V[l]`` for ``l = 0..1000`` from the LP that packs ``demand[s]`` shares of each size into
    ``stock[l]`` GPUs with ``l`` milli free (whole GPUs: size 1000, idle GPUs only)."""
    sizes = sorted(s for s, n in demand.items() if n > 0)
    levels = sorted(lv for lv, n in stock.items() if n > 0)
    row_s = {s: i for i, s in enumerate(sizes)}
    row_l = {lv: len(sizes) + i for i, lv in enumerate(levels)}
    h = highspy.Highs()  # type: ignore[no-untyped-call]  # highspy 1.15 leaves __init__ untyped
    h.setOptionValue("output_flag", False)
    h.changeObjectiveSense(highspy.ObjSense.kMaximize)
    inf, no_i, no_v = highspy.kHighsInf, np.array([], np.int32), np.array([], np.float64)
    for s in sizes:
        h.addRow(-inf, float(demand[s]), 0, no_i, no_v)
    for lv in levels:
        h.addRow(-inf, float(stock[lv]), 0, no_i, no_v)
    columns: set[tuple[int, tuple[int, ...]]] = set()

    def add(level: int, pattern: tuple[int, ...]) -> bool:
        if (level, pattern) in columns:
            return False
        columns.add((level, pattern))
        counts = {s: pattern.count(s) for s in set(pattern)}
        idx = np.array([row_l[level], *(row_s[s] for s in counts)], np.int32)
        val = np.array([1.0, *map(float, counts.values())])
        h.addCol(float(sum(pattern)), 0.0, inf, idx.size, idx, val)
        return True

    for lv in levels:
        for s in sizes:
            if s <= lv:
                add(lv, (s,) * (lv // s))
    pi: dict[int, float] = {}
    u = np.zeros(MILLI + 1)
    for _ in range(MAX_ROUNDS):
        h.run()
        dual = np.asarray(h.getSolution().row_dual)
        pi = {s: max(0.0, float(dual[row_s[s]])) for s in sizes}
        mu = {lv: max(0.0, float(dual[row_l[lv]])) for lv in levels}
        u, last = packing.knapsack({s: s - pi[s] for s in sizes if s < MILLI})
        new = [
            add(lv, packing._pattern(last, lv))
            for lv in levels
            if u[lv] > mu[lv] + packing.TOLERANCE
        ]
        if not any(new):
            break
    u = u.copy()
    if MILLI in pi:
        u[MILLI] = max(u[MILLI], MILLI - pi[MILLI])
    return np.arange(MILLI + 1, dtype=np.float64) - u


def patch(every: int, mix: float) -> None:
    """Make ``KallotFrag`` re-solve its tail values every ``every`` scorings (``mix``: weight of
    the re-solved ``V`` against the static one)."""
    deltas = STATIC_DELTAS

    def resolving(self: Any, cycle: Any, task: Any, rows: Any) -> Any:
        count = getattr(self, "_bp_count", 0)
        self._bp_count = count + 1
        if count % every == 0:
            view = self.view(cycle)
            if not hasattr(self, "_bp_static"):
                self._bp_static = kallot_frag.KallotFrag.terms(self, view)
            ratio, static = self._bp_static
            snap = cycle.snapshot
            free = (snap.gpu_cap_milli - cycle.scratch.gpu_used_milli)[snap.gpu_valid]
            free = np.clip(free, 0, MILLI)
            levels, counts = np.unique(free[free > 0], return_counts=True)
            demand = kallot_frag.share_demand(view.inputs)
            total = sum(s * n for s, n in demand.items())
            values = static
            if levels.size and total > 0:
                left = float(free.sum())
                scaled = {s: n * left / total for s, n in demand.items() if n > 0}
                stock = dict(zip(levels.tolist(), counts.tolist(), strict=True))
                values = mix * multi_stock_values(stock, scaled) + (1 - mix) * static
            self._terms = (view.inputs.target, ratio, values)
        return deltas(self, cycle, task, rows)

    kallot_frag.KallotFrag.deltas = resolving  # type: ignore[method-assign]


def one(job: tuple[str, int, int, float]) -> float:
    path, seed, every, mix = job
    if every:
        patch(every, mix)
    else:
        kallot_frag.KallotFrag.deltas = STATIC_DELTAS  # type: ignore[method-assign]
    name, nodes, pods = load(path)
    return openb.run(nodes, pods, policy="kallot", seed=seed, workload=name).unallocated_at(100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--openb", default=os.environ.get("KALLOT_OPENB_DIR", "../shared/data/openb"))
    ap.add_argument("--workload", default="gpushare40")
    ap.add_argument("--seeds", default="52..57")
    ap.add_argument("--every", default="50,500", help="re-solve every K scorings (list)")
    ap.add_argument("--mix", default="1,0.5", help="weight of the re-solved V (list)")
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    path = os.path.join(a.openb, f"openb_pod_list_{a.workload}.csv")
    seeds = parse_seeds(a.seeds)
    periods = [int(k) for k in a.every.split(",")]
    mixes = [float(m) for m in a.mix.split(",")]
    variants = [(0, 1.0), *itertools.product(periods, mixes)]
    print(f"{a.workload}, seeds {a.seeds}: mean unallocated % at arrived = 100%")
    with ProcessPoolExecutor(a.jobs) as pool:
        for every, mix in variants:
            got = list(pool.map(one, [(path, s, every, mix) for s in seeds]))
            label = "static prices" if not every else f"every {every}, mix {mix:g}"
            print(f"  {label:<24} {np.mean(got):.3f}  ({' '.join(f'{v:.2f}' for v in got)})")


if __name__ == "__main__":
    main()
