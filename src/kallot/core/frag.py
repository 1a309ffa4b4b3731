"""GPU fragmentation: the measure of the FGD paper (Weng et al., USENIX ATC '23), vectorized.

Where it sits: the FGD and kallot score plugins rank nodes by how a placement changes the
expected fragment; the simulator reports the cluster's fragmentation after every placement with
the same functions, so the policy and the report can never disagree.

Model. A ``TargetWorkload`` is a set of typical task shapes with probabilities. For one node and
one shape ``t`` the fragment ``F_n(t)`` is the idle milli-GPU the shape cannot use: all of it
when the shape cannot fit on the node at all (too few usable GPUs with enough room, or too
little CPU), otherwise only the GPUs too small for it (and GPUs of a model it may not use).
CPU-only shapes count every idle GPU (they can only strand GPUs). ``F_n = sum_t p_t F_n(t)``.

The arrays are kept per node as sufficient statistics (``NodeFragStats``: per shape, the number
of usable GPUs with room and the idle milli on the others) so the effect of a hypothetical
placement on any node is a few vector operations, without rebuilding the node.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import NDArray

from kallot.core.resources import MILLI, SharingMode
from kallot.core.snapshot import Scratch, Snapshot
from kallot.core.workload import Task

I64 = NDArray[np.int64]
F64 = NDArray[np.float64]
BOOL = NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class Shape:
    """What fragmentation looks at in a task: CPU, per-GPU milli, GPU count, allowed models."""

    cpu_milli: int
    gpu_milli: int  # per GPU; 0 for a CPU-only task
    gpu_count: int
    models: frozenset[str] = frozenset()

    @staticmethod
    def of(task: Task) -> Shape:
        req = task.gpu
        if req is None or req.count == 0:
            return Shape(task.cpu_milli, 0, 0)
        return Shape(task.cpu_milli, req.milli, req.count, req.models)

    def sort_key(self) -> tuple[int, int, int, str]:
        """FGD's PodResource.Less order: cpu, gpu milli, gpu count, model list."""
        return (self.cpu_milli, self.gpu_milli, self.gpu_count, "|".join(sorted(self.models)))


@dataclass(frozen=True, slots=True, kw_only=True)
class TargetWorkload:
    """Typical task shapes ``[T]`` and their probabilities (``weight`` sums to 1).

    ``gpu_demand``: GPUs asked for at each per-GPU milli (1000: whole GPUs), summed over every
    task the target was learned from (``typical``), before the shapes were cut at the coverage.
    The cut keeps popular (CPU, GPU) shapes, so it over-weights the sizes whose tasks share a
    few CPU requests and drops rare sizes; the packing LP (``helpers.kallot_frag``) prices this
    demand instead. Empty for a target given as shapes (``of``): the shapes are the demand.
    """

    shapes: tuple[Shape, ...]
    weight: F64
    gpu_demand: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        if len(self.shapes) != self.weight.size:
            raise ValueError(
                f"TargetWorkload: {len(self.shapes)} shapes but {self.weight.size} weights"
            )
        if self.shapes and not np.isclose(self.weight.sum(), 1.0):
            raise ValueError(f"TargetWorkload.weight: sums to {self.weight.sum()}, expected 1")

    @property
    def size(self) -> int:
        return len(self.shapes)

    @staticmethod
    def of(shapes: Iterable[tuple[Shape, float]]) -> TargetWorkload:
        """From (shape, count or probability) pairs; weights are normalized to sum to 1."""
        pairs = [(s, float(w)) for s, w in shapes if w > 0]
        total = sum(w for _, w in pairs)
        weight = np.array([w / total for _, w in pairs] if total else [], dtype=np.float64)
        weight.flags.writeable = False
        return TargetWorkload(shapes=tuple(s for s, _ in pairs), weight=weight)

    @staticmethod
    def typical(
        tasks: Iterable[Task], *, coverage: float = 0.95, gpu_weighted: bool = False
    ) -> TargetWorkload:
        """The most popular shapes covering at least ``coverage`` of the tasks (FGD's
        GetTypicalPods with podPopularityThreshold 95, increase step 1).

        Shapes are sorted by count, descending; equal counts by FGD's order, descending. With
        ``gpu_weighted`` each task counts ``1 + total GPUs`` for whole-GPU shapes instead of 1
        (FGD's GpuResWeight = 1), so rare multi-GPU shapes make it into the target.
        """
        counts: dict[Shape, float] = {}
        demand: dict[int, float] = {}
        for task in tasks:
            shape = Shape.of(task)
            w = 1.0
            if gpu_weighted and shape.gpu_milli >= MILLI:
                w = 1.0 + shape.gpu_count
            counts[shape] = counts.get(shape, 0.0) + w
            if shape.gpu_milli > 0:  # the shapes FragInputs counts as asking for GPUs
                size = min(shape.gpu_milli, MILLI)
                demand[size] = demand.get(size, 0.0) + max(shape.gpu_count, 1)
        ranked = sorted(counts.items(), key=lambda kv: (kv[1], kv[0].sort_key()), reverse=True)
        total = sum(counts.values())
        kept: list[tuple[Shape, float]] = []
        covered = 0.0
        for shape, count in ranked:
            if covered >= coverage * total:
                break
            kept.append((shape, count))
            covered += count
        target = TargetWorkload.of(kept)
        return replace(target, gpu_demand=tuple(sorted(demand.items())))


