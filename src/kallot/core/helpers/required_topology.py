"""``required`` topology as a filter, shared by the RequiredTopology plugin (the floor every
profile stands on) and the Topology plugin (which also weighs link quality): the node groups of
the session, the GPUs that can take one device of the task, the in-node level check of the
pre-filter, and the filter's mask and reasons (``topology.required_mask``,
``topology.required_rejections``) with the gang's domain from ``GANG_CONTEXT``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from kallot.core import fit, topology
from kallot.core.framework.cycle import GANG_CONTEXT, SLOT_FIT, Cycle, StateKey
from kallot.core.framework.plugin import Rejection
from kallot.core.status import SUCCESS, Code, Status
from kallot.core.workload import Task

BOOL = NDArray[np.bool_]


class RequiredRule:
    """One plugin's view of required topology; its session cache is keyed by ``owner``."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._groups_key: StateKey[topology.NodeGroups] = StateKey(f"{owner}/groups")

    def groups(self, cycle: Cycle) -> topology.NodeGroups:
        """The session's NVLink islands and NUMA nodes per node (computed once)."""
        g = cycle.session.get(self._groups_key)
        if g is None:
            g = topology.NodeGroups.of(cycle.snapshot)
            cycle.session.put(self._groups_key, g)
        return g

    @staticmethod
    def slot_fit(cycle: Cycle, task: Task) -> BOOL:
        """[N, G] GPUs that can take one device of the task (DeviceFit's, when it ran)."""
        cached = cycle.state.get(SLOT_FIT)
        if cached is not None:
            return cached
        assert task.gpu is not None
        return fit.slot_fit(cycle.snapshot, cycle.scratch, task.gpu)

    in_node_level = staticmethod(topology.required_in_node_level)

    def level_status(self, level: str) -> Status:
        """Unresolvable unless ``level`` (a GPU topology constraint's) is an in-node level."""
        if topology.InNodeLevel.parse(level) is None:
            return Status(
                Code.UNSCHEDULABLE_AND_UNRESOLVABLE,
                f"GPU topology level {level!r} is not an in-node level, expected "
                f"one of {', '.join(topology.IN_NODE_LEVELS)}",
                self.owner,
            )
        return SUCCESS

    def mask(self, cycle: Cycle, task: Task) -> BOOL:
        return topology.required_mask(
            cycle.snapshot.n_nodes,
            cycle.session.get(GANG_CONTEXT),
            self.in_node_level(task),
            groups=lambda: self.groups(cycle),
            slot_fit=lambda: self.slot_fit(cycle, task),
            count=task.gpu.count if task.gpu is not None else 0,
        )

    def rejections(self, cycle: Cycle, task: Task, rejected: BOOL) -> tuple[Rejection, ...]:
        return tuple(
            Rejection(message, nodes, unresolvable)
            for message, nodes, unresolvable in topology.required_rejections(
                rejected,
                cycle.session.get(GANG_CONTEXT),
                self.in_node_level(task),
                groups=lambda: self.groups(cycle),
                slot_fit=lambda: self.slot_fit(cycle, task),
                count=task.gpu.count if task.gpu is not None else 0,
            )
        )
