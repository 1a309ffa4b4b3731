"""Filter: enough CPU, memory and pod slots on the node, and the node is schedulable.

Mirrors kube-scheduler's NodeResourcesFit (plus NodeUnschedulable), which is all the FGD
simulator checks for host resources.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from kallot.core.framework.cycle import Cycle
from kallot.core.framework.plugin import FilterPlugin, Rejection
from kallot.core.workload import Task


class NodeResourcesFit:
    name: ClassVar[str] = "NodeResourcesFit"

    def filter(self, cycle: Cycle, task: Task) -> NDArray[np.bool_]:
        s, x = cycle.snapshot, cycle.scratch
        ok = s.node_schedulable & (x.node_pods_used < s.node_max_pods)
        if task.cpu_milli:
            ok = ok & (s.node_cpu_milli - x.node_cpu_used >= task.cpu_milli)
        if task.mem_mib:
            ok = ok & (s.node_mem_mib - x.node_mem_used >= task.mem_mib)
        return ok

    def explain(
        self, cycle: Cycle, task: Task, rejected: NDArray[np.bool_]
    ) -> tuple[Rejection, ...]:
        s, x = cycle.snapshot, cycle.scratch
        out = []
        unsched = rejected & ~s.node_schedulable
        if unsched.any():
            out.append(Rejection("node is unschedulable (cordoned or not ready)", unsched))
        cpu_left = s.node_cpu_milli - x.node_cpu_used
        short_cpu = rejected & s.node_schedulable & (cpu_left < task.cpu_milli)
        if short_cpu.any():
            best = int(cpu_left[short_cpu].max())
            out.append(
                Rejection(
                    f"insufficient cpu: need {task.cpu_milli}m, largest free is {max(best, 0)}m",
                    short_cpu,
                    unresolvable=bool((s.node_cpu_milli[short_cpu] < task.cpu_milli).all()),
                )
            )
        mem_left = s.node_mem_mib - x.node_mem_used
        short_mem = rejected & s.node_schedulable & (mem_left < task.mem_mib)
        if short_mem.any():
            best = int(mem_left[short_mem].max())
            out.append(
                Rejection(
                    f"insufficient memory: need {task.mem_mib} MiB, largest free is "
                    f"{max(best, 0)} MiB",
                    short_mem,
                )
            )
        full = rejected & (x.node_pods_used >= s.node_max_pods)
        if full.any():
            out.append(Rejection("too many pods", full))
        return tuple(out)


_: type[FilterPlugin] = NodeResourcesFit