@dataclass(frozen=True, slots=True)
class FragInputs:
    """The target workload laid out against one snapshot's model codes.

    ``access[m, t]``: shape t may use GPUs of snapshot model code m. ``gpu_shape[t]``: t asks
    for GPUs. Built once per session (``FragInputs.build``).
    """

    target: TargetWorkload
    cpu: I64  # [T]
    milli: I64  # [T]
    count: I64  # [T]
    gpu_shape: BOOL  # [T]
    access: BOOL  # [M + 1, T]; the last row is the padding code -1 (no access)
    weight: F64  # [T]

    @staticmethod
    def build(target: TargetWorkload, models: Sequence[str]) -> FragInputs:
        t = target.size
        access = np.zeros((len(models) + 1, t), dtype=np.bool_)
        for j, shape in enumerate(target.shapes):
            for m, name in enumerate(models):
                access[m, j] = not shape.models or name in shape.models
        return FragInputs(
            target=target,
            cpu=np.array([s.cpu_milli for s in target.shapes], dtype=np.int64),
            milli=np.array([s.gpu_milli for s in target.shapes], dtype=np.int64),
            count=np.array([s.gpu_count for s in target.shapes], dtype=np.int64),
            gpu_shape=np.array([s.gpu_milli > 0 for s in target.shapes], dtype=np.bool_),
            access=access,
            weight=target.weight,
        )


@dataclass(slots=True)
class NodeFragStats:
    """Sufficient statistics of ``F_n`` for a set of node rows (``[k]`` / ``[k, T]``).

    ``fit_count[i, t]``: usable GPUs of row i with at least shape t's milli free;
    ``stranded[i, t]``: idle milli on the other GPUs; ``idle[i]``: idle milli of the row;
    ``cpu_left[i]``; ``frag[i]``: ``F_n`` (milli-GPU, expected over the target workload).
    """

    fit_count: I64
    stranded: I64
    idle: I64
    cpu_left: I64
    frag: F64


def usable(inputs: FragInputs, model: NDArray[np.int32], ok: BOOL) -> BOOL:
    """``[k, G, T]``: GPU g of row i may serve shape t (model allowed, and ``ok``: valid,
    healthy, in a mode that serves openb-style shares)."""
    return inputs.access[model] & ok[:, :, None]


def stats(inputs: FragInputs, left: I64, cpu_left: I64, use: BOOL) -> NodeFragStats:
    """Statistics for rows with free milli ``left [k, G]`` (0 on padding) and ``cpu_left [k]``;
    ``use`` is ``usable(...)`` for the same rows."""
    ge = use & (left[:, :, None] >= inputs.milli[None, None, :])
    fit_count = ge.sum(axis=1, dtype=np.int64)
    stranded = np.where(ge, 0, left[:, :, None]).sum(axis=1, dtype=np.int64)
    idle = left.sum(axis=1, dtype=np.int64)
    frag = fragment(inputs, fit_count, stranded, idle, cpu_left)
    return NodeFragStats(fit_count, stranded, idle, cpu_left.copy(), frag)


def fragment(inputs: FragInputs, fit_count: I64, stranded: I64, idle: I64, cpu_left: I64) -> F64:
    """``F_n`` from statistics; works on any leading shape (``[k, T]`` stats, ``[k]`` idle/cpu,
    or ``[k, G, T]`` / ``[k, G]`` for hypothetical placements, ``cpu_left`` then ``[k, 1]``)."""
    fits = inputs.gpu_shape & (fit_count >= inputs.count) & (cpu_left[..., None] >= inputs.cpu)
    per_shape = np.where(fits, stranded, idle[..., None])
    # An elementwise product summed along the last axis, not a matrix product: BLAS splits a
    # gemv's sums differently for different row counts and positions, so the same node could
    # get a fragment a few ulps apart when scored alone or in a batch, and a quantized score can
    # flip on that. Scores must not depend on which other nodes are scored with them.
    return np.asarray((per_shape * inputs.weight).sum(axis=-1), dtype=np.float64)


