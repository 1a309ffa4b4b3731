"""Online packing rules and score variants added to kallot's share score on openb (experiments).

kallot's share score prices GPU tails with the packing LP's static prices (design note 002,
section 5.4). These variants ask whether an online rule known from bin packing closes what is
left between kallot and the best packing of the pods it places. Each swaps a method of
``KallotFrag`` or ``Session`` in the worker process only; results are in design note 002,
section 8. Variants (``--variants``, a list):

- ``base``: kallot as it is (the same-run baseline).
- ``ss:W``: sum of squares (Csirik et al.): a share moving a GPU from ``l`` free to ``l - s``
  changes ``sum_l N(l)^2`` over the cluster's partly used GPUs by ``2 (N(l - s) - N(l) + 1)``;
  the score adds ``W * (N(l) - N(l - s) - 1)`` (milli per GPU of that change). Scores depend on
  the whole cluster here, so every node is re-scored for every share.
- ``pattern:B``: the LP's primal. Every GPU that takes its first share is given the optimal
  pattern (x > 0) that holds its shares and lags most behind its LP proportion; a share that
  fills a slot its GPU's pattern still lacks scores ``+B``; a share off the pattern moves the
  GPU to another pattern that holds its shares, or to none.
- ``tie:fresh`` / ``tie:everyK``: the node order that breaks equal scores drawn again every
  placement / every K placements (kallot draws it once per session, as the FGD simulator does).
- ``tie:loaded`` / ``tie:emptiest``: equal scores go to the node with the most / least GPU
  milli in use (then the seeded order).
- ``cw:W`` / ``tw:W``: the score's CPU (4; 1.5 before stop 21) or tail (12) weight set to W.
- ``sq:S`` / ``lv:Q``: FGD's squash ``floor(Q * sigmoid(delta / S))`` with another sigmoid
  scale ``S`` (1000) or number of score levels ``Q`` (100).
- The four combine with ``/``: ``cw:6/tw:24``, ``sq:2000/lv:200``, ``tw:24/sq:2000``.
- ``force:F`` / ``forcew:F``: tail values from the packing LP that must place at least ``F`` of
  the target's big shares (> 500 milli; ``forcew``: and of its whole GPUs). kallot never turns
  away a pod it can place, while the free LP prices the 810s as the pods it refuses.
- ``cov:C``: the target workload's coverage (FGD's 95% of the pods by shape) set to ``C``
  for both of kallot's uses of it, FGD's gradient and the packing LP's demand.
- ``order:small|big|cpu|lowcpu``: the node order for ties sorted by GPUs per node (fewest or
  most first) or CPU per GPU (most or least first), the seeded order within equal values.

    python bench/openb_online_variants.py --openb ../shared/data/openb --workload gpushare40 \
        --seeds 42..45 --variants base,ss:0.5,ss:2,pattern:60,pattern:300,tie:fresh,tie:every100
"""

from __future__ import annotations

import argparse
import os
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np

from kallot.cli.sim_openb import load, parse_seeds
from kallot.core import frag, packing
from kallot.core.framework import runner
from kallot.core.framework.cycle import Cycle
from kallot.core.helpers import frag_score, kallot_frag
from kallot.core.plugins import kallot_score
from kallot.core.resources import MILLI
from kallot.core.session import session
from kallot.sim import openb

# The unpatched methods (pool workers are reused across variants).
DELTAS = kallot_frag.KallotFrag.deltas
CHOOSE = kallot_frag.KallotFrag.choose
SCORE = frag_score.FragScore.score
DISTINCT = frag.distinct_rows
CYCLE = session.Session.cycle
SQUASH = frag_score.squash
LP_TAIL_VALUES = packing.lp_tail_values
SELECT = runner.Framework.__dict__["select"]  # the staticmethod object itself
# kallot_score reads CPU_WEIGHT and TAIL_WEIGHTS as its own globals (imported from
# helpers.kallot_frag, not re-exported): the variants patch them in its namespace.
SCORE_GLOBALS = vars(kallot_score)
WEIGHTS = (SCORE_GLOBALS["CPU_WEIGHT"], SCORE_GLOBALS["TAIL_WEIGHTS"]["lp"])


