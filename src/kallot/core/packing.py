"""Prices of GPU shares from the packing LP of a target workload (pure computation, no I/O).

Where it sits: ``helpers.kallot_frag`` asks for ``lp_tail_values`` once per target workload
(cached) and scores each share placement by it; nothing else calls this module.

The question is the one the openb metric asks at arrived = 100%: if the target workload's GPU
requests, in its proportions, add up to exactly the cluster's GPU capacity, how are they best
packed into GPUs of 1000 milli? That is the *configuration LP* (Gilmore and Gomory's cutting
stock LP), with GPUs as the stock and the share sizes as the items:

    max  sum_p milli(p) * x_p
    s.t. sum_p x_p <= gpus                        (price mu)
         sum_p count(s, p) * x_p <= n_s  per size s   (price pi_s)
         x_p >= 0

over *patterns* ``p`` (multisets of share sizes that fit in one GPU; whole GPUs are their own
pattern and size 1000). Its dual gives each size a price ``pi_s``: the milli-GPU the optimum
loses per share of size ``s`` taken away, i.e. what ``s`` is worth *elsewhere*. A share is worth
``r_s = s - pi_s`` to the GPU that hosts it, and a GPU with ``l`` milli free is worth

    U(l) = max over multisets of sizes that fit in l of sum r_s      (an unbounded knapsack)

with ``U(1000) = mu`` at the optimum. Placing a share ``s`` on a GPU with ``l`` free changes the
GPU's worth by ``r_s + U(l - s) - U(l) <= 0``; placements that belong to an optimal packing lose
nothing, the others lose exactly what they cost the packing. ``lp_tail_values`` returns
``V(l) = l - U(l)``, the milli a GPU with ``l`` free is expected to leave idle when packed at
those prices, in the same units as the learned ``V`` it replaces.

The patterns are generated, not enumerated (small sizes make the enumeration explode): start
from one homogeneous pattern per size, solve, price a new pattern with the knapsack above, add
it while it improves the LP (``U(1000) > mu``). HiGHS solves the LPs (``highspy``, pinned).
Deterministic for a given target.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from kallot.core.resources import MILLI

F64 = NDArray[np.float64]

# Column generation stops when no pattern improves the LP by more than this (milli per GPU).
TOLERANCE = 1e-6
MAX_PATTERNS = 2000


@dataclass(frozen=True)
class Prices:
    """The packing LP's dual: ``gpu`` (mu, what an idle GPU is worth) and ``share[s]`` (pi_s,
    what a share of size ``s`` is worth elsewhere); ``worth[l]`` (U(l), what a GPU with ``l``
    free is worth at those prices, shares only); ``patterns`` the LP's columns at the end;
    ``allocated`` the LP optimum (milli)."""

    gpu: float
    share: Mapping[int, float]
    worth: F64
    patterns: tuple[tuple[int, ...], ...]
    allocated: float


def knapsack(values: Mapping[int, float]) -> tuple[F64, NDArray[np.int64]]:
    """``U[l]`` for ``l = 0..1000``: the most ``sum values[s]`` over multisets of sizes ``s``
    (0 < s < 1000) that fit in ``l``; and ``last[l]``, the size added last on the way to
    ``U[l]`` (0 when ``U[l] = U[l - 1]`` or nothing fits), to rebuild the multiset."""
    sizes = np.array(sorted(s for s, v in values.items() if 0 < s < MILLI and v > 0), np.int64)
    worth = np.array([values[int(s)] for s in sizes], dtype=np.float64)
    u = np.zeros(MILLI + 1, dtype=np.float64)
    last = np.zeros(MILLI + 1, dtype=np.int64)
    for level in range(1, MILLI + 1):
        u[level], last[level] = u[level - 1], 0
        fit = sizes <= level
        if fit.any():
            cand = u[level - sizes[fit]] + worth[fit]
            k = int(np.argmax(cand))
            if cand[k] > u[level] + TOLERANCE:
                u[level], last[level] = cand[k], sizes[fit][k]
    return u, last


def _pattern(last: NDArray[np.int64], level: int) -> tuple[int, ...]:
    out: list[int] = []
    while level > 0:
        if last[level] == 0:
            level -= 1
        else:
            out.append(int(last[level]))
            level -= int(last[level])
    return tuple(sorted(out))


class ConfigLP:
    """The configuration LP over generated patterns, one HiGHS model kept across solves.

    ``max sum_p milli(p) * x_p`` subject to ``sum_p x_p <= gpus`` (row 0) and, per share size
    ``s`` (``s = 1000``: whole GPUs, a k-GPU pod counting k), ``at_least[s] <= sum_p count(s, p)
    * x_p <= available[s]``. Columns start as one homogeneous pattern per size and are added by
    the knapsack pricing of the module docstring until none improves the LP. Two users:

    - ``prices`` (kallot's score): the target's demand as upper bounds, no lower bounds; the
      duals price the share sizes.
    - the bounds of ``kallot.sim.bounds`` and ``bench/openb_bounds.py``: a real placement is a
      feasible point, so the optimum bounds from above the milli-GPU that any placement of the
      arrived requests holds; lower bounds (``at_least``: what a policy placed) ask for the best
      packing that places at least those. ``solve`` only changes row bounds between calls, so
      a solve after a few more arrivals is a warm start that keeps every column found so far.

    Lower bounds are met through a slack column per size that costs ``BIG_M`` per share: phase
    one and two in one model. A real placement makes them feasible, so no slack is left at the
    optimum (``solve`` raises if one is).
    """

    BIG_M = 10.0 * MILLI

    def __init__(self, sizes: Iterable[int], gpus: float) -> None:
        if gpus <= 0:
            raise ValueError(f"gpus: {gpus}, expected > 0")
        self.sizes = sorted(set(sizes))
        bad = [s for s in self.sizes if not 0 < s <= MILLI]
        if bad:
            raise ValueError(f"sizes: {bad}, expected sizes in 1..1000")
        self._row = {s: i + 1 for i, s in enumerate(self.sizes)}  # row 0: the GPU count
        # Imported here: the live scheduler's start-up (whose policies import this module)
        # reaches its first bind without an LP on most clusters; HiGHS is 0.015 s of CPU.
        import highspy

        self._highspy = highspy
        self._inf: float = highspy.kHighsInf
        h = highspy.Highs()  # type: ignore[no-untyped-call]  # highspy 1.15 leaves __init__ untyped
        h.setOptionValue("output_flag", False)
        h.changeObjectiveSense(highspy.ObjSense.kMaximize)
        inf = self._inf
        h.addRow(-inf, float(gpus), 0, np.array([], np.int32), np.array([], np.float64))
        for _ in self.sizes:
            h.addRow(-inf, 0.0, 0, np.array([], np.int32), np.array([], np.float64))
        self._h = h
        self._slack: dict[int, int] = {}  # size -> column of its slack, added on first need
        self._cols = 0
        self.patterns: dict[tuple[int, ...], None] = {}  # the LP's columns, in the order added
        for s in self.sizes:
            self._add((s,) * (MILLI // s))

    def _add(self, p: tuple[int, ...]) -> None:
        counts: dict[int, int] = {}
        for s in p:
            counts[s] = counts.get(s, 0) + 1
        idx = np.array([0, *(self._row[s] for s in counts)], dtype=np.int32)
        val = np.array([1.0, *(float(c) for c in counts.values())], dtype=np.float64)
        self._h.addCol(float(sum(p)), 0.0, self._inf, idx.size, idx, val)
        self.patterns[p] = None
        self._cols += 1

    def _add_slack(self, s: int) -> None:
        idx = np.array([self._row[s]], dtype=np.int32)
        self._h.addCol(-self.BIG_M, 0.0, self._inf, 1, idx, np.array([1.0]))
        self._slack[s] = self._cols
        self._cols += 1

    # Extra rows and columns for variants of the LP (``kallot.sim.bounds.ResourceLP`` adds CPU
    # and memory): the patterns' rows stay as they are, so the column generation prices the
    # patterns exactly as above and only the share rows' duals carry the extra constraints.
    def size_row(self, size: int) -> int:
        """The row of share size ``size`` (``sum_p count(size, p) * x_p``)."""
        return self._row[size]

    def add_row(self, upper: float) -> int:
        """A new row ``<= upper`` with no entries yet; returns its index."""
        self._h.addRow(
            -self._inf, float(upper), 0, np.array([], np.int32), np.array([], np.float64)
        )
        return int(self._h.getNumRow()) - 1

    def set_row_upper(self, row: int, upper: float) -> None:
        self._h.changeRowBounds(row, -self._inf, float(upper))

    def add_column(self, entries: Mapping[int, float], upper: float) -> int:
        """A column with objective 0, bounds ``[0, upper]`` and ``entries`` (row -> coefficient);
        returns its index."""
        idx = np.array(list(entries), dtype=np.int32)
        val = np.array([float(v) for v in entries.values()], dtype=np.float64)
        self._h.addCol(0.0, 0.0, float(upper), idx.size, idx, val)
        self._cols += 1
        return self._cols - 1

    def set_column_upper(self, col: int, upper: float) -> None:
        self._h.changeColBounds(col, 0.0, float(upper))

    def solve(
        self,
        available: Mapping[int, float],
        at_least: Mapping[int, float] | None = None,
        *,
        clamp: bool = False,
    ) -> Prices:
        """The optimum for ``available[s]`` requests of each size (and at least ``at_least[s]``
        of them placed). ``clamp``: report negative duals as 0 (``prices``: without lower
        bounds every dual is >= 0 up to HiGHS's rounding)."""
        unknown = {s for s in (*available, *(at_least or {})) if s not in self._row}
        if unknown:
            raise ValueError(f"sizes: {sorted(unknown)}, expected one of {self.sizes}")
        low = at_least or {}
        for s, r in self._row.items():
            lo = float(low.get(s, 0))
            hi = float(available.get(s, 0))
            if lo > hi:
                raise ValueError(f"at_least[{s}]: {lo}, expected <= available[{s}] = {hi}")
            if lo > 0 and s not in self._slack:
                self._add_slack(s)
            self._h.changeRowBounds(r, lo if lo > 0 else -self._inf, hi)
        h = self._h
        while True:
            h.run()
            status = h.getModelStatus()
            if status != self._highspy.HighsModelStatus.kOptimal:
                raise RuntimeError(f"packing LP: {h.modelStatusToString(status)}")
            # Prices of <= rows in a maximisation are >= 0 (HiGHS reports them so); a row held
            # at its lower bound has a price <= 0, a bonus for the patterns that hold its size.
            dual = np.asarray(h.getSolution().row_dual, dtype=np.float64)
            mu = float(dual[0])
            pi = {s: float(dual[r]) for s, r in self._row.items()}
            if clamp:
                mu = max(0.0, mu)
                pi = {s: max(0.0, v) for s, v in pi.items()}
            worth = {s: s - pi[s] for s in self.sizes if s < MILLI}
            u, last = knapsack(worth)
            if u[MILLI] <= mu + TOLERANCE or len(self.patterns) >= MAX_PATTERNS:
                break
            # The best pattern, and the best one around each share size that improves the LP:
            # one knapsack, many columns, so a target with many sizes needs few rounds.
            new = {_pattern(last, MILLI)}
            for s, gain in worth.items():
                if gain > 0 and gain + u[MILLI - s] > mu + TOLERANCE:
                    new.add(tuple(sorted((s, *_pattern(last, MILLI - s)))))
            new -= self.patterns.keys()
            if not new:  # degenerate: the LP already has them, nothing to gain
                break
            for p in sorted(new):
                self._add(p)
        if self._slack:
            x = h.getSolution().col_value
            short = {s: float(x[c]) for s, c in self._slack.items() if x[c] > TOLERANCE}
            if short:
                raise RuntimeError(f"packing LP: at_least not packable into the GPUs: {short}")
        return Prices(
            gpu=mu,
            share=pi,
            worth=u,
            patterns=tuple(self.patterns),
            allocated=float(h.getInfo().objective_function_value),
        )

    def max_allocated(
        self, available: Mapping[int, float], at_least: Mapping[int, float] | None = None
    ) -> float:
        """The LP optimum (milli): an upper bound on what any placement of ``available``
        requests (placing at least ``at_least``) can have allocated."""
        return self.solve(available, at_least).allocated


def prices(demand: Mapping[int, float], gpus: float) -> Prices:
    """Solve the packing LP (module docstring) for ``demand[s]`` shares of each size ``s``
    (milli per GPU; ``s = 1000`` counts whole GPUs) and ``gpus`` GPUs."""
    if gpus <= 0:
        raise ValueError(f"gpus: {gpus}, expected > 0")
    bad = {s: n for s, n in demand.items() if not 0 < s <= MILLI or n < 0}
    if bad:
        raise ValueError(f"demand: {bad}, expected sizes in 1..1000 and counts >= 0")
    wanted = {s: n for s, n in demand.items() if n > 0}
    return ConfigLP(wanted, gpus).solve(wanted, clamp=True)


def lp_tail_values(demand: Mapping[int, float]) -> F64:
    """``V[l] = l - U(l)`` for ``l = 0..1000`` (module docstring) for a target whose GPU
    requests are ``demand[s]`` (relative counts per size, 1000 = a whole GPU), scaled so they
    add up to the capacity of the GPUs they are packed into."""
    total = sum(s * n for s, n in demand.items() if n > 0)
    levels = np.arange(MILLI + 1, dtype=np.float64)
    if total <= 0 or not any(0 < s < MILLI and n > 0 for s, n in demand.items()):
        return levels  # no shares to price: every idle milli of a share's GPU stays idle
    gpus = 1000.0
    scaled = {s: n * gpus * MILLI / total for s, n in demand.items() if n > 0}
    lp = prices(scaled, gpus)
    u = lp.worth.copy()
    whole = lp.share.get(MILLI)
    if whole is not None:
        u[MILLI] = max(u[MILLI], MILLI - whole)
    return np.asarray(levels - u, dtype=np.float64)