def after_share(
    inputs: FragInputs,
    st: NodeFragStats,
    left: I64,
    use: BOOL,
    *,
    milli: int,
    cpu: int,
) -> F64:
    """``[k, G]``: ``F_n`` after putting a ``milli`` share (and ``cpu``) on GPU g of row i.

    Only GPU g changes, so each shape's statistics move by GPU g's old and new contribution.
    Entries for GPUs that cannot take the share are meaningless (callers mask them).
    """
    m = inputs.milli[None, None, :]
    old = left[:, :, None]
    new = old - milli
    ge_old = use & (old >= m)
    ge_new = use & (new >= m)
    fit_count = st.fit_count[:, None, :] - ge_old + ge_new
    stranded = (
        st.stranded[:, None, :] - np.where(ge_old, 0, old) + np.where(ge_new, 0, np.maximum(new, 0))
    )
    idle = st.idle[:, None] - milli
    # [k, 1]: fragment's CPU test broadcasts it over the GPUs (no [k, G] copy needed)
    cpu_left = (st.cpu_left - cpu)[:, None]
    return fragment(inputs, fit_count, stranded, idle, cpu_left)


def after_share_at(
    inputs: FragInputs,
    st: NodeFragStats,
    left: I64,
    use: BOOL,
    *,
    row: NDArray[np.intp],
    gpu: NDArray[np.intp],
    milli: int,
    cpu: int,
) -> F64:
    """``after_share(...)[row, gpu]``: the same arithmetic on the given (row, GPU) pairs only
    (the GPUs that can take the share), so a call does not pay for GPUs the share cannot use."""
    m = inputs.milli[None, :]
    old = left[row, gpu][:, None]
    new = old - milli
    u = use[row, gpu]
    ge_old = u & (old >= m)
    ge_new = u & (new >= m)
    fit_count = st.fit_count[row] - ge_old + ge_new
    stranded = st.stranded[row] - np.where(ge_old, 0, old) + np.where(ge_new, 0, np.maximum(new, 0))
    idle = st.idle[row] - milli
    return fragment(inputs, fit_count, stranded, idle, st.cpu_left[row] - cpu)


def after_take(
    inputs: FragInputs,
    st: NodeFragStats,
    left: I64,
    use: BOOL,
    *,
    take: I64,
    cpu: int,
) -> F64:
    """``[k]``: ``F_n`` after taking ``take [k, G]`` milli from the rows' GPUs (and ``cpu``)."""
    m = inputs.milli[None, None, :]
    old = left[:, :, None]
    new = old - take[:, :, None]
    ge_old = use & (old >= m)
    ge_new = use & (new >= m)
    fit_count = st.fit_count - ge_old.sum(axis=1) + ge_new.sum(axis=1)
    stranded = (
        st.stranded
        - np.where(ge_old, 0, old).sum(axis=1)
        + np.where(ge_new, 0, np.maximum(new, 0)).sum(axis=1)
    )
    idle = st.idle - take.sum(axis=1)
    return fragment(inputs, fit_count, stranded, idle, st.cpu_left - cpu)


def after_take_one(
    inputs: FragInputs,
    st: NodeFragStats,
    left: I64,
    use: BOOL,
    *,
    slot: NDArray[np.intp],
    take: I64,
    cpu: int,
) -> F64:
    """``after_take`` when each row gives ``take [k]`` milli from one GPU, ``slot [k]``
    (0 milli: the row takes nothing): the same integers, computed on that GPU alone. Only that
    GPU's terms change, and the other GPUs' old and new terms cancel exactly as long as no
    ``left`` is negative (a negative ``left`` counts as 0 once taken from: callers check)."""
    k = np.arange(slot.size)
    m = inputs.milli[None, :]
    old = left[k, slot][:, None]
    new = old - take[:, None]
    u = use[k, slot]
    ge_old = u & (old >= m)
    ge_new = u & (new >= m)
    fit_count = st.fit_count - ge_old + ge_new
    stranded = st.stranded - np.where(ge_old, 0, old) + np.where(ge_new, 0, np.maximum(new, 0))
    return fragment(inputs, fit_count, stranded, st.idle - take, st.cpu_left - cpu)