def _restore() -> None:
    kallot_frag.KallotFrag.deltas = DELTAS  # type: ignore[method-assign]
    kallot_frag.KallotFrag.choose = CHOOSE  # type: ignore[method-assign]
    frag_score.FragScore.score = SCORE  # type: ignore[method-assign]
    frag.distinct_rows = DISTINCT
    frag_score.squash = SQUASH
    packing.lp_tail_values = LP_TAIL_VALUES
    session.Session.cycle = CYCLE  # type: ignore[method-assign]
    runner.Framework.select = SELECT  # type: ignore[method-assign]
    SCORE_GLOBALS["CPU_WEIGHT"], SCORE_GLOBALS["TAIL_WEIGHTS"]["lp"] = WEIGHTS


def _is_share(task: Any) -> bool:
    return task.gpu is not None and task.gpu.count == 1 and task.gpu.is_fractional


def sum_of_squares(weight: float) -> None:
    def deltas(self: Any, cycle: Cycle, task: Any, rows: np.ndarray) -> Any:
        delta, slots = DELTAS(self, cycle, task, rows)
        if slots is None:
            return delta, slots
        snap, x = cycle.snapshot, cycle.scratch
        free = np.clip(snap.gpu_cap_milli - x.gpu_used_milli, 0, MILLI)
        n = np.bincount(free[snap.gpu_valid], minlength=MILLI + 1).astype(np.float64)
        n[0] = n[MILLI] = 0.0  # full and idle GPUs are not in the sum
        left = free[rows]
        after = np.clip(left - task.gpu.milli, 0, MILLI)
        return delta + weight * (n[left] - n[after] - 1.0), slots

    def score(self: Any, cycle: Cycle, task: Any, candidates: np.ndarray) -> Any:
        if _is_share(task):
            self._entry(cycle, task).dirty[:] = True
        return SCORE(self, cycle, task, candidates)

    kallot_frag.KallotFrag.deltas = deltas  # type: ignore[method-assign]
    frag_score.FragScore.score = score  # type: ignore[method-assign]
    frag.distinct_rows = lambda *a, **k: None


class Patterns:
    """The LP's optimal share patterns and which GPU follows which."""

    def __init__(self, demand: dict[int, float], shape: tuple[int, int]) -> None:
        total = sum(s * n for s, n in demand.items() if n > 0)
        gpus = 1000.0
        scaled = {s: n * gpus * MILLI / total for s, n in demand.items() if n > 0}
        lp = packing.ConfigLP(scaled, gpus)
        lp.solve(scaled, clamp=True)
        x = np.asarray(lp._h.getSolution().col_value)
        chosen = [(p, x[i]) for i, p in enumerate(lp.patterns) if x[i] > 1e-6 and p != (MILLI,)]
        self.patterns = [Counter(p) for p, _ in chosen]
        share = np.array([w for _, w in chosen])
        self.share = share / share.sum()
        self.opened = np.zeros(len(chosen))
        self.column = {s: i for i, s in enumerate(sorted({s for p, _ in chosen for s in p}))}
        self.need = np.zeros((*shape, len(self.column) + 1), np.int16)
        self.content: dict[tuple[int, int], list[int]] = {}
        self.assigned: dict[tuple[int, int], int] = {}

    def col(self, size: int) -> int:
        return self.column.get(size, len(self.column))

    def place(self, node: int, gpu: int, size: int) -> None:
        key = (node, gpu)
        content = self.content.setdefault(key, [])
        content.append(size)
        if key in self.assigned and self.need[node, gpu, self.col(size)] > 0:
            self.need[node, gpu, self.col(size)] -= 1
            return
        old = self.assigned.pop(key, None)
        if old is not None:
            self.opened[old] -= 1
        self.need[node, gpu, :] = 0
        have = Counter(content)
        total = self.opened.sum() + 1
        fits = [i for i, p in enumerate(self.patterns) if all(p[s] >= k for s, k in have.items())]
        if not fits:
            return
        best = max(fits, key=lambda i: self.share[i] * total - self.opened[i])
        self.assigned[key] = best
        self.opened[best] += 1
        for s, k in (self.patterns[best] - have).items():
            self.need[node, gpu, self.col(s)] = k


