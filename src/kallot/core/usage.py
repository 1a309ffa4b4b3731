"""What the pods of a cluster hold (``Usage``), charged and released per pod (``Charge``), and
the one way a shell turns it into the frozen Snapshot a session runs on (``Usage.snapshot``).

Where it sits: below the shells, beside ``core.snapshot``. The live cache (``kube.state.cache``)
charges each pod it assumes or sees bound, from its device record; the simulator's cluster
(``sim.kernel``) charges each placement a Decision makes (``Charge.of``). Both call
``Usage.snapshot`` on their static node rows before every session. A session never writes
here: it copies these arrays into its Scratch and writes through its Statement.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

import numpy as np
from numpy.typing import NDArray

from kallot.core.decision import DeviceAssignment
from kallot.core.errors import InvariantViolation
from kallot.core.k8s import PlacedPod
from kallot.core.snapshot import Allocation, Snapshot, shape_column
from kallot.core.workload import Task

I64 = NDArray[np.int64]
I32 = NDArray[np.int32]
T = TypeVar("T", bound=np.generic)


@dataclass(frozen=True, slots=True)
class Charge:
    """What one pod holds on one node row, kept so that releasing it exactly undoes the charge."""

    row: int
    cpu: int
    mem: int
    gpus: Sequence[tuple[int, int, int]]  # (slot, milli, mem_mib)
    mig_rows: Sequence[int]  # rows of the Snapshot's MigLayout it holds
    shape: int  # column of node_shapes it counts in, -1 for none

    @staticmethod
    def of(snapshot: Snapshot, task: Task, row: int, devices: Iterable[DeviceAssignment]) -> Charge:
        """The charge of ``task`` placed on ``row`` with ``devices`` (a core Placement): the same
        amounts a session's Statement writes into its Scratch."""
        devices = tuple(devices)
        return Charge(
            row,
            task.cpu_milli,
            task.mem_mib,
            [(d.slot, d.milli, d.mem_mib) for d in devices],
            [mig_row(snapshot, row, d) for d in devices if d.mig is not None],
            shape_column(task, snapshot.max_gpus),
        )


def mig_row(snapshot: Snapshot, row: int, device: DeviceAssignment) -> int:
    """Row of ``snapshot.mig`` holding the MIG instance ``device`` names on node ``row``."""
    m, inst = snapshot.mig, device.mig
    assert inst is not None
    if inst.profile in m.profiles:
        hit = np.flatnonzero(
            (m.node == row)
            & (m.slot == device.slot)
            & (m.profile == m.profiles.index(inst.profile))
            & (m.start == inst.start)
        )
        if hit.size:
            return int(hit[0])
    raise InvariantViolation(f"no MIG instance {inst} on node {row} slot {device.slot}")


def _frozen_copy(a: NDArray[T]) -> NDArray[T]:
    out = a.copy()
    out.flags.writeable = False
    return out


@dataclass(slots=True)
class Usage:
    """Usage arrays of one cluster, in the Snapshot's layout (``[N]`` nodes, ``[N, G]`` GPUs,
    ``[M]`` MIG instances, ``[N, G+1]`` shapes). Not thread-safe: one owner writes it."""

    cpu: I64
    mem: I64
    pods: I64
    gpu_milli: I64
    gpu_mem: I64
    gpu_clients: I32
    # Holders per MIG instance (a count, not a flag: a replayed or duplicated release of one
    # holder must not free an instance another pod holds). Free only at zero.
    mig_holders: I32
    shapes: I32

    @staticmethod
    def zeros(n: int, g: int, m: int) -> Usage:
        return Usage(
            cpu=np.zeros(n, np.int64),
            mem=np.zeros(n, np.int64),
            pods=np.zeros(n, np.int64),
            gpu_milli=np.zeros((n, g), np.int64),
            gpu_mem=np.zeros((n, g), np.int64),
            gpu_clients=np.zeros((n, g), np.int32),
            mig_holders=np.zeros(m, np.int32),
            shapes=np.zeros((n, g + 1), np.int32),
        )

    @staticmethod
    def of(snapshot: Snapshot) -> Usage:
        """A writable copy of the usage ``snapshot`` already carries (what its NodeSpecs held:
        a simulation's background load, for example)."""
        shapes = snapshot.node_shapes
        return Usage(
            cpu=snapshot.node_cpu_used.astype(np.int64),
            mem=snapshot.node_mem_used.astype(np.int64),
            pods=snapshot.node_pods_used.astype(np.int64),
            gpu_milli=snapshot.gpu_used_milli.astype(np.int64),
            gpu_mem=snapshot.gpu_used_mem.astype(np.int64),
            gpu_clients=snapshot.gpu_clients.astype(np.int32),
            mig_holders=snapshot.mig.used.astype(np.int32),
            shapes=(
                shapes.astype(np.int32)
                if shapes is not None
                else np.zeros((snapshot.n_nodes, snapshot.max_gpus + 1), np.int32)
            ),
        )

    def apply(self, c: Charge, sign: int) -> None:
        """Charge (``sign`` +1) or release (-1) what ``c`` holds."""
        self.cpu[c.row] += sign * c.cpu
        self.mem[c.row] += sign * c.mem
        self.pods[c.row] += sign
        for slot, milli, mem in c.gpus:
            self.gpu_milli[c.row, slot] += sign * milli
            self.gpu_mem[c.row, slot] += sign * mem
            self.gpu_clients[c.row, slot] += sign
        for idx in c.mig_rows:
            self.mig_holders[idx] += sign
        if c.shape >= 0:
            self.shapes[c.row, c.shape] += sign

    def snapshot(
        self,
        static: Snapshot,
        *,
        generation: int,
        running: tuple[Allocation, ...] = (),
        placed: tuple[PlacedPod, ...] = (),
        nominated: tuple[tuple[int, Task], ...] = (),
    ) -> Snapshot:
        """``static`` (node rows, capacities, MIG layout) with this usage, frozen: every array
        is a read-only copy, so the Snapshot stays valid while the owner keeps charging."""
        return replace(
            static,
            generation=generation,
            node_cpu_used=_frozen_copy(self.cpu),
            node_mem_used=_frozen_copy(self.mem),
            node_pods_used=_frozen_copy(self.pods),
            gpu_used_milli=_frozen_copy(self.gpu_milli),
            gpu_used_mem=_frozen_copy(self.gpu_mem),
            gpu_clients=_frozen_copy(self.gpu_clients),
            node_shapes=_frozen_copy(self.shapes),
            mig=replace(static.mig, used=_frozen_copy(self.mig_holders > 0)),
            running=running,
            placed=placed,
            nominated=nominated,
        )
