"""How close a policy's openb run packs the pods it placed: the bound columns of ``sim openb``.

Where it sits: ``kallot sim openb --bounds`` (``cli.sim_openb``) calls ``run_bounds`` on each
finished ``openb.Run``; ``bench/openb_bounds.py`` adds the other references. The LP is the
core's configuration LP (``core.packing.ConfigLP``, the same column generation kallot's score
prices shares with).

At arrived = 100% the unallocated % is the idle %, so the question is how well the arrived GPU
requests pack into GPUs of 1000 milli. Ignoring CPU, memory, node boundaries and GPU models:

- ``lp_pct``: the best packing of any subset of the arrived requests; no policy, online or
  offline, leaves less idle.
- ``lp_given_placed_pct``: the best packing that places at least as many requests of every size
  as the policy had placed by that event. The policy minus it is what the policy's *packing*
  lost; it minus the target is what only placing a different mix of pods could win (design
  note 002, section 4; issue 23 restates the share-heavy target this way).

Both are taken at every event of the metric's window (rounded arrival = 100%) and averaged the
way ``openb.Run.unallocated_at(100)`` averages, so they compare directly with it.

``ResourceLP`` is the same LP with the cluster's CPU and memory (issue 23, the CPU-heavy family,
``bench/cpu_heavy_bounds.py``): it bounds what any placement of the arrived GPU pods can hold
when the CPU and memory some CPU-only pods took are not available to them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from kallot.core.packing import ConfigLP
from kallot.core.resources import MILLI
from kallot.sim import openb
from kallot.sim.trace import PodRow


@dataclass(frozen=True, slots=True)
class Bounds:
    lp_pct: float
    lp_given_placed_pct: float


# A GPU pod as the resource LP sees it: (milli per GPU, GPUs, milli-CPU, MiB).
PodClass = tuple[int, int, int, int]


class ResourceLP:
    """The configuration LP (``core.packing.ConfigLP``) with CPU and memory, over the cluster
    taken as one node: how much milli-GPU can any placement of the arrived GPU pods hold if
    they have the cluster's CPU and memory, less what is ``taken`` (by CPU-only pods)?

        max  sum_p milli(p) * x_p
        s.t. sum_p x_p <= gpus
             sum_p count(s, p) * x_p <= sum_{k of size s} gpus(k) * y_k   per share size s
             sum_k cpu(k) * y_k <= cpu - cpu taken,  sum_k mem(k) * y_k <= mem - mem taken
             0 <= y_k <= arrived pods of class k,  x_p >= 0

    ``y_k`` is how many pods of class ``k`` (``PodClass``) are placed; the patterns ``x_p`` pack
    their GPUs. A real placement gives a feasible point (its pods as ``y``, its GPUs as
    patterns), so the optimum bounds from above the milli-GPU any placement holds: node
    boundaries, GPU models and a k-GPU pod's need for k GPUs on one node are relaxed, and any
    pod may be left out (the bound also covers policies that refuse pods).
    """

    def __init__(self, classes: Sequence[PodClass], gpus: float, cpu: float, mem: float) -> None:
        bad = [k for k in classes if not (0 < k[0] <= MILLI and k[1] >= 1) or k[2] < 0 or k[3] < 0]
        if bad:
            raise ValueError(f"classes: {bad}, expected (milli 1..1000, gpus >= 1, cpu, mem >= 0)")
        self._lp = ConfigLP({k[0] for k in classes} or {MILLI}, gpus)
        self._cpu, self._mem = float(cpu), float(mem)
        self._cpu_row = self._lp.add_row(cpu)
        self._mem_row = self._lp.add_row(mem)
        self._col: dict[PodClass, int] = {}
        for k in dict.fromkeys(classes):
            size, count, c, m = k
            entries = {self._lp.size_row(size): -float(count)}
            entries[self._cpu_row] = float(c)
            entries[self._mem_row] = float(m)
            self._col[k] = self._lp.add_column(entries, 0.0)

    def max_allocated(
        self, arrived: Mapping[PodClass, float], cpu_taken: float = 0.0, mem_taken: float = 0.0
    ) -> float:
        """The LP optimum (milli) for ``arrived[k]`` pods of each class."""
        unknown = [k for k in arrived if k not in self._col]
        if unknown:
            raise ValueError(f"arrived: {unknown[:3]}, expected classes given to ResourceLP")
        for k, col in self._col.items():
            self._lp.set_column_upper(col, arrived.get(k, 0.0))
        self._lp.set_row_upper(self._cpu_row, max(0.0, self._cpu - cpu_taken))
        self._lp.set_row_upper(self._mem_row, max(0.0, self._mem - mem_taken))
        return self._lp.max_allocated({})


def window(pct: NDArray[np.int64]) -> NDArray[np.intp]:
    """Indices of the events ``Run.unallocated_at(100)`` averages over, from the rounded
    arrived % after each event (``Run.arrived_pct``); empty if 100% is never reached."""
    hit = pct == 100
    if not hit.any():
        hit = np.abs(pct - 100) <= 1
    return np.flatnonzero(hit)


def run_bounds(run: openb.Run, pods: Sequence[PodRow]) -> Bounds:
    """The bounds for ``run`` (made from ``pods`` with ``run.seed``; the arrival order is drawn
    again from the seed, as ``openb.run`` drew it)."""
    order = openb.arrival_order(pods, run.capacity_milli, np.random.default_rng(run.seed))
    if len(order) != run.attempts:
        raise ValueError(
            f"run: {run.attempts} events, expected {len(order)} (the pods' arrival order)"
        )
    events = window(run.arrived_pct())
    if events.size == 0:
        return Bounds(float("nan"), float("nan"))
    sizes = {min(p.gpu_milli, MILLI) for p in order if p.num_gpu}
    lp = ConfigLP(sizes or {MILLI}, run.capacity_milli / MILLI)
    arrived: Counter[int] = Counter()
    placed: Counter[int] = Counter()
    free: list[float] = []
    given: list[float] = []
    inside = set(events.tolist())
    for i, pod in enumerate(order[: int(events[-1]) + 1]):
        if pod.num_gpu:
            size = min(pod.gpu_milli, MILLI)
            arrived[size] += pod.num_gpu
            if run.placed[i]:
                placed[size] += pod.num_gpu
        if i in inside:
            cap = run.capacity_milli
            free.append(100.0 * (cap - lp.max_allocated(arrived)) / cap)
            given.append(100.0 * (cap - lp.max_allocated(arrived, placed)) / cap)
    return Bounds(float(np.mean(free)), float(np.mean(given)))