def pattern(bonus: float) -> None:
    state: dict[str, Patterns] = {}

    def patterns(self: Any, cycle: Cycle) -> Patterns:
        if "p" not in state:
            demand = kallot_frag.share_demand(self.view(cycle).inputs)
            state["p"] = Patterns(demand, cycle.snapshot.gpu_valid.shape)
        return state["p"]

    def deltas(self: Any, cycle: Cycle, task: Any, rows: np.ndarray) -> Any:
        delta, slots = DELTAS(self, cycle, task, rows)
        if slots is None:
            return delta, slots
        p = patterns(self, cycle)
        return delta + bonus * (p.need[rows, :, p.col(task.gpu.milli)] > 0), slots

    def choose(self: Any, cycle: Cycle, task: Any, node: int, feasible: np.ndarray) -> Any:
        out = CHOOSE(self, cycle, task, node, feasible)
        if out is not None:
            patterns(self, cycle).place(node, out[0], task.gpu.milli)
        return out

    kallot_frag.KallotFrag.deltas = deltas  # type: ignore[method-assign]
    kallot_frag.KallotFrag.choose = choose  # type: ignore[method-assign]


def tie_order(every: int) -> None:
    def cycle(self: Any) -> Cycle:
        self._draws = getattr(self, "_draws", 0) + 1
        if self._draws % every == 0:
            self.tie_rank = self.rng.permutation(self.snapshot.n_nodes).astype(np.int64)
        return CYCLE(self)  # the session's cycle reads ``tie_rank`` from the session

    session.Session.cycle = cycle  # type: ignore[method-assign]


def tie_by_node(key: str) -> None:
    """The node order for ties sorted by a node property first (GPUs per node, CPU per GPU),
    the seeded order within equal values."""

    def cycle(self: Any) -> Cycle:
        if not getattr(self, "_sorted", False):
            snap = self.snapshot
            gpus = snap.gpu_valid.sum(axis=1).astype(np.float64)
            cpu = snap.node_cpu_milli / np.maximum(gpus, 1.0)
            first = {"small": gpus, "big": -gpus, "cpu": -cpu, "lowcpu": cpu}[key]
            order = np.lexsort((self.tie_rank, first))
            self.tie_rank = np.empty_like(self.tie_rank)
            self.tie_rank[order] = np.arange(order.size)
            self._sorted = True
        return CYCLE(self)

    session.Session.cycle = cycle  # type: ignore[method-assign]


def tie_by_load(sign: float) -> None:
    """Equal scores go to the node with the most (sign 1) or least (-1) GPU milli in use,
    the seeded order after that."""

    def select(cycle: Cycle, candidates: np.ndarray, totals: np.ndarray) -> int:
        tied = candidates[totals == totals.max()]
        if tied.size == 1:
            return int(tied[0])
        used = cycle.scratch.gpu_used_milli[tied].sum(axis=1)
        best = tied[sign * used == (sign * used).max()]
        return int(best[cycle.tie_rank[best].argmin()])

    runner.Framework.select = staticmethod(select)  # type: ignore[method-assign]


def squash(scale: float, levels: float) -> None:
    """FGD's squash with another sigmoid scale (milli) and number of score levels."""

    def squashed(delta: np.ndarray, quantize: bool) -> np.ndarray:
        s = levels / (1.0 + np.exp(-delta / scale))
        return np.floor(s) if quantize else s

    frag_score.squash = squashed