# Below this many stale rows the grouping costs more than it saves, and when more than this
# share of the rows are distinct it saves too little.
DISTINCT_MIN_ROWS = 64
DISTINCT_MAX_SHARE = 0.5


def _group(key: I64) -> tuple[NDArray[np.intp], NDArray[np.intp]] | None:
    """``(first, inverse)`` of the distinct rows of ``key [k, C]`` (``key == key[first][inverse]``),
    or None if two different rows share a hash. Rows are hashed to one uint64 (a fixed odd
    multiplier per column, wrapping), so grouping sorts ``k`` integers instead of ``k`` rows
    (``np.unique(axis=0)`` costs ~0.1 s on 10,000 nodes); the check makes it exact."""
    cols = key.shape[1]
    mult = _MULTIPLIERS[:cols] if cols <= _MULTIPLIERS.size else None
    if mult is None:
        return None
    h = (key.astype(np.uint64) * mult[None, :]).sum(axis=1, dtype=np.uint64)
    _, first, inverse = np.unique(h, return_index=True, return_inverse=True)
    inverse = np.asarray(inverse, dtype=np.intp).reshape(-1)
    if not np.array_equal(key, key[first[inverse]]):
        return None  # a hash collision: no grouping, never a wrong one
    return np.asarray(first, dtype=np.intp), inverse


# Odd 64-bit multipliers (splitmix64 outputs), one per key column; enough for 16 GPUs a node.
_MULTIPLIERS = (
    (np.arange(1, 73, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)) | np.uint64(1)
).astype(np.uint64)


def _static_class(snapshot: Snapshot) -> I64:
    """``[N]``: nodes with the same class have identical static GPU arrays and CPU capacity
    (memoized on the snapshot: the arrays do not change within a session); -1 for every node
    if the classes could not be told apart (a hash collision)."""
    found = snapshot.memo.get(("frag", "static_class"))
    if found is None:
        s = snapshot
        parts = [
            s.gpu_cap_milli,
            s.gpu_cap_mem,
            s.gpu_mem_mib,
            s.gpu_max_clients,
            s.gpu_model,
            s.gpu_mode,
            s.gpu_healthy,
            s.gpu_valid,
            s.node_cpu_milli[:, None],
        ]
        key = np.concatenate([np.asarray(p, np.int64) for p in parts], axis=1)
        groups = _group(key)
        if groups is None:
            found = np.full(s.n_nodes, -1, dtype=np.int64)
        else:
            found = np.asarray(groups[0][groups[1]], dtype=np.int64)  # class = first member
        found.setflags(write=False)
        s.memo[("frag", "static_class")] = found
    return np.asarray(found, dtype=np.int64)


def distinct_rows(
    snapshot: Snapshot, scratch: Scratch, rows: NDArray[np.intp]
) -> tuple[NDArray[np.intp], NDArray[np.intp]] | None:
    """``(reps, inverse)`` with ``rows == reps[inverse]`` up to node identity: ``reps`` holds
    one row per distinct node *state* among ``rows`` (static GPU arrays, CPU capacity, and the
    scratch's GPU use, memory, clients and CPU use), ``inverse[i]`` the representative of
    ``rows[i]``. Everything the FGD-family scores compute for a node is a function of that
    state, so scoring ``reps`` and indexing by ``inverse`` gives the same numbers as scoring
    ``rows``: a new task shape on a cluster of many identical nodes (an empty 10,000-node
    cluster has a handful of node kinds) pays per kind, not per node. None when ``rows`` is too
    small or too varied for the grouping to pay."""
    if rows.size < DISTINCT_MIN_ROWS:
        return None
    static = _static_class(snapshot)
    if static.size and static[0] < 0:
        return None
    x = scratch
    key = np.concatenate(
        [
            static[rows, None],
            x.gpu_used_milli[rows],
            x.gpu_used_mem[rows],
            np.asarray(x.gpu_clients[rows], np.int64),
            x.node_cpu_used[rows, None],
        ],
        axis=1,
    )
    groups = _group(key)
    if groups is None or groups[0].size > DISTINCT_MAX_SHARE * rows.size:
        return None  # mostly distinct: grouping would not pay
    first, inverse = groups
    return np.asarray(rows[first], dtype=np.intp), inverse


