"""GPU-set ranking: which ``count`` free GPUs of a node talk fastest (``rank_gpu_sets``), under
a cost that a brute-force oracle can check, and how a chosen set is described.

Where it sits: part of ``core.topology`` (the model layer); the Topology plugin and the node
agent's ``GetPreferredAllocation`` rank GPU sets with it, so both sides rank the same way.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from kallot.core.topology.links import DEFAULT_BANDWIDTHS, Bandwidths, link_name, pair_costs

I8 = NDArray[np.int8]
I32 = NDArray[np.int32]
I64 = NDArray[np.int64]
BOOL = NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class GpuSet:
    """A candidate set of GPU slots with its cost. Smaller ``key()`` is better.

    ``bottleneck``: the costliest pair (a ring all-reduce runs at its slowest link);
    ``total``: the sum over all pairs (how well the set is connected overall);
    ``cut``: the sum of costs from the set to the free GPUs left out. A larger cut means the set
    is loosely tied to what stays free, so taking it keeps the remaining free GPUs' best groups
    intact (the in-node fragmentation term).
    """

    slots: tuple[int, ...]
    bottleneck: int
    total: int
    cut: int

    def key(self) -> tuple[int, int, int, tuple[int, ...]]:
        return (self.bottleneck, self.total, -self.cut, self.slots)


@dataclass(frozen=True, slots=True)
class GpuChoice:
    """The best set, how many sets were compared, and whether the comparison was exhaustive."""

    best: GpuSet
    considered: int
    exact: bool


EXACT_LIMIT = 50_000  # compare every set when there are at most this many; greedy above


def rank_gpu_sets(
    link: I8 | Sequence[Sequence[int]],
    free: Sequence[int] | NDArray[np.integer],
    count: int,
    *,
    must_include: Sequence[int] = (),
    groups: Sequence[int] | NDArray[np.integer] | None = None,
    limit: int | None = None,
    bandwidths: Bandwidths = DEFAULT_BANDWIDTHS,
) -> list[GpuSet]:
    """Sets of ``count`` slots from ``free``, best first, under ``GpuSet.key``.

    Pure: usable without a Snapshot (the node agent's ``GetPreferredAllocation`` passes the
    link matrix from NVML, the available device indices, its ``must_include`` indices and the
    allocation size). ``groups[g]`` (optional, per slot of the node) restricts sets to one group
    (e.g. one NVLink island for a ``required`` constraint; -1 = a group of its own). Every set
    is compared when there are at most ``EXACT_LIMIT`` of them, so the first one is optimal;
    beyond that a greedy search from every seed GPU is used (not guaranteed optimal).
    Returns [] when no set exists (too few free slots, or none within one group).
    """
    codes = np.asarray(link, dtype=np.int8)
    free_slots = np.unique(np.asarray(free, dtype=np.int64))
    must = tuple(sorted({int(s) for s in must_include}))
    if count < 0:
        raise ValueError(f"count: got {count}, expected >= 0")
    if codes.ndim != 2 or codes.shape[0] != codes.shape[1]:
        raise ValueError(f"link: got shape {codes.shape}, expected a square [G, G] matrix")
    g = codes.shape[0]
    if free_slots.size and (free_slots[0] < 0 or free_slots[-1] >= g):
        raise ValueError(f"free: got slots {free_slots.tolist()}, expected indices in 0..{g - 1}")
    if not set(must) <= set(free_slots.tolist()):
        raise ValueError(f"must_include: got {list(must)}, expected a subset of free")
    if len(must) > count or count > free_slots.size:
        return []
    cost = pair_costs(codes, bandwidths)
    sets = _candidate_sets(cost, free_slots, count, must)
    if groups is not None and sets.shape[0] and count > 1:
        grp = np.asarray(groups, dtype=np.int64)[sets]
        one = (grp == grp[:, :1]).all(axis=1) & (grp[:, 0] >= 0)
        sets = sets[one]
    if sets.shape[0] == 0:
        return []
    bottleneck, total, cut = _set_costs(cost, free_slots, sets)
    order = np.lexsort((*(sets[:, i] for i in range(count - 1, -1, -1)), -cut, total, bottleneck))
    if limit is not None:
        order = order[:limit]
    return [
        GpuSet(tuple(int(s) for s in sets[i]), int(bottleneck[i]), int(total[i]), int(cut[i]))
        for i in order
    ]


def best_gpu_set(
    link: I8 | Sequence[Sequence[int]],
    free: Sequence[int] | NDArray[np.integer],
    count: int,
    *,
    must_include: Sequence[int] = (),
    groups: Sequence[int] | NDArray[np.integer] | None = None,
    bandwidths: Bandwidths = DEFAULT_BANDWIDTHS,
) -> GpuChoice | None:
    """The first set of ``rank_gpu_sets`` with how many were compared (None if there is none)."""
    ranked = rank_gpu_sets(
        link, free, count, must_include=must_include, groups=groups, bandwidths=bandwidths
    )
    if not ranked:
        return None
    n_free = len(np.unique(np.asarray(free)))
    n_must = len(set(must_include))
    exact = math.comb(n_free - n_must, count - n_must) <= EXACT_LIMIT
    return GpuChoice(best=ranked[0], considered=len(ranked), exact=exact)


def _candidate_sets(
    cost: I64, free: NDArray[np.int64], count: int, must: tuple[int, ...]
) -> NDArray[np.int64]:
    """``[M, count]`` sorted slot sets containing ``must``: all of them, or greedy ones."""
    optional = [int(s) for s in free if int(s) not in must]
    need = count - len(must)
    if need == 0:
        return np.array([must], dtype=np.int64).reshape(1, count)
    if math.comb(len(optional), need) <= EXACT_LIMIT:
        combos = np.array(list(itertools.combinations(optional, need)), dtype=np.int64)
        if must:
            combos = np.hstack(
                [np.tile(np.array(must, dtype=np.int64), (combos.shape[0], 1)), combos]
            )
        return np.sort(combos, axis=1)
    return _greedy_sets(cost, optional, need, must)


def _greedy_sets(
    cost: I64, optional: list[int], need: int, must: tuple[int, ...]
) -> NDArray[np.int64]:
    """One set per seed GPU: start from ``must`` + seed, then add the GPU whose worst and total
    cost to the set are smallest, until full. O(F^2 * count) instead of C(F, count)."""
    out: set[tuple[int, ...]] = set()
    opt = np.array(optional, dtype=np.int64)
    for seed in optional:
        chosen = [*must, seed]
        left = opt[opt != seed]
        while len(chosen) < len(must) + need:
            to_set = cost[np.ix_(left, np.array(chosen))]
            order = np.lexsort((left, to_set.sum(axis=1), to_set.max(axis=1)))
            pick = int(left[order[0]])
            chosen.append(pick)
            left = left[left != pick]
        out.add(tuple(sorted(chosen)))
    return np.array(sorted(out), dtype=np.int64)


def _set_costs(cost: I64, free: NDArray[np.int64], sets: NDArray[np.int64]) -> tuple[I64, I64, I64]:
    """(bottleneck, total, cut) per row of ``sets`` (vectorized over rows)."""
    k = sets.shape[1]
    sub = cost[sets[:, :, None], sets[:, None, :]]  # [M, k, k]
    iu = np.triu_indices(k, 1)
    pairs = sub[:, iu[0], iu[1]]  # [M, k(k-1)/2]
    if pairs.shape[1]:
        bottleneck = pairs.max(axis=1)
        total = pairs.sum(axis=1)
    else:
        bottleneck = np.zeros(sets.shape[0], dtype=np.int64)
        total = np.zeros(sets.shape[0], dtype=np.int64)
    to_free = cost[:, free].sum(axis=1)  # [G]: cost from each slot to every free slot
    cut = to_free[sets].sum(axis=1) - 2 * total
    return (
        np.asarray(bottleneck, dtype=np.int64),
        np.asarray(total, dtype=np.int64),
        np.asarray(cut, dtype=np.int64),
    )


def describe_set(
    link: I8 | Sequence[Sequence[int]],
    slots: Sequence[int],
    *,
    islands: Sequence[int] | NDArray[np.integer] | None = None,
    bandwidths: Bandwidths = DEFAULT_BANDWIDTHS,
) -> str:
    """One line on a GPU set: 'GPUs 0,1,2,3: NV18 between every pair (450 GB/s), one NVLink
    island'. Used as the Placement's reason and in the node agent's logs."""
    codes = np.asarray(link, dtype=np.int8)
    names = ",".join(str(s) for s in slots)
    if len(slots) < 2:
        return f"GPU {names}"
    pairs = [(int(a), int(b)) for a, b in itertools.combinations(slots, 2)]
    worst = min(pairs, key=lambda p: (bandwidths.of(int(codes[p])), p))  # slowest, first pair
    worst_code = int(codes[worst])
    uniform = all(int(codes[p]) == worst_code for p in pairs)
    gbps = bandwidths.of(worst_code)
    head = (
        f"{link_name(worst_code)} between every pair ({gbps:.0f} GB/s)"
        if uniform
        else f"slowest pair {worst[0]}-{worst[1]} {link_name(worst_code)} ({gbps:.0f} GB/s)"
    )
    tail = ""
    if islands is not None:
        isl = [int(islands[s]) for s in slots]
        tail = ", one NVLink island" if isl[0] >= 0 and len(set(isl)) == 1 else ""
    return f"GPUs {names}: {head}{tail}"
