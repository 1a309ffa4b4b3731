"""``Statement``: the only writer of a session's Scratch. Every write is logged with its inverse
so actions can try what-ifs (a gang, a preemption) and roll them back bit for bit.

Three operations: allocate, evict and reconfigure (a MIG layout change of one GPU: idle instances
destroyed, new ones appended as Scratch rows; undone by truncating the rows and reviving). What
follows the session's writes (the queues' accounting, ``core.queueing.ledger``) logs its own
undo step here with ``record``, so one checkpoint and one rollback cover everything: there is
one transaction log per session.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kallot.core.decision import DeviceAssignment, Eviction, MigReconfiguration, Placement
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


@dataclass(frozen=True, slots=True)
class _MigOp:
    node: int
    destroyed: tuple[int, ...]  # scratch rows marked dead
    created: int  # rows appended
    profiles_before: int  # len(scratch.mig_profiles) before (new names are appended)
    record: MigReconfiguration


@dataclass(frozen=True, slots=True)
class _Undo:
    undo: Callable[[], None]  # a follower's inverse of its own step (``Statement.record``)


class Statement:
    """Applies allocations and evictions to a Scratch, with checkpoint and rollback."""

    def __init__(self, snapshot: Snapshot, scratch: Scratch) -> None:
        self._snapshot = snapshot
        self._scratch = scratch
        self._log: list[_Op | _MigOp | _Undo] = []

    @property
    def scratch(self) -> Scratch:
        return self._scratch

    def checkpoint(self) -> int:
        return len(self._log)

    def rollback(self, checkpoint: int) -> None:
        """Undo every operation after ``checkpoint``, newest first."""
        while len(self._log) > checkpoint:
            op = self._log.pop()
            if isinstance(op, _Undo):
                op.undo()
            elif isinstance(op, _MigOp):
                self._undo_reconfigure(op)
            else:
                self._apply(-op.sign, op.task, op.node, op.devices)
                self._scratch.pod_log.pop()

    def record(self, undo: Callable[[], None]) -> None:
        """Log a follower's step: ``undo`` runs when a rollback passes it (newest first, in
        order with the Statement's own operations). Satisfies ``core.journal.Journal``."""
        self._log.append(_Undo(undo))

    def allocate(self, placement: Placement, task: Task) -> None:
        self._apply(+1, task, placement.node_row, placement.devices)
        self._scratch.pod_log.append((+1, placement.node_row, task))
        self._log.append(_Op(+1, task, placement.node_row, placement.devices, placement))

    def evict(self, allocation: Allocation, eviction: Eviction) -> None:
        self._apply(-1, allocation.task, allocation.node_row, allocation.devices)
        self._scratch.pod_log.append((-1, allocation.node_row, allocation.task))
        self._log.append(
            _Op(-1, allocation.task, allocation.node_row, allocation.devices, eviction)
        )

    def reconfigure(self, node: int, record: MigReconfiguration) -> None:
        """Apply a MIG layout change of GPU (node, record.slot): every destroyed instance must be
        live and idle; the created ones become new idle rows."""
        x = self._scratch
        destroyed = []
        for inst in record.destroy:
            row = self._mig_row(node, record.slot, inst.profile, inst.start)
            if x.mig_used[row]:
                raise InvariantViolation(f"MIG {inst} on node {node} slot {record.slot} is in use")
            x.mig_alive[row] = False
            destroyed.append(row)
        before = len(x.mig_profiles)
        codes = []
        for inst in record.create:
            if inst.profile not in x.mig_profiles:
                x.mig_profiles.append(inst.profile)
            codes.append(x.mig_profiles.index(inst.profile))
        k = len(record.create)
        x.mig_node = np.concatenate([x.mig_node, np.full(k, node, np.int32)])
        x.mig_slot = np.concatenate([x.mig_slot, np.full(k, record.slot, np.int32)])
        x.mig_profile = np.concatenate([x.mig_profile, np.array(codes, np.int32)])
        x.mig_start = np.concatenate(
            [x.mig_start, np.array([c.start for c in record.create], np.int32)]
        )
        x.mig_used = np.concatenate([x.mig_used, np.zeros(k, np.bool_)])
        x.mig_alive = np.concatenate([x.mig_alive, np.ones(k, np.bool_)])
        x.touch(node)
        self._log.append(_MigOp(node, tuple(destroyed), k, before, record))

    def _undo_reconfigure(self, op: _MigOp) -> None:
        x = self._scratch
        keep = x.mig_node.size - op.created
        if x.mig_used[keep:].any():
            raise InvariantViolation("rolled back a MIG reconfiguration under a live allocation")
        x.mig_node, x.mig_slot = x.mig_node[:keep].copy(), x.mig_slot[:keep].copy()
        x.mig_profile, x.mig_start = x.mig_profile[:keep].copy(), x.mig_start[:keep].copy()
        x.mig_used, x.mig_alive = x.mig_used[:keep].copy(), x.mig_alive[:keep].copy()
        x.mig_alive[list(op.destroyed)] = True
        del x.mig_profiles[op.profiles_before :]
        x.touch(op.node)

    def placements(self) -> list[Placement]:
        return [
            op.record
            for op in self._log
            if isinstance(op, _Op) and isinstance(op.record, Placement)
        ]

    def evictions(self) -> list[Eviction]:
        return [
            op.record for op in self._log if isinstance(op, _Op) and isinstance(op.record, Eviction)
        ]

    def reconfigurations(self) -> list[MigReconfiguration]:
        return [op.record for op in self._log if isinstance(op, _MigOp)]

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
                idx = self._mig_row(node, d.slot, d.mig.profile, d.mig.start)
                if x.mig_used[idx] == (sign > 0):
                    raise InvariantViolation(
                        f"MIG {d.mig} on node {node} slot {d.slot} is already "
                        f"{'held' if sign > 0 else 'free'} (task {task.id})"
                    )
                x.mig_used[idx] = sign > 0
            x.gpu_used_milli[node, d.slot] += sign * d.milli
            x.gpu_used_mem[node, d.slot] += sign * d.mem_mib
            x.gpu_clients[node, d.slot] += sign
            if x.gpu_clients[node, d.slot] < 0 or x.gpu_used_milli[node, d.slot] < 0:
                raise InvariantViolation(
                    f"GPU {node}/{d.slot} released more than it held (task {task.id})"
                )
        x.touch(node)

    def _mig_row(self, node: int, slot: int, profile: str, start: int) -> int:
        x = self._scratch
        if profile in x.mig_profiles:
            code = x.mig_profiles.index(profile)
            rows = np.flatnonzero(
                (x.mig_node == node)
                & (x.mig_slot == slot)
                & (x.mig_profile == code)
                & (x.mig_start == start)
                & x.mig_alive
            )
            if rows.size:
                return int(rows[0])
        raise InvariantViolation(f"no MIG instance {profile}@{start} on node {node} slot {slot}")
