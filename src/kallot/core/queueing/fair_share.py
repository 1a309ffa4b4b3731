"""Fair-share arithmetic on a ``QueueTree``: entitlements, dominant shares, Jain's index.

``entitlement`` splits the cluster top-down, level by level: each child first gets its
guarantee (capped by what it asks for), then what is left is water-filled by over-quota weight
up to each child's demand and limit. A child's entitlement is what its own children split next.
``dominant_share`` is a queue's largest usage-to-entitlement ratio over the fairness resources:
weighted DRF with the entitlement as the weight. The design note (docs/design/007-queues.md)
works the arithmetic through.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from kallot.core.queueing.queue_tree import QueueTree

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

# Rounding slack: amounts are in milli-units, so 1e-6 of one is far below anything that counts.
_EPS = 1e-6


def water_fill(amount: F64, cap: F64, weight: F64) -> F64:
    """Share ``amount[r]`` among rows in proportion to ``weight[:, r]``, none above ``cap[:, r]``.

    Per resource column: rows rise together at rates given by their weights; a row stops at its
    cap and the others keep rising until the amount is used up or every row is capped. Rows with
    weight 0 get nothing. Returns the [K, R] shares (their column sums are <= ``amount``).
    """
    k, r = cap.shape
    out = np.zeros((k, r), dtype=np.float64)
    for c in range(r):
        left = float(amount[c])
        active = (cap[:, c] > _EPS) & (weight[:, c] > 0)
        while left > _EPS and active.any():
            w = weight[active, c]
            room = cap[active, c] - out[active, c]
            level = min(left / float(w.sum()), float((room / w).min()))
            out[active, c] += level * w
            left -= level * float(w.sum())
            active &= cap[:, c] - out[:, c] > _EPS
    return out


def aggregate_demand(tree: QueueTree, leaf_demand: F64) -> F64:
    """Demand of every queue: leaves as given, a parent the sum of its children; each capped by
    the queue's own limit (a queue never needs more than it may hold)."""
    want = np.array(leaf_demand, dtype=np.float64, copy=True)
    limit = tree.limit.astype(np.float64)
    for i in reversed(tree.topo):
        kids = tree.children[i]
        if kids:
            want[i] = want[list(kids)].sum(axis=0)
        want[i] = np.minimum(want[i], limit[i])
    return want


def _split(tree: QueueTree, avail: F64, kids: Sequence[int], want: F64) -> F64:
    rows = list(kids)
    base = np.minimum(tree.guaranteed[rows].astype(np.float64), want[rows])
    total = base.sum(axis=0)
    # Guarantees can exceed what there is (nodes lost, or top-level guarantees sold above the
    # cluster's size): then every guarantee shrinks by the same factor.
    scale = np.where(
        total > avail, np.divide(avail, total, where=total > 0, out=np.ones_like(avail)), 1.0
    )
    base = base * scale
    rest = np.maximum(avail - base.sum(axis=0), 0.0)
    extra = water_fill(rest, np.maximum(want[rows] - base, 0.0), tree.weight[rows])
    split: F64 = base + extra
    return split


def entitlement(tree: QueueTree, capacity: F64, leaf_demand: F64) -> I64:
    """[Q, R] fair share of every queue in integer units (rounded down).

    ``capacity`` is [R] (what the cluster has), ``leaf_demand`` is [Q, R] (usage plus pending
    work of each leaf queue; rows of non-leaf queues are ignored). Properties the tests check:
    children never get more than their parent; nobody gets more than its limit or its demand;
    a queue gets at least min(guaranteed, demand) whenever the guarantees at its level fit in
    what its parent got; and a child with weight 0 gets no more than its guarantee.
    """
    want = aggregate_demand(tree, leaf_demand)
    ent = np.zeros_like(want)
    ent[list(tree.top)] = _split(tree, np.asarray(capacity, dtype=np.float64), tree.top, want)
    for i in tree.topo:
        kids = tree.children[i]
        if kids:
            ent[list(kids)] = _split(tree, ent[i], kids, want)
    return np.floor(ent + _EPS).astype(np.int64)


def ratios(usage: NDArray[np.integer] | F64, ent: NDArray[np.integer] | F64) -> F64:
    """Element-wise usage / entitlement: 0 where both are 0, +inf where only the entitlement is."""
    u = np.asarray(usage, dtype=np.float64)
    e = np.asarray(ent, dtype=np.float64)
    out = np.divide(u, e, out=np.zeros_like(u), where=e > 0)
    return np.where((e <= 0) & (u > 0), np.inf, out)


def dominant_share(
    tree: QueueTree, usage: NDArray[np.integer] | F64, ent: NDArray[np.integer] | F64
) -> F64:
    """Dominant share of each row: the largest ratio over the tree's fairness resources."""
    r = ratios(usage, ent)[..., tree.fair_axes]
    if r.shape[-1] == 0:
        return np.zeros(r.shape[:-1], dtype=np.float64)
    share: F64 = r.max(axis=-1)
    return share


def jain_index(values: Sequence[float] | F64) -> float:
    """Jain's fairness index (sum x)^2 / (n * sum x^2): 1 when all equal, 1/n when one takes all."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return 1.0
    sq = float((x * x).sum())
    if sq == 0.0:
        return 1.0
    return float(x.sum() ** 2 / (x.size * sq))
