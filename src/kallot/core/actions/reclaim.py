"""``Reclaim``: take back capacity other queues borrowed, for a queue below its share.

Where it sits: the actions layer, after queue allocate and before preempt
(``core.actions.queue.queue_actions``); the evict-and-place loop is ``preempt.Disruptive``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from kallot.core.actions import Action
from kallot.core.actions.preempt import Disruptive
from kallot.core.actions.queue_session import QueueState, Unit
from kallot.core.session.session import Session
from kallot.core.snapshot import Allocation
from kallot.core.workload import Task

I64 = NDArray[np.int64]


class Reclaim(Disruptive):
    """Takes back capacity other queues borrowed, for a queue below its share.

    A queue may reclaim while, after placing, it holds no more than max(entitlement,
    guaranteed) on the resources it asks for, at every level below where it meets the victim.
    A victim's queues (up to that meeting point) must be over their entitlement on a resource
    the victim holds, or, when the reclaimer's queues at those levels stay within their
    guarantees, over their own guarantee (a guarantee outranks another queue's over-quota
    share); and they are never pushed below a guarantee they are at or above.
    """

    name: ClassVar[str] = "reclaim"
    reason: ClassVar[str] = "reclaim"
    # A borrowed GPU comes back even from a model's last replica: the replica's model name is
    # the tenant's own word (a distinct one on every pod would keep every borrowed GPU).
    keeps_last_replica: ClassVar[bool] = False

    @staticmethod
    def _axes(st: QueueState) -> NDArray[np.bool_]:
        # Reclaim enforces what quotas guarantee: the resources some queue is guaranteed (else
        # the fairness resources). An axis nobody is guaranteed (GPU memory when quotas are in
        # GPUs, a model named only by a hard limit) is split by weight only, and holding "too
        # much" of it must not block taking a guaranteed GPU back; hard limits are checked on
        # every placement anyway.
        tree = st.tree
        guaranteed = np.asarray((tree.guaranteed > 0).any(axis=0), dtype=np.bool_)
        return guaranteed if guaranteed.any() else tree.fair_axes

    def _share_cap(self, st: QueueState, q: int) -> I64:
        cap: I64 = np.maximum(st.entitlement[q], st.tree.guaranteed[q])
        return cap

    def may_try(self, st: QueueState, leaf: int, unit: Unit) -> bool:
        need = sum((st.charger.estimate(t) for t in unit), st.charger.zeros())
        after = st.ledger.usage[leaf] + need
        axes = self._axes(st)
        return bool(np.all(~axes | (need <= 0) | (after <= self._share_cap(st, leaf))))

    def accept(self, st: QueueState, leaf: int, unit: Unit, members: Sequence[Allocation]) -> bool:
        tree, usage = st.tree, st.ledger.usage
        need = sum((st.charger.estimate(t) for t in unit), st.charger.zeros())
        per_leaf: dict[int, I64] = {}
        for alloc in members:
            w = st.leaf(alloc.task)
            if w is None or w == leaf:
                return False
            per_leaf[w] = per_leaf.get(w, st.charger.zeros()) + st.charger.placed(
                alloc.task, alloc.node_row, alloc.devices
            )
        axes = self._axes(st)
        for w, charge in per_leaf.items():
            ch = np.where(axes, charge, 0)
            lca = tree.lca(leaf, w)
            owed = all(
                np.all(~axes | (need <= 0) | (usage[r] + need <= tree.guaranteed[r]))
                for r in tree.below(leaf, lca)
            )
            for a in tree.below(w, lca):
                bar = tree.guaranteed[a] if owed else st.entitlement[a]
                borrowing = np.any((ch > 0) & (usage[a] > bar))
                g = tree.guaranteed[a]
                into_guarantee = np.any((ch > 0) & (usage[a] >= g) & (usage[a] - ch < g))
                if not borrowing or into_guarantee:
                    return False
        return True

    def unshielded(self, session: Session, st: QueueState) -> frozenset[str]:
        """Do-not-disrupt pods beyond their queue's guarantee: such a pod is placed only within
        the guarantee (``queue_session``), but the annotation is the tenant's to add after the
        bind (and kallot's own model-server guard adds it too), so a pod that borrowed could
        otherwise keep a lent GPU forever. Per leaf queue the oldest do-not-disrupt pods keep
        their shield up to the guarantee; the younger ones beyond it are reclaimable."""
        tree, charger, axes = st.tree, st.charger, self._axes(st)
        by_leaf: dict[int, list[Allocation]] = {}
        for alloc in session.snapshot.running:
            if alloc.task.do_not_disrupt and (w := st.leaf(alloc.task)) is not None:
                by_leaf.setdefault(w, []).append(alloc)
        out: set[str] = set()
        for w, allocs in by_leaf.items():
            held = charger.zeros()
            for alloc in sorted(allocs, key=lambda a: (a.started, a.task.id)):
                charge = np.where(
                    axes, charger.placed(alloc.task, alloc.node_row, alloc.devices), 0
                )
                held = held + charge
                if np.any((charge > 0) & (held > tree.guaranteed[w])):
                    out.add(alloc.task.id)
        return frozenset(out)

    def fits_cap(self, st: QueueState, leaf: int, task: Task, node: int) -> bool:
        req = task.gpu
        if req is None or req.count == 0:
            return True
        s = st.charger.snapshot
        models = {s.models[int(c)] for c in s.gpu_model[node][s.gpu_valid[node]]}
        if req.models:
            models &= set(req.models)
        if not models:
            return False
        on_node = replace(task, gpu=replace(req, models=frozenset(models)))
        after = st.ledger.usage[leaf] + st.charger.estimate(on_node)
        axes = self._axes(st)
        return bool(np.all(~axes | (after <= self._share_cap(st, leaf))))

    def holds(self, st: QueueState, before: I64, leaf: int, victim_leaves: set[int]) -> bool:
        tree, usage = st.tree, st.ledger.usage
        axes = self._axes(st)
        gained = np.where(axes, usage[leaf] - before[leaf], 0)
        for w in victim_leaves:
            lca = tree.lca(leaf, w)
            for a in tree.below(leaf, lca):
                cap = self._share_cap(st, a)
                if np.any((gained > 0) & (usage[a] > cap)):
                    return False
            for a in tree.below(w, lca):
                g = tree.guaranteed[a]
                if np.any(axes & (before[a] >= g) & (usage[a] < g)):
                    return False
        return True


_: type[Action] = Reclaim
