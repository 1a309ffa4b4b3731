"""Session actions for tenant queues: allocate in fair-share order, reclaim, preempt, report.

``queue_actions(tree)`` is the ordered list a Scheduler runs: ``QueueAllocate`` places pending
work (a gang as one unit) picking at each step the queue with the lowest dominant share, level by
level, and within a queue by priority; it lends idle capacity (a queue may go past its
entitlement up to its hard limit). ``Reclaim`` takes borrowed capacity back for a queue below
its share; ``Preempt`` evicts lower-priority work of the same queue. Both propose evictions,
try them as what-ifs in the Statement and keep them only if the preemptor then fits and every
quota rule still holds. ``RejectRemaining`` reports what is still pending. ``StaticQuotaAllocate``
is the baseline: FIFO with static quotas (Kubernetes ResourceQuota), no borrowing, no eviction.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar

import numpy as np

from kallot.core import gang
from kallot.core.actions import Action
from kallot.core.actions.preempt import Preempt
from kallot.core.actions.queue_session import (
    QueueState,
    Unit,
    bad_queue,
    place_with_quota,
    queue_state,
    try_unit,
    unit_key,
)
from kallot.core.actions.reclaim import Reclaim
from kallot.core.decision import Placement
from kallot.core.plugins.quota import Quota
from kallot.core.queueing import fair_share
from kallot.core.queueing.queue_tree import QueueTree
from kallot.core.queueing.victims import MAX_MIN_RUNTIME_S
from kallot.core.session.session import Session
from kallot.core.status import Diagnosis
from kallot.core.workload import Task


def queue_actions(
    tree: QueueTree, *, max_attempts: int = 64, max_min_runtime_s: float = MAX_MIN_RUNTIME_S
) -> tuple[Action, ...]:
    """The ordered actions of a queue-aware session (``max_attempts``: disruptive what-ifs per
    action and session, which bounds a session's time when much is pending;
    ``max_min_runtime_s``: the longest a pod's min-runtime shields it from them). They share
    one Quota plugin for the tree."""
    quota = Quota(tree)
    return (
        QueueAllocate(tree, quota),
        Reclaim(tree, max_attempts, quota, max_min_runtime_s),
        Preempt(tree, max_attempts, quota, max_min_runtime_s),
        RejectRemaining(tree, quota),
    )


class QueueAllocate:
    """Places pending work in hierarchical dominant-resource-fair order (module docstring)."""

    name: ClassVar[str] = "queue-allocate"

    def __init__(self, tree: QueueTree, quota: Quota | None = None) -> None:
        self.tree = tree
        self.quota = quota or Quota(tree)

    def execute(self, session: Session, pending: Sequence[Task]) -> None:
        st = queue_state(session, self.tree, self.quota)
        by_leaf: dict[int, deque[Unit]] = {}
        for unit in gang.pending_units(pending, session.jobs):
            leaf = st.leaf(unit[0])
            if leaf is None:
                for task in unit:
                    session.reject(task, bad_queue(st, task))
                continue
            by_leaf.setdefault(leaf, deque()).append(unit)
        while by_leaf:
            leaf = self._pick(st, by_leaf)
            unit = by_leaf[leaf].popleft()
            if not by_leaf[leaf]:
                del by_leaf[leaf]
            diag = try_unit(session, st, leaf, unit, self._placer(session, st, leaf))
            if diag is not None:
                st.failed[unit_key(unit)] = (unit, diag, leaf)

    @staticmethod
    def _placer(
        session: Session, st: QueueState, leaf: int
    ) -> Callable[[Task], Placement | Diagnosis]:
        def place(task: Task) -> Placement | Diagnosis:
            return place_with_quota(session, st, leaf, task)

        return place

    def _pick(self, st: QueueState, by_leaf: Mapping[int, deque[Unit]]) -> int:
        """Descend from the top: at each level, among children with pending work, those below
        a guarantee first, then the lowest dominant share (usage over entitlement), then the
        higher queue priority; remaining ties to the first-declared queue."""
        tree = self.tree
        active: set[int] = set()
        for leaf in by_leaf:
            active.update(tree.path[leaf])
        level: Sequence[int] = tree.top
        while True:
            options = [q for q in level if q in active]
            usage = st.ledger.usage[options]
            share = fair_share.dominant_share(tree, usage, st.entitlement[options])
            # Queues still below a guarantee go first, so work placed in this session never
            # takes what a guarantee needs (reclaim only evicts work that was already running).
            guar = tree.guaranteed[options]
            satisfied = ~np.any((guar > 0) & (usage < guar), axis=1)
            prio = np.array([-tree.queues[q].priority for q in options], dtype=np.int64)
            best = options[int(np.lexsort((prio, share, satisfied))[0])]
            if tree.leaf[best]:
                return best
            level = tree.children[best]


class RejectRemaining:
    """Reports every unit still failed after the disruptive actions, with its first reason."""

    name: ClassVar[str] = "reject-remaining"

    def __init__(self, tree: QueueTree, quota: Quota | None = None) -> None:
        self.tree = tree
        self.quota = quota or Quota(tree)

    def execute(self, session: Session, pending: Sequence[Task]) -> None:
        del pending
        st = queue_state(session, self.tree, self.quota)
        for unit, diag, _leaf in st.failed.values():
            for task in unit:
                session.reject(task, diag)
        st.failed.clear()


class StaticQuotaAllocate:
    """Baseline: first come, first served, each queue capped at its guarantee on the resources
    it names (what a Kubernetes ResourceQuota does); no borrowing, no eviction.

    Caps are the Quota plugin's static quotas (``plugins.quota.static_quota``). Gangs are still
    placed whole (as the coscheduling plugin would), so the comparison is about quotas and
    order, not about partial gangs."""

    name: ClassVar[str] = "static-quota-allocate"

    def __init__(self, tree: QueueTree, quota: Quota | None = None) -> None:
        self.tree = tree
        self.quota = quota or Quota(tree)

    @staticmethod
    def _placer(
        session: Session, st: QueueState, leaf: int
    ) -> Callable[[Task], Placement | Diagnosis]:
        def place(task: Task) -> Placement | Diagnosis:
            return place_with_quota(session, st, leaf, task, capped=True)

        return place

    def execute(self, session: Session, pending: Sequence[Task]) -> None:
        st = queue_state(session, self.tree, self.quota)
        fifo = sorted(pending, key=lambda t: (t.created, t.id))
        for unit in gang.pending_units(fifo, session.jobs):
            leaf = st.leaf(unit[0])
            if leaf is None:
                for task in unit:
                    session.reject(task, bad_queue(st, task))
                continue
            diag = try_unit(session, st, leaf, unit, self._placer(session, st, leaf), capped=True)
            if diag is not None:
                for task in unit:
                    session.reject(task, diag)


_a: type[Action] = QueueAllocate
_r: type[Action] = RejectRemaining
_s: type[Action] = StaticQuotaAllocate
