"""PreFilter + Filter + DeviceScore "RequiredTopology": ``required`` topology holds under every
policy, not only ``topology``.

Where it sits: in every shipped preset's filters (``config/profiles/*.yaml``) and first among
the DeviceScore plugins of the profiles without the Topology plugin. It scores nothing, so a
policy ranks nodes exactly as before; it only removes what a hard constraint rules out:

- a multi-GPU task with ``required`` in-node topology (``nvlink``: one NVLink island, ``numa``:
  one NUMA node) passes only nodes with ``count`` free GPUs in one such group, and gets its GPUs
  there (the group with the fewest fitting GPUs that holds it, so large islands stay whole;
  lowest slots in it);
- while a gang with a ``required`` domain (``core.gang``) is tried inside one domain, nodes
  outside it are rejected (``gang_topology.enforces_required``).

The Topology plugin does all this too, and weighs link quality; this plugin is the floor every
profile stands on.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from kallot.core import gang, topology
from kallot.core.framework.cycle import GANG_CONTEXT, Cycle
from kallot.core.framework.plugin import DeviceScorePlugin, FilterPlugin, PreFilterPlugin, Rejection
from kallot.core.helpers.required_topology import RequiredRule
from kallot.core.status import SUCCESS, Status
from kallot.core.workload import Task, TopologyMode

BOOL = NDArray[np.bool_]


class RequiredTopology:
    name: ClassVar[str] = "RequiredTopology"

    def __init__(
        self, cluster: topology.ClusterTopology = topology.DEFAULT_CLUSTER_TOPOLOGY
    ) -> None:
        self.gang_topology = gang.GangTopology(cluster=cluster, enforces_required=True)
        self._rule = RequiredRule(self.name)

    def pre_filter(self, cycle: Cycle, task: Task) -> Status:
        req = task.gpu
        if req is None or req.topology.mode is not TopologyMode.REQUIRED:
            return SUCCESS
        return self._rule.level_status(req.topology.level)

    def filter(self, cycle: Cycle, task: Task) -> BOOL | None:
        ctx = cycle.session.get(GANG_CONTEXT)
        if (ctx is None or ctx.allowed is None) and self._rule.in_node_level(task) is None:
            return None  # no hard topology constraint: every node passes
        return self._rule.mask(cycle, task)

    def explain(self, cycle: Cycle, task: Task, rejected: BOOL) -> tuple[Rejection, ...]:
        return self._rule.rejections(cycle, task, rejected)

    def choose(
        self, cycle: Cycle, task: Task, node: int, feasible: NDArray[np.intp]
    ) -> tuple[int, ...] | None:
        """For a required in-node constraint: ``count`` slots of one group, the group with the
        fewest fitting slots that holds them (lowest id on ties), lowest slots first. None
        (the next DeviceScore plugin decides) for any other task."""
        level = self._rule.in_node_level(task)
        if level is None:
            return None
        assert task.gpu is not None
        count = task.gpu.count
        ids = self._rule.groups(cycle).of_level(level)[node]
        best: tuple[int, int] | None = None
        for gid in np.unique(ids[feasible]):
            if gid < 0:
                continue
            n = int((ids[feasible] == gid).sum())
            if n >= count and (best is None or (n, int(gid)) < best):
                best = (n, int(gid))
        if best is None:
            return ()  # the filter admitted the node; nothing fits after all: pass over it
        slots = feasible[ids[feasible] == best[1]][:count]
        return tuple(int(s) for s in slots)


_p: type[PreFilterPlugin] = RequiredTopology
_f: type[FilterPlugin] = RequiredTopology
_d: type[DeviceScorePlugin] = RequiredTopology
