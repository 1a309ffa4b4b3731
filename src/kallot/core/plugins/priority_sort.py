"""QueueSort: higher priority first, then earlier creation, then task id (a total order)."""

from __future__ import annotations

from typing import Any, ClassVar

from kallot.core.framework.plugin import QueueSortPlugin
from kallot.core.workload import Task


class PrioritySort:
    name: ClassVar[str] = "PrioritySort"

    def sort_key(self, task: Task) -> tuple[Any, ...]:
        return (-task.priority, task.created, task.id)


_: type[QueueSortPlugin] = PrioritySort
