"""``Ledger``: per-queue usage during one session, following the session's Statement.

Rows are queues, columns ``QueueTree.axes``; a leaf's usage is also counted in every ancestor,
so a row is what the queue and its sub-queues hold. It starts from the Snapshot's running
allocations; the Quota plugin (``core.plugins.quota``) adds placements and the queue actions
subtract evictions. Every change is logged as an undo step in the session's one transaction log
(the ``Journal``: the Statement), so a Statement rollback undoes the accounting with the
placements; the Ledger keeps no log of its own. Pure bookkeeping: no policy here.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from numpy.typing import NDArray

from kallot.core import gang
from kallot.core.journal import Journal
from kallot.core.queueing.charge import Charger
from kallot.core.queueing.queue_tree import QueueTree
from kallot.core.snapshot import Snapshot
from kallot.core.workload import Job

I64 = NDArray[np.int64]


class Ledger:
    """Usage [Q, R], undone through the session's Journal. Not thread-safe; lives for one
    session."""

    def __init__(
        self,
        tree: QueueTree,
        charger: Charger,
        snapshot: Snapshot,
        jobs: Mapping[str, Job] | None = None,
        *,
        journal: Journal,
    ) -> None:
        self.tree = tree
        self.usage: I64 = np.zeros((tree.n_queues, len(tree.axes)), dtype=np.int64)
        self._journal = journal
        # Running tasks whose queue is unknown are charged nowhere: they still occupy the
        # cluster (the Scratch has them) but belong to no tenant; the shells report them.
        self.unowned = 0
        for alloc in snapshot.running:
            leaf = tree.leaf_of(gang.queue_of(alloc.task, jobs or {}))
            if leaf is None:
                self.unowned += 1
                continue
            self._apply(leaf, charger.placed(alloc.task, alloc.node_row, alloc.devices))

    def add(self, leaf: int, amount: I64) -> None:
        self._apply(leaf, amount)
        self._journal.record(lambda: self._apply(leaf, -amount))

    def sub(self, leaf: int, amount: I64) -> None:
        self.add(leaf, -amount)

    def over_limit(
        self, leaf: int, amount: I64, *, before: I64 | None = None
    ) -> tuple[int, int] | None:
        """(queue row, axis) of the first hard limit that ``amount`` more in ``leaf`` would
        exceed (on top of ``before``, charges of the same unit not yet added), or None if every
        queue on the leaf's path stays within its limits."""
        for q in self.tree.path[leaf]:
            after = self.usage[q] + amount if before is None else self.usage[q] + before + amount
            over = np.flatnonzero((amount > 0) & (after > self.tree.limit[q]))
            if over.size:
                return q, int(over[0])
        return None

    def _apply(self, leaf: int, amount: I64) -> None:
        for q in self.tree.path[leaf]:
            self.usage[q] += amount