def forced(fraction: float, whole: bool) -> None:
    """Prices from the LP that must place ``fraction`` of the big shares (> 500 milli; and of
    the whole GPUs with ``whole``): kallot never refuses a pod it can place, so the LP's
    marginal (refused) size is another one than the 810 the free LP refuses."""

    def values(demand: Any) -> np.ndarray:
        total = sum(s * n for s, n in demand.items() if n > 0)
        gpus = 1000.0
        scaled = {s: n * gpus * MILLI / total for s, n in demand.items() if n > 0}
        low = {s: fraction * n for s, n in scaled.items() if s > 500 and (whole or s < MILLI)}
        lp = packing.ConfigLP(scaled, gpus).solve(scaled, low)
        u = lp.worth.copy()
        if MILLI in lp.share:
            u[MILLI] = max(u[MILLI], MILLI - lp.share[MILLI])
        return np.arange(MILLI + 1, dtype=np.float64) - u

    packing.lp_tail_values = values


def one(args: tuple[str, int, str]) -> float:
    path, seed, variant = args
    _restore()
    kind, _, value = variant.partition(":")
    if kind in ("cw", "tw", "sq", "lv"):
        scale, levels = 1000.0, 100.0
        for part in variant.split("/"):
            key, _, weight = part.partition(":")
            if key == "cw":
                SCORE_GLOBALS["CPU_WEIGHT"] = float(weight)
            elif key == "tw":
                SCORE_GLOBALS["TAIL_WEIGHTS"]["lp"] = float(weight)
            elif key == "sq":
                scale = float(weight)
            else:  # lv:Q
                levels = float(weight)
        squash(scale, levels)
    elif kind in ("force", "forcew"):
        forced(float(value), kind == "forcew")
    elif kind == "order":
        tie_by_node(value)
    elif kind == "ss":
        sum_of_squares(float(value))
    elif kind == "pattern":
        pattern(float(value))
    elif variant in ("tie:loaded", "tie:emptiest"):
        tie_by_load(1.0 if value == "loaded" else -1.0)
    elif kind == "tie":
        tie_order(1 if value == "fresh" else int(value.removeprefix("every")))
    elif kind not in ("base", "cov"):
        raise SystemExit(
            f"--variants: got {variant!r}, expected base, ss:W, pattern:B, tie:..., order:..., "
            "cw:W, tw:W, sq:S, lv:Q, force:F, forcew:F or cov:C"
        )
    coverage = float(value) if kind == "cov" else openb.COVERAGE
    name, nodes, pods = load(path)
    return openb.run(
        nodes, pods, policy="kallot", seed=seed, workload=name, coverage=coverage
    ).unallocated_at(100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--openb", default=os.environ.get("KALLOT_OPENB_DIR", "../shared/data/openb"))
    ap.add_argument("--workload", default="gpushare40", help="a name, or a pod list CSV path")
    ap.add_argument("--seeds", default="42..45")
    ap.add_argument("--variants", default="base,ss:0.5,pattern:300,tie:fresh")
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    path = a.workload
    if not path.endswith(".csv"):
        path = os.path.join(a.openb, f"openb_pod_list_{a.workload}.csv")
    seeds = parse_seeds(a.seeds)
    print(f"{a.workload}, seeds {a.seeds}: mean unallocated % at arrived = 100%")
    base = None
    with ProcessPoolExecutor(a.jobs) as pool:
        for variant in a.variants.split(","):
            got = list(pool.map(one, [(path, s, variant) for s in seeds]))
            mean = float(np.mean(got))
            base = mean if variant == "base" and base is None else base
            vs = f"  {mean - base:+.3f} vs base" if base is not None and variant != "base" else ""
            print(f"  {variant:<14} {mean:.3f}{vs}  ({' '.join(f'{v:.2f}' for v in got)})")


if __name__ == "__main__":
    main()
