"""Filter: the node carries every label of the task's node selector (pod.spec.nodeSelector)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from kallot.core.framework.cycle import Cycle
from kallot.core.framework.plugin import FilterPlugin, Rejection
from kallot.core.workload import Task


class NodeSelector:
    name: ClassVar[str] = "NodeSelector"

    def filter(self, cycle: Cycle, task: Task) -> NDArray[np.bool_] | None:
        if not task.node_selector:
            return None  # every node passes
        labels = cycle.snapshot.labels
        ok = np.ones(cycle.snapshot.n_nodes, dtype=np.bool_)
        for key, value in sorted(task.node_selector.items()):
            ok &= labels.equals(key, value)
        return ok

    def explain(
        self, cycle: Cycle, task: Task, rejected: NDArray[np.bool_]
    ) -> tuple[Rejection, ...]:
        labels = cycle.snapshot.labels
        out = []
        for key, value in sorted(task.node_selector.items()):
            miss = rejected & ~labels.equals(key, value)
            if miss.any():
                out.append(Rejection(f"node label {key}={value} missing", miss, unresolvable=True))
        return tuple(out)


_: type[FilterPlugin] = NodeSelector
