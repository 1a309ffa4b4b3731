"""``Ledger``: per-queue usage during one session, kept in step with the session's Statement.

Rows are queues, columns ``QueueTree.axes``; a leaf's usage is also counted in every ancestor,
so a row is what the queue and its sub-queues hold. It starts from the Snapshot's running
allocations; the queue actions add placements and subtract evictions, and roll back with the
Statement (same checkpoint discipline, its own log). Pure bookkeeping: no policy here.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from numpy.typing import NDArray

from kallot.core.queueing import gangs
from kallot.core.queueing.charge import Charger
from kallot.core.queueing.queue_tree import QueueTree
from kallot.core.snapshot import Snapshot
from kallot.core.workload import Job

I64 = NDArray[np.int64]


class Ledger:
    """Usage [Q, R] with checkpoint / rollback. Not thread-safe; lives for one session."""

    def __init__(
        self,
        tree: QueueTree,
        charger: Charger,
        snapshot: Snapshot,
        jobs: Mapping[str, Job] | None = None,
    ) -> None:
        self.tree = tree
        self.usage: I64 = np.zeros((tree.n_queues, len(tree.axes)), dtype=np.int64)
        self._log: list[tuple[int, I64]] = []
        # Running tasks whose queue is unknown are charged nowhere: they still occupy the
        # cluster (the Scratch has them) but belong to no tenant; the shells report them.
        self.unowned = 0
        for alloc in snapshot.running:
            leaf = tree.leaf_of(gangs.queue_of(alloc.task, jobs or {}))
            if leaf is None:
                self.unowned += 1
                continue
            self._apply(leaf, charger.placed(alloc.task, alloc.node_row, alloc.devices))

    def checkpoint(self) -> int:
        return len(self._log)

    def rollback(self, checkpoint: int) -> None:
        while len(self._log) > checkpoint:
            leaf, amount = self._log.pop()
            self._apply(leaf, -amount)

    def add(self, leaf: int, amount: I64) -> None:
        self._apply(leaf, amount)
        self._log.append((leaf, amount))

    def sub(self, leaf: int, amount: I64) -> None:
        self.add(leaf, -amount)

    def over_limit(self, leaf: int, amount: I64) -> tuple[int, int] | None:
        """(queue row, axis) of the first hard limit that ``amount`` more in ``leaf`` would
        exceed, or None if every queue on the leaf's path stays within its limits."""
        for q in self.tree.path[leaf]:
            after = self.usage[q] + amount
            over = np.flatnonzero((amount > 0) & (after > self.tree.limit[q]))
            if over.size:
                return q, int(over[0])
        return None

    def _apply(self, leaf: int, amount: I64) -> None:
        for q in self.tree.path[leaf]:
            self.usage[q] += amount
