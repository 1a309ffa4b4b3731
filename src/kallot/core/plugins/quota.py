"""Quota: the tenant queues' hard limits and static quotas, at the framework's Quota extension
point (``framework.plugin.QuotaPlugin``).

Where it sits: the plugins layer. The queue actions (``core.actions.queue``) create it for the
session's QueueTree (the tree comes from Queue objects at run time, not from a profile) and call
it around every placement of queued work: ``limit`` and ``narrow`` before the framework places a
task, ``charge`` after. Per session it keeps the queues' books in the session state: what a task
costs (``Charger``) and what each queue holds (``Ledger``). The Ledger logs its undo steps in
the session's one transaction log (``Cycle.journal``, the Statement), so rolling a placement
back rolls its charge back too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from kallot.core.decision import Placement
from kallot.core.errors import InvariantViolation
from kallot.core.framework.cycle import JOBS, Cycle, StateKey
from kallot.core.framework.plugin import QuotaPlugin
from kallot.core.queueing.charge import Charger
from kallot.core.queueing.ledger import Ledger
from kallot.core.queueing.queue_tree import MODEL_PREFIX, QueueTree, canonical_resource
from kallot.core.status import Diagnosis
from kallot.core.workload import Task

I64 = NDArray[np.int64]

# The plugin name diagnoses carry (what users read in events and conditions: "Queue").
QUEUE_PLUGIN = "Queue"


@dataclass(frozen=True, slots=True)
class QuotaBooks:
    """One session's queue accounting: what a task costs and what each queue holds."""

    charger: Charger
    ledger: Ledger


BOOKS: StateKey[QuotaBooks] = StateKey("Quota/books")


def static_quota(tree: QueueTree) -> I64:
    """[Q, R] what each queue may hold without borrowing: on a resource it names with a
    guarantee, the guarantee; on one it names with only a limit (a per-model cap), the limit;
    elsewhere its limit (usually none). The static-quota baseline caps every queue here, and
    do-not-disrupt work is held here always: capacity it borrowed could never be reclaimed."""
    quota = tree.limit.copy()
    for i, queue in enumerate(tree.queues):
        for resource, claim in queue.resources.items():
            if claim.guaranteed > 0:
                c = tree.axis[canonical_resource(resource)]
                quota[i, c] = min(claim.guaranteed, int(tree.limit[i, c]))
    quota.flags.writeable = False
    return quota


class Quota:
    """Hard limits of every queue on a task's path, and (``capped``) its static quota."""

    name: ClassVar[str] = "Quota"

    def __init__(self, tree: QueueTree) -> None:
        self.tree = tree
        self.quota: I64 = static_quota(tree)

    def books(self, cycle: Cycle) -> QuotaBooks:
        """The session's books, opened on first use from the Snapshot's running work."""
        found = cycle.session.get(BOOKS)
        if found is not None:
            return found
        if cycle.journal is None:
            raise InvariantViolation("the Quota plugin accounts only inside a session")
        charger = Charger(self.tree, cycle.snapshot)
        jobs = cycle.session.get(JOBS) or {}
        ledger = Ledger(self.tree, charger, cycle.snapshot, jobs, journal=cycle.journal)
        books = QuotaBooks(charger=charger, ledger=ledger)
        cycle.session.put(BOOKS, books)
        return books

    def limit(self, cycle: Cycle, queue: int, task: Task) -> Diagnosis | None:
        books = self.books(cycle)
        estimate = books.charger.estimate(task)
        over = books.ledger.over_limit(queue, estimate)
        return None if over is None else self._diagnosis(books, over, estimate, capped=False)

    def narrow(self, cycle: Cycle, queue: int, task: Task) -> Task | Diagnosis:
        """Drop GPU models whose per-model limit is reached anywhere on the queue's path, so the
        framework places the task on a model the queue may still use (an H100 limit does not
        stop a task that may also run on a T4)."""
        req = task.gpu
        books = self.books(cycle)
        tree, s = self.tree, books.charger.snapshot
        if req is None or req.count == 0:
            return task
        need = req.count * (1000 if req.mig_profile else min(req.milli, 1000))
        blocked: set[str] = set()
        for code, model in enumerate(s.models):
            axis = int(books.charger.model_axis[code])
            if axis < 0:
                continue
            for q in tree.path[queue]:
                if books.ledger.usage[q, axis] + need > tree.limit[q, axis]:
                    blocked.add(model)
                    break
        if not blocked:
            return task
        allowed = (set(req.models) if req.models else set(s.models)) - blocked
        if not allowed:
            names = ", ".join(MODEL_PREFIX + m for m in sorted(blocked))
            return Diagnosis.of(
                QUEUE_PLUGIN, f"queue {tree.names[queue]}: hard limit reached on {names}"
            )
        return replace(task, gpu=replace(req, models=frozenset(allowed)))

    def charge(
        self,
        cycle: Cycle,
        queue: int,
        placed: Sequence[tuple[Task, Placement]],
        *,
        capped: bool,
    ) -> Diagnosis | None:
        """Charge what ``placed`` took to ``queue``, all or none: each placement is checked
        against the hard limits (and, ``capped``, the static quota) with the ones before it
        counted; the first that breaks one is the refusal, and nothing is charged."""
        books = self.books(cycle)
        charges = [books.charger.placed(t, p.node_row, p.devices) for t, p in placed]
        before = books.charger.zeros()
        for charge in charges:
            over = self._over(books, queue, charge, before, capped=capped)
            if over is not None:
                return self._diagnosis(books, over, charge, capped=capped)
            before = before + charge
        for charge in charges:
            books.ledger.add(queue, charge)
        return None

    def _over(
        self, books: QuotaBooks, leaf: int, charge: I64, before: I64, *, capped: bool
    ) -> tuple[int, int] | None:
        """(queue, axis) of the first hard limit (or, ``capped``, quota) that ``charge`` more
        would break, on top of ``before`` not yet in the books."""
        over = books.ledger.over_limit(leaf, charge, before=before)
        if over is None and capped:
            usage = books.ledger.usage
            for q in self.tree.path[leaf]:
                hit = np.flatnonzero((charge > 0) & (usage[q] + before + charge > self.quota[q]))
                if hit.size:
                    return q, int(hit[0])
        return over

    def _diagnosis(
        self, books: QuotaBooks, over: tuple[int, int], amount: I64, *, capped: bool
    ) -> Diagnosis:
        q, axis = over
        tree = self.tree
        used = int(books.ledger.usage[q, axis])
        limit = int(tree.limit[q, axis])
        kind = "hard limit"
        if capped and used + int(amount[axis]) <= limit:
            kind, limit = "quota", int(self.quota[q, axis])
        return Diagnosis.of(
            QUEUE_PLUGIN,
            f"queue {tree.names[q]}: {kind} on {tree.axes[axis]}: uses {used} + needs "
            f"{int(amount[axis])} > {limit}",
        )


_: type[QuotaPlugin] = Quota
