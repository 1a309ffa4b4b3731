"""``Preempt``: within one leaf queue, evict lower-priority work for higher-priority pending work;
and ``Disruptive``, the evict-and-place loop it shares with ``Reclaim``.

Where it sits: the actions layer, after queue allocate (``core.actions.queue.queue_actions``).
Victims are proposed by ``core.queueing.victims``, tried as what-ifs in the Statement and kept
only if the preemptor then fits and every quota rule still holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from kallot.core.actions import Action
from kallot.core.actions.queue_session import (
    QueueState,
    Unit,
    needed,
    place_with_quota,
    queue_state,
)
from kallot.core.decision import Eviction, Placement
from kallot.core.gang import GANG
from kallot.core.plugins.quota import Quota
from kallot.core.queueing import victims
from kallot.core.queueing.queue_tree import QueueTree
from kallot.core.session.session import Session
from kallot.core.snapshot import Allocation
from kallot.core.status import Diagnosis
from kallot.core.workload import Task, TopologyMode

I64 = NDArray[np.int64]

MAX_PLANS_TRIED = 3  # what-ifs per preemptor task: the cheapest plans, in cost order


def needs_domain(session: Session, unit: Unit) -> bool:
    """A gang that must sit in one topology domain: the disruptive what-ifs place members one by
    one on the nodes their victims free, which cannot promise a domain, so they leave it pending
    (it is retried by QueueAllocate next session, once its own queue's capacity is free)."""
    job = session.jobs.get(unit[0].job) if unit[0].job else None
    return job is not None and job.topology.mode is TopologyMode.REQUIRED


class Disruptive:
    """Shared loop of Reclaim and Preempt: for each failed unit, evict-and-place what-ifs."""

    name: ClassVar[str] = "disruptive"
    reason: ClassVar[str] = ""
    # A model's last replica is no victim (core.queueing.model_servers); Reclaim, which only
    # takes borrowed capacity, says False.
    keeps_last_replica: ClassVar[bool] = True

    def __init__(
        self,
        tree: QueueTree,
        max_attempts: int = 64,
        quota: Quota | None = None,
        max_min_runtime_s: float = victims.MAX_MIN_RUNTIME_S,
    ) -> None:
        self.tree = tree
        self.max_attempts = max_attempts
        self.quota = quota or Quota(tree)
        self.max_min_runtime_s = max_min_runtime_s

    def execute(self, session: Session, pending: Sequence[Task]) -> None:
        del pending
        st = queue_state(session, self.tree, self.quota)
        attempts = 0
        for key, (unit, _diag, leaf) in list(st.failed.items()):
            if attempts >= self.max_attempts:
                break
            if needs_domain(session, unit) or not self.may_try(st, leaf, unit):
                continue
            attempts += 1
            if self._evict_and_place(session, st, leaf, unit):
                del st.failed[key]

    def may_try(self, st: QueueState, leaf: int, unit: Unit) -> bool:
        raise NotImplementedError

    def accept(self, st: QueueState, leaf: int, unit: Unit, members: Sequence[Allocation]) -> bool:
        raise NotImplementedError

    def fits_cap(self, st: QueueState, leaf: int, task: Task, node: int) -> bool:
        """Whether ``task`` placed on ``node`` would likely pass ``holds`` (plans that would
        are tried first: a guarantee in value units is used up faster on a dearer GPU)."""
        del st, leaf, task, node
        return True

    def holds(self, st: QueueState, before: I64, leaf: int, victim_leaves: set[int]) -> bool:
        """Quota rules that must still hold after a what-if (hard limits are always checked)."""
        del st, before, leaf, victim_leaves
        return True

    def unshielded(self, session: Session, st: QueueState) -> frozenset[str]:
        """Do-not-disrupt tasks this action may take anyway (none; Reclaim overrides)."""
        del session, st
        return frozenset()

    def _evict_and_place(self, session: Session, st: QueueState, leaf: int, unit: Unit) -> bool:
        statement, ledger = session.statement, st.ledger
        cp = statement.checkpoint()
        before = ledger.usage.copy()
        victim_leaves: set[int] = set()
        placed = 0
        for task in unit:
            result = place_with_quota(session, st, leaf, task)
            if isinstance(result, Placement):
                placed += 1
                continue
            if self._one(session, st, leaf, unit, task, before=before, victim_leaves=victim_leaves):
                placed += 1
        if placed >= needed(session, unit):
            if placed < len(unit):
                done = {p.task_id for p in statement.placements()}
                for task in unit:
                    if task.id not in done:
                        session.reject(task, Diagnosis.of(GANG, "did not fit"))
            return True
        statement.rollback(cp)  # the ledger follows the Statement's log
        return False

    def _one(
        self,
        session: Session,
        st: QueueState,
        leaf: int,
        unit: Unit,
        task: Task,
        *,
        before: I64,
        victim_leaves: set[int],
    ) -> bool:
        s, statement, ledger = session.snapshot, session.statement, st.ledger
        evicted = {e.task_id for e in statement.evictions()}
        running = [a for a in s.running if a.task.id not in evicted]
        candidates = victims.units(
            running,
            session.jobs,
            session.now,
            lambda m: self.accept(st, leaf, unit, m),
            self.max_min_runtime_s,
            keep_last_replica=self.keeps_last_replica,
            unshielded=self.unshielded(session, st),
        )
        if not candidates:
            return False
        nodes = sorted({a.node_row for u in candidates for a in u.allocs})
        plans = [
            p
            for n in nodes
            if (p := victims.plan_on_node(s, session.scratch, task, n, candidates)) is not None
        ]
        plans.sort(
            key=lambda p: (
                not self.fits_cap(st, leaf, task, p.node),
                p.cost,
                int(session.tie_rank[p.node]),
            )
        )
        for plan in plans[:MAX_PLANS_TRIED]:
            cp = statement.checkpoint()
            leaves: set[int] = set()
            for vu in plan.units:
                for alloc in vu.allocs:
                    statement.evict(
                        alloc,
                        Eviction(
                            task_id=alloc.task.id,
                            node=s.node_names[alloc.node_row],
                            reason=f"{self.reason} for {task.id} ({st.tree.names[leaf]})",
                            for_task=task.id,
                        ),
                    )
                    vleaf = st.leaf(alloc.task)
                    if vleaf is not None:
                        ledger.sub(
                            vleaf, st.charger.placed(alloc.task, alloc.node_row, alloc.devices)
                        )
                        leaves.add(vleaf)
            result = place_with_quota(session, st, leaf, task, node=plan.node)
            if isinstance(result, Placement) and self.holds(
                st, before, leaf, victim_leaves | leaves
            ):
                victim_leaves |= leaves
                return True
            statement.rollback(cp)
        return False


class Preempt(Disruptive):
    """Within one leaf queue, evicts lower-priority work for higher-priority pending work."""

    name: ClassVar[str] = "preempt"
    reason: ClassVar[str] = "preempt"

    def may_try(self, st: QueueState, leaf: int, unit: Unit) -> bool:
        del st, leaf, unit
        return True

    def accept(self, st: QueueState, leaf: int, unit: Unit, members: Sequence[Allocation]) -> bool:
        priority = min(t.priority for t in unit)
        return all(st.leaf(m.task) == leaf and m.task.priority < priority for m in members)


_: type[Action] = Preempt