def cluster_fragment(inputs: FragInputs, left: I64, cpu_left: I64, use: BOOL) -> tuple[float, int]:
    """(fragment amount, idle milli) summed over all rows: the paper's cluster report."""
    st = stats(inputs, left, cpu_left, use)
    return float(st.frag.sum()), int(st.idle.sum())


class FragView:
    """``F_n`` of every node of one session's snapshot, kept current as the session places tasks.

    Rows are refreshed lazily: ``refresh(scratch, rows)`` recomputes only the rows touched since
    they were last computed (``Scratch.changed_since`` marks them dirty: one row per placement),
    so asking for all nodes after every placement costs O(changed rows), not O(N).

    GPUs count when valid, healthy and not in MIG mode (MIG capacity is instance slots, not
    milli-GPU; ``core.mig`` measures it).
    """

    def __init__(self, snapshot: Snapshot, target: TargetWorkload) -> None:
        self.inputs = FragInputs.build(target, snapshot.models)
        self.ok: BOOL = (
            snapshot.gpu_valid & snapshot.gpu_healthy & (snapshot.gpu_mode != SharingMode.MIG)
        )
        self.use: BOOL = usable(self.inputs, snapshot.gpu_model, self.ok)
        n, t = snapshot.n_nodes, target.size
        self._snapshot = snapshot
        self.dirty = np.ones(n, dtype=np.bool_)  # rows not current as of ``mark``
        self.mark = 0
        self.fit_count = np.zeros((n, t), dtype=np.int64)
        self.stranded = np.zeros((n, t), dtype=np.int64)
        self.idle = np.zeros(n, dtype=np.int64)
        self.cpu_left = np.zeros(n, dtype=np.int64)
        self.frag = np.zeros(n, dtype=np.float64)
        # ``left`` of each row as of its refresh: the scores read it for the rows they just
        # refreshed (one gather instead of recomputing it from the scratch).
        self.free = np.zeros((n, snapshot.max_gpus), dtype=np.int64)

    def left(self, scratch: Scratch, rows: NDArray[np.intp]) -> I64:
        """``[k, G]`` free milli of the rows' GPUs that count (0 elsewhere)."""
        s = self._snapshot
        free = s.gpu_cap_milli[rows] - scratch.gpu_used_milli[rows]
        return np.where(self.ok[rows], free, 0)

    def cpu(self, scratch: Scratch, rows: NDArray[np.intp]) -> I64:
        return np.asarray(self._snapshot.node_cpu_milli[rows] - scratch.node_cpu_used[rows])

    def refresh(self, scratch: Scratch, rows: NDArray[np.intp] | None = None) -> None:
        """Bring ``rows`` (default: all) up to date with ``scratch``."""
        self._refresh(scratch, rows)

    def _refresh(
        self, scratch: Scratch, rows: NDArray[np.intp] | None
    ) -> tuple[NodeFragStats, I64, BOOL] | None:
        """``refresh``; returns ``(stats, left, use)`` of the rows it recomputed when that was
        every row asked for (in order), else None."""
        if self.mark != scratch.mark:
            self.dirty[scratch.changed_since(self.mark)] = True
            self.mark = scratch.mark
        if rows is None:
            rows = np.arange(self.dirty.size, dtype=np.intp)
        stale = rows[self.dirty[rows]]
        if stale.size == 0:
            return None
        left = self.left(scratch, stale)
        use = self.use[stale]
        st = stats(self.inputs, left, self.cpu(scratch, stale), use)
        self.free[stale] = left
        self.fit_count[stale] = st.fit_count
        self.stranded[stale] = st.stranded
        self.idle[stale] = st.idle
        self.cpu_left[stale] = st.cpu_left
        self.frag[stale] = st.frag
        self.dirty[stale] = False
        return (st, left, use) if stale.size == rows.size else None

    def current(self, scratch: Scratch, rows: NDArray[np.intp]) -> tuple[NodeFragStats, I64, BOOL]:
        """``refresh(rows)`` then ``(of(rows), free[rows], use[rows])``: when every row was
        stale, the arrays just computed (the same numbers, without gathering them back)."""
        fresh = self._refresh(scratch, rows)
        if fresh is not None:
            return fresh
        return self.of(rows), self.free[rows], self.use[rows]

    def of(self, rows: NDArray[np.intp]) -> NodeFragStats:
        """Current statistics of ``rows`` (call ``refresh`` first)."""
        return NodeFragStats(
            self.fit_count[rows],
            self.stranded[rows],
            self.idle[rows],
            self.cpu_left[rows],
            self.frag[rows],
        )
