"""``Journal``: the session's one transaction log, as the layers below the session see it.

The Statement (``core.session.statement``) is the only implementation. What follows the
session's writes without being the Scratch (the queues' per-queue usage, ``core.queueing.ledger``)
logs its own undo step with ``record``, so one checkpoint and one rollback undo everything.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class Journal(Protocol):
    """``record(undo)`` logs a step; ``undo`` runs when a rollback passes it (newest first, in
    order with the Statement's own operations)."""

    def record(self, undo: Callable[[], None]) -> None: ...
