"""Actions: what a session does, in order, each writing only through the Statement.

The top layer of the core (model -> framework -> plugins -> session -> actions; see
docs/design/001-core.md). ``allocate`` places pending tasks (``gang_allocate`` places a gang as a
unit); ``queue`` holds the tenant-queue actions: queue allocate (fair-share order, quotas through
the Quota plugin), reclaim and preempt (victims from ``core.queueing.victims``), and the
static-quota baseline. A consolidate action would be one more module here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Protocol

from kallot.core.session.session import Session
from kallot.core.workload import Task


class Action(Protocol):
    """One step of a session: runs once per session over the pending tasks (in queue order)."""

    name: ClassVar[str]

    def execute(self, session: Session, pending: Sequence[Task]) -> None: ...
