"""FGD's score and GPU choice, fragmentation gradient descent (Weng et al., USENIX ATC '23): the
machinery the FGD plugin (``plugins.fgd``) is, and kallot's score (``helpers.kallot_frag``)
builds on.

A node's score is how much the placement lowers the node's expected fragment ``F_n`` (see
``core.frag``), squashed and truncated exactly as the authors' simulator does:
``int(100 * sigmoid((F_n - F_n') / 1000))``. A GPU share tries every GPU that can take it and
keeps the best (lowest index on ties); whole GPUs take the lowest-index idle GPUs.

Scores depend only on the node's own state, so they are cached per task shape and recomputed
only for the candidates that changed since they were last scored: the nodes touched since the
shape was last scored (``Scratch.changed_since``, O(changes)) are marked dirty, and a call
recomputes the dirty candidates (a bool gather over the candidates, not a version compare).
Dirty nodes that are not candidates wait: on a full cluster most touched nodes no longer fit
the big shapes, and scoring them anyway doubled the rows scored on openb.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from kallot.core import fit, frag
from kallot.core.framework.cycle import PENDING, SLOT_FIT, Cycle, StateKey
from kallot.core.framework.plugin import MAX_SCORE
from kallot.core.workload import DeviceRequest, Task

I64 = NDArray[np.int64]
F64 = NDArray[np.float64]


def target_of(cycle: Cycle, configured: frag.TargetWorkload | None) -> frag.TargetWorkload:
    """The configured target workload, or one learned from what the session sees: the running
    tasks of the snapshot plus the pending ones (what a live scheduler knows of its workload)."""
    if configured is not None and configured.size:
        return configured
    tasks = [a.task for a in cycle.snapshot.running] + list(cycle.session.get(PENDING) or [])
    learned = frag.TargetWorkload.typical(tasks)
    if learned.size == 0:  # nothing known yet: every idle GPU is worth the same
        learned = frag.TargetWorkload.of([(frag.Shape(0, 1000, 1), 1.0)])
    return learned


@dataclass(slots=True)
class ShapeScores:
    """Cached per-node results for one task shape: score, chosen GPU (shares), and ``dirty``:
    rows not current, given every touch up to ``mark`` (``Scratch.mark``)."""

    score: F64
    gpu: I64
    dirty: NDArray[np.bool_]
    mark: int = 0

    @staticmethod
    def empty(n: int) -> ShapeScores:
        return ShapeScores(
            score=np.zeros(n, dtype=np.float64),
            gpu=np.full(n, -1, dtype=np.int64),
            dirty=np.ones(n, dtype=np.bool_),
        )


def stale_rows(cycle: Cycle, entry: ShapeScores, candidates: NDArray[np.intp]) -> NDArray[np.intp]:
    """The candidates whose cached score is not current (marks the touched rows dirty)."""
    x = cycle.scratch
    if entry.mark != x.mark:
        entry.dirty[x.changed_since(entry.mark)] = True
        entry.mark = x.mark
    return np.asarray(candidates[entry.dirty[candidates]], dtype=np.intp)


def _slot_fit(cycle: Cycle, req: DeviceRequest, rows: NDArray[np.intp]) -> NDArray[np.bool_]:
    """``fit.slot_fit_rows``: from the DeviceFit filter's mask of this cycle when it ran (the
    same rule, current: nothing changed since the filters), else computed."""
    slots = cycle.state.get(SLOT_FIT)
    if slots is not None:
        return slots[rows]
    return fit.slot_fit_rows(cycle.snapshot, cycle.scratch, req, rows)


def frag_deltas(
    cycle: Cycle, view: frag.FragView, task: Task, rows: NDArray[np.intp]
) -> tuple[F64, NDArray[np.bool_] | None]:
    """``F_n - F_n'`` for placing ``task`` on ``rows``.

    Shares: ``[k, G]`` (one column per GPU, with the [k, G] mask of GPUs that can take it;
    entries of the other GPUs are 0 and mean nothing); anything else: ``[k]`` with None (whole GPUs on the lowest-index idle slots).
    """
    delta, slots, _, _ = frag_deltas_stats(cycle, view, task, rows)
    return delta, slots


def frag_deltas_stats(
    cycle: Cycle, view: frag.FragView, task: Task, rows: NDArray[np.intp]
) -> tuple[F64, NDArray[np.bool_] | None, frag.NodeFragStats, I64]:
    """``frag_deltas`` with the rows' current statistics and free milli ``[k, G]`` it read
    (kallot's terms reuse them instead of gathering or recomputing them)."""
    st, left, use = view.current(cycle.scratch, rows)
    req = task.gpu
    if req is not None and req.count == 1 and req.is_fractional:
        slots = _slot_fit(cycle, req, rows)
        # Only the GPUs that can take the share (the others' entries are meaningless: every
        # caller masks them with ``slots``; they are 0 here).
        row, gpu = slots.nonzero()
        after = frag.after_share_at(
            view.inputs, st, left, use, row=row, gpu=gpu, milli=req.milli, cpu=task.cpu_milli
        )
        delta = np.zeros(slots.shape, dtype=np.float64)
        delta[row, gpu] = st.frag[row] - after
        return delta, slots, st, left
    take = np.zeros_like(left)
    if req is not None and req.count == 1 and bool((left >= 0).all()):
        # One whole GPU: the lowest fitting slot (none: nothing taken), computed on it alone.
        slots = _slot_fit(cycle, req, rows)
        slot = np.argmax(slots, axis=1)
        k = np.arange(rows.size)
        one = np.where(slots[k, slot], left[k, slot], 0)
        after = frag.after_take_one(
            view.inputs, st, left, use, slot=slot, take=one, cpu=task.cpu_milli
        )
        return st.frag - after, None, st, left
    if req is not None and req.count > 0:
        slots = _slot_fit(cycle, req, rows)
        chosen = slots & (np.cumsum(slots, axis=1) <= req.count)
        take = np.where(chosen, left, 0)
    after = frag.after_take(view.inputs, st, left, use, take=take, cpu=task.cpu_milli)
    return st.frag - after, None, st, left


def squash(delta: F64, quantize: bool) -> F64:
    """FGD's ``int(100 * sigmoid(delta / 1000))`` (or its float version)."""
    s = MAX_SCORE / (1.0 + np.exp(-delta / 1000.0))
    return np.floor(s) if quantize else s


class FragScore:
    """FGD's node score and GPU choice: ``target`` (a TargetWorkload; learned from the running
    and pending tasks when absent), ``quantize`` (default true, as the paper). Session caches
    are keyed by ``name`` (the plugin that uses it)."""

    name: ClassVar[str] = "FGD"

    def __init__(self, target: frag.TargetWorkload | None = None, *, quantize: bool = True) -> None:
        self._target = target
        self._quantize = quantize
        self._view_key: StateKey[frag.FragView] = StateKey(f"{self.name}/view")
        self._cache_key: StateKey[dict[frag.Shape, ShapeScores]] = StateKey(f"{self.name}/cache")
        # The task's entry, kept for the cycle: ``choose`` on the chosen node finds it again.
        self._cycle_key: StateKey[tuple[Task, ShapeScores]] = StateKey(f"{self.name}/entry")

    def view(self, cycle: Cycle) -> frag.FragView:
        view = cycle.session.get(self._view_key)
        if view is None:
            view = frag.FragView(cycle.snapshot, target_of(cycle, self._target))
            cycle.session.put(self._view_key, view)
        return view

    def _entry(self, cycle: Cycle, task: Task) -> ShapeScores:
        found = cycle.state.get(self._cycle_key)
        if found is not None and found[0] is task:
            return found[1]
        cache = cycle.session.get(self._cache_key)
        if cache is None:
            cache = {}
            cycle.session.put(self._cache_key, cache)
        shape = frag.Shape.of(task)
        entry = cache.get(shape)
        if entry is None:
            entry = cache[shape] = ShapeScores.empty(cycle.snapshot.n_nodes)
        cycle.state.put(self._cycle_key, (task, entry))
        return entry

    def deltas(
        self, cycle: Cycle, task: Task, rows: NDArray[np.intp]
    ) -> tuple[F64, NDArray[np.bool_] | None]:
        """The gradient ``score`` squashes (``frag_deltas``); kallot's score adds its terms."""
        return frag_deltas(cycle, self.view(cycle), task, rows)

    def grouped_deltas(
        self, cycle: Cycle, task: Task, rows: NDArray[np.intp]
    ) -> tuple[F64, NDArray[np.bool_] | None]:
        """``deltas(rows)``, computed once per distinct node state among ``rows``
        (``frag.distinct_rows``): the same numbers, for a fraction of the work when many of the
        rows are alike (a new task shape on a large, young cluster)."""
        groups = frag.distinct_rows(cycle.snapshot, cycle.scratch, rows)
        if groups is None:
            return self.deltas(cycle, task, rows)
        reps, inverse = groups
        delta, slots = self.deltas(cycle, task, reps)
        return delta[inverse], None if slots is None else slots[inverse]

    def score(self, cycle: Cycle, task: Task, candidates: NDArray[np.intp]) -> F64:
        entry = self._entry(cycle, task)
        rows = stale_rows(cycle, entry, candidates)
        if rows.size:
            delta, slots = self.grouped_deltas(cycle, task, rows)
            scores = squash(delta, self._quantize)
            if slots is None:
                entry.score[rows] = scores
            else:
                scores = np.where(slots, scores, -1.0)
                best = np.argmax(scores, axis=1)  # first maximum: lowest index on ties
                entry.score[rows] = scores[np.arange(rows.size), best]
                entry.gpu[rows] = best
            entry.dirty[rows] = False  # only once stored: a fault above leaves them dirty
        return entry.score[candidates]

    def choose(
        self, cycle: Cycle, task: Task, node: int, feasible: NDArray[np.intp]
    ) -> tuple[int, ...] | None:
        req = task.gpu
        if req is None or not (req.count == 1 and req.is_fractional):
            return None
        entry = self._entry(cycle, task)
        if entry.mark != cycle.scratch.mark or entry.dirty[node]:
            self.score(cycle, task, np.array([node], dtype=np.intp))
        gpu = int(entry.gpu[node])
        return (gpu,) if gpu in feasible else None
