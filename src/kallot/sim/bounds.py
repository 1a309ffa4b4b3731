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
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
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
