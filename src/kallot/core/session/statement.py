"""``Statement``: the only writer of a session's Scratch. Every write is logged with its inverse
so actions can try what-ifs (a gang, a preemption) and roll them back bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

from kallot.core.decision import DeviceAssignment, Eviction, Placement
from kallot.core.errors import InvariantViolation
from kallot.core.snapshot import Allocation, Scratch, Snapshot, shape_column
from kallot.core.workload import Task


@dataclass(frozen=True, slots=True)
class _Op:
    sign: int  # +1 allocate, -1 evict (release)
    task: Task
    node: int
    devices: tuple[DeviceAssignment, ...]
    record: Placement | Eviction


class Statement:
    """Applies allocations and evictions to a Scratch, with checkpoint and rollback."""

    def __init__(self, snapshot: Snapshot, scratch: Scratch) -> None:
        self._snapshot = snapshot
        self._scratch = scratch
        self._log: list[_Op] = []

    @property
    def scratch(self) -> Scratch:
        return self._scratch

    def checkpoint(self) -> int:
        return len(self._log)

    def rollback(self, checkpoint: int) -> None:
        """Undo every operation after ``checkpoint``, newest first."""
        while len(self._log) > checkpoint:
            op = self._log.pop()
            self._apply(-op.sign, op.task, op.node, op.devices)

    def allocate(self, placement: Placement, task: Task) -> None:
        self._apply(+1, task, placement.node_row, placement.devices)
        self._log.append(_Op(+1, task, placement.node_row, placement.devices, placement))

    def evict(self, allocation: Allocation, eviction: Eviction) -> None:
        self._apply(-1, allocation.task, allocation.node_row, allocation.devices)
        self._log.append(
            _Op(-1, allocation.task, allocation.node_row, allocation.devices, eviction)
        )

    def placements(self) -> list[Placement]:
        return [op.record for op in self._log if isinstance(op.record, Placement)]

    def evictions(self) -> list[Eviction]:
        return [op.record for op in self._log if isinstance(op.record, Eviction)]

    def _apply(
        self, sign: int, task: Task, node: int, devices: tuple[DeviceAssignment, ...]
    ) -> None:
        x = self._scratch
        x.node_cpu_used[node] += sign * task.cpu_milli
        x.node_mem_used[node] += sign * task.mem_mib
        x.node_pods_used[node] += sign
        col = shape_column(task, self._snapshot.max_gpus)
        if col >= 0:
            x.node_shapes[node, col] += sign
        for d in devices:
            if d.mig is not None:
                idx = self._mig_index(node, d)
                x.mig_used[idx] = sign > 0
            x.gpu_used_milli[node, d.slot] += sign * d.milli
            x.gpu_used_mem[node, d.slot] += sign * d.mem_mib
            x.gpu_clients[node, d.slot] += sign
            if x.gpu_clients[node, d.slot] < 0 or x.gpu_used_milli[node, d.slot] < 0:
                raise InvariantViolation(
                    f"GPU {node}/{d.slot} released more than it held (task {task.id})"
                )
        x.touch(node)

    def _mig_index(self, node: int, d: DeviceAssignment) -> int:
        mig = self._snapshot.mig
        assert d.mig is not None
        profile = mig.profiles.index(d.mig.profile)
        for i in range(mig.node.size):
            if (
                mig.node[i] == node
                and mig.slot[i] == d.slot
                and mig.profile[i] == profile
                and mig.start[i] == d.mig.start
            ):
                return i
        raise InvariantViolation(f"no MIG instance {d.mig} on node {node} slot {d.slot}")
