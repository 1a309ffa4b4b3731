"""Usage tracking for the live scheduler: what every assumed and bound pod holds, per node row,
and the Snapshot each session runs on.

Flow: the store (``kube.state.store``) calls ``hold`` / ``release`` as a pod moves through its
states (assumed, bound, deleted); a node change marks the rows stale and the next ``snapshot``
rebuilds them (``rebuild``) and recharges every holder. What a pod holds is its ``Holding``
(``Holder.held``), written by the ledger only; the ledger reads the rest of the pod through
``Holder`` and knows nothing of the store (which imports it, never the reverse). ``snapshot`` copies the usage arrays into an
immutable ``core.snapshot.Snapshot``. A pod's GPUs come from its device record
(``kallot.io/devices``), so a restarted scheduler rebuilds exactly what was assigned before it
died; ``check`` recounts every kind of usage from the pods (MIG holders included).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

import numpy as np

from kallot.core import k8s
from kallot.core import usage as core_usage
from kallot.core.decision import DeviceAssignment, Placement
from kallot.core.errors import InvariantViolation
from kallot.core.snapshot import (
    Allocation,
    MigLayout,
    NodeSpec,
    Snapshot,
    SnapshotBuilder,
    shape_column,
)
from kallot.core.workload import Task

if TYPE_CHECKING:
    from kallot.kube.translate import NodeInfo


# What one pod holds and the usage arrays are the core's (core.usage): the simulator keeps its
# cluster's usage the same way, and ``Usage.snapshot`` is the one usage -> Snapshot step.
Charge = core_usage.Charge
Usage = core_usage.Usage


@dataclass(slots=True)
class Holding:
    """What one pod holds on its node, as the ledger charged it. Written by ``UsageLedger``
    only (``hold``, ``release``, ``retask``, ``snapshot``); everyone else reads it."""

    charge: Charge | None = None
    allocation: Allocation | None = None  # a running kallot pod, as preemption reads it
    missing_devices: tuple[str, ...] = ()  # GPUs its record names that its node does not have
    placed: k8s.PlacedPod | None = None  # the snapshot's view of it on its node (kept, reused)


class Holder(Protocol):
    """What the ledger reads of a pod (``kube.state.store.Holder``), and its ``Holding``."""

    @property
    def uid(self) -> str: ...
    @property
    def node(self) -> str: ...
    @property
    def kallot(self) -> bool: ...
    @property
    def cpu_milli(self) -> int: ...
    @property
    def mem_mib(self) -> int: ...
    @property
    def task(self) -> Task | None: ...
    @property
    def devices(self) -> tuple[DeviceAssignment, ...]: ...
    @property
    def foreign_gpus(self) -> int: ...
    @property
    def started(self) -> float: ...
    @property
    def info(self) -> k8s.PodInfo | None: ...
    @property
    def held(self) -> Holding: ...


H = TypeVar("H", bound=Holder)


class UsageLedger:
    """Node rows (capacities, GPUs, MIG layout) and the usage charged to them, per pod.

    Not thread-safe: every method runs on the event loop. ``stale`` is set when the nodes
    changed; rows are then rebuilt (and every holder recharged) by the next ``snapshot``, and
    ``hold`` charges nothing meanwhile.
    """

    def __init__(self) -> None:
        self.stale = True
        self.static: Snapshot | None = None
        self.rows: dict[str, int] = {}
        self._uuid_slots: list[dict[str, int]] = []
        self._mig_index: dict[tuple[int, int, str, int], int] = {}
        self._usage = Usage.zeros(0, 0, 0)
        self._generation = 0

    # -- node rows -----------------------------------------------------------------------------

    def rebuild(
        self,
        nodes: Mapping[str, NodeInfo],
        pods: Iterable[H],
        holds: Callable[[H], bool],
    ) -> None:
        """Node rows from ``nodes``, and usage recharged from every pod that ``holds``."""
        names = sorted(nodes)
        builder = SnapshotBuilder()
        specs: list[NodeSpec] = []
        for name in names:
            specs.append(nodes[name].spec)
        builder.extend(specs)
        profiles = sorted({m.profile for n in names for m in nodes[n].mig})
        rows = {name: i for i, name in enumerate(names)}
        mig_node: list[int] = []
        mig_slot: list[int] = []
        mig_prof: list[int] = []
        mig_start: list[int] = []
        self._mig_index = {}
        for name in names:
            for m in nodes[name].mig:
                self._mig_index[(rows[name], m.slot, m.profile, m.start)] = len(mig_node)
                mig_node.append(rows[name])
                mig_slot.append(m.slot)
                mig_prof.append(profiles.index(m.profile))
                mig_start.append(m.start)
        builder.mig(
            MigLayout(
                profiles=tuple(profiles),
                node=np.array(mig_node, np.int32),
                slot=np.array(mig_slot, np.int32),
                profile=np.array(mig_prof, np.int32),
                start=np.array(mig_start, np.int32),
                used=np.zeros(len(mig_node), np.bool_),
            )
        )
        static = builder.build()
        self.static = static
        self.rows = rows
        self._uuid_slots = [{u: j for j, u in enumerate(uu)} for uu in static.gpu_uuid]
        self._usage = Usage.zeros(static.n_nodes, static.max_gpus, len(mig_node))
        self.stale = False
        self._recharge_all(pods, holds)

    def recharge(self, pods: Iterable[H], holds: Callable[[H], bool]) -> None:
        """Usage recomputed from every pod that ``holds`` (assumed and bound, after a list)."""
        if self.stale or self.static is None:
            return  # the next snapshot rebuilds the rows and recharges everything
        u = self._usage
        self._usage = Usage.zeros(u.cpu.size, u.gpu_milli.shape[1], u.mig_holders.size)
        self._recharge_all(pods, holds)

    def _recharge_all(self, pods: Iterable[H], holds: Callable[[H], bool]) -> None:
        pods = list(pods)
        for e in pods:
            e.held.charge = None
            e.held.allocation = None
        for e in pods:
            if holds(e):
                self.hold(e)

    # -- the one usage -> Snapshot step ---------------------------------------------------------

    def snapshot(self, pods: Iterable[Holder], pending: Iterable[Holder]) -> Snapshot:
        """The rows and the current usage as an immutable Snapshot: ``pods`` are every pod the
        store holds (running allocations, placed pods for inter-pod rules), ``pending`` the
        pending ones (nominated nodes). The rows must be current (``stale`` False)."""
        static = self.static
        assert static is not None
        self._generation += 1
        # One pass over every pod (the only one a session makes): a pod's PlacedPod is kept on
        # its entry and made again only when its row or PodInfo changed, since creating tens of
        # thousands of them cost more than the rest of the pass.
        running: list[Allocation] = []
        placed: list[k8s.PlacedPod] = []
        for e in pods:
            h = e.held
            if h.allocation is not None:
                running.append(h.allocation)
            c, info = h.charge, e.info
            if c is None or info is None:
                continue
            p = h.placed
            if p is None or p.node != c.row or p.pod is not info:
                p = h.placed = k8s.PlacedPod(e.uid, c.row, info)
            placed.append(p)
        return self._usage.snapshot(
            static,
            generation=self._generation,
            running=tuple(running),
            placed=tuple(placed),
            nominated=tuple(
                (self.rows[e.task.k8s.nominated_node], e.task)
                for e in pending
                if e.task is not None
                and e.task.k8s is not None
                and e.task.k8s.nominated_node in self.rows
            ),
        )

    # -- charging -------------------------------------------------------------------------------

    def still_free(self, placement: Placement) -> bool:
        """Whether the placement's devices are still free now: the session decided on a
        snapshot, and a list or a read may have charged them since (a pod bound behind our
        back). A placement that no longer fits is decided again by the next session."""
        if self.stale or self.static is None:
            return True  # rows are rebuilt (and checked by the caller) before the next use
        row = self.rows.get(placement.node)
        if row is None:
            return False
        u, static = self._usage, self.static
        slots = self._uuid_slots[row]
        for d in placement.devices:
            slot = slots.get(d.uuid)
            if slot is None:
                return False
            if u.gpu_milli[row, slot] + d.milli > static.gpu_cap_milli[row, slot]:
                return False
            if u.gpu_mem[row, slot] + d.mem_mib > static.gpu_cap_mem[row, slot]:
                return False
            if d.mig is not None:
                idx = self._mig_index.get((row, slot, d.mig.profile, d.mig.start))
                if idx is not None and u.mig_holders[idx] > 0:
                    return False
        return True

    def hold(self, entry: Holder) -> None:
        """Charge what ``entry`` holds to its node's row (nothing if the node is unknown)."""
        held = entry.held
        if held.charge is not None or self.stale:
            return  # a rebuild recharges everything
        row = self.rows.get(entry.node)
        if row is None:
            return
        u = self._usage
        slots = self._uuid_slots[row]
        gpus: list[tuple[int, int, int]] = []
        mig_rows: list[int] = []
        devices: list[DeviceAssignment] = []
        missing: list[str] = []
        for d in entry.devices:
            slot = slots.get(d.uuid)
            if slot is None:
                missing.append(d.uuid)  # a GPU the node does not have: charged below
                continue
            gpus.append((slot, d.milli, d.mem_mib))
            devices.append(dataclasses.replace(d, slot=slot) if slot != d.slot else d)
            if d.mig is not None:
                idx = self._mig_index.get((row, slot, d.mig.profile, d.mig.start))
                if idx is not None:
                    mig_rows.append(idx)
        if entry.foreign_gpus and not entry.devices:
            # Another scheduler's pod: charge whole GPUs on the lowest idle slots.
            assert self.static is not None
            idle = np.flatnonzero(
                self.static.gpu_valid[row] & (u.gpu_clients[row] == 0) & (u.gpu_milli[row] == 0)
            )
            for slot in idle[: entry.foreign_gpus]:
                s = int(slot)
                gpus.append(
                    (
                        s,
                        int(self.static.gpu_cap_milli[row, s]),
                        int(self.static.gpu_cap_mem[row, s]),
                    )
                )
        held.missing_devices = tuple(missing)
        if missing:
            self._charge_missing(row, len(missing), gpus)
        shape = -1
        if entry.task is not None and entry.devices:
            shape = shape_column(entry.task, self._usage.shapes.shape[1] - 1)
        elif entry.foreign_gpus:
            shape = min(entry.foreign_gpus, self._usage.shapes.shape[1] - 1)
        charge = Charge(row, entry.cpu_milli, entry.mem_mib, gpus, mig_rows, shape)
        self.apply(charge, +1)
        held.charge = charge
        if entry.kallot and devices:
            task = entry.task or Task(
                id=entry.uid, cpu_milli=entry.cpu_milli, mem_mib=entry.mem_mib
            )
            held.allocation = Allocation(
                task=task, node_row=row, devices=tuple(devices), started=entry.started
            )

    def _charge_missing(self, row: int, count: int, gpus: list[tuple[int, int, int]]) -> None:
        """A device record names ``count`` GPUs the node does not have (a stale or hand-edited
        record, a GPU gone from the inventory): charge conservatively, one whole idle GPU of
        the node each (lowest slots not charged to this pod already), as for a pod without a
        record. Problem reporting (``kube.schedule.problems``) says so on the pod
        (``Holding.missing_devices``)."""
        assert self.static is not None
        u = self._usage
        taken = {slot for slot, _, _ in gpus}
        idle = np.flatnonzero(
            self.static.gpu_valid[row] & (u.gpu_clients[row] == 0) & (u.gpu_milli[row] == 0)
        )
        for slot in [int(x) for x in idle if int(x) not in taken][:count]:
            gpus.append(
                (
                    slot,
                    int(self.static.gpu_cap_milli[row, slot]),
                    int(self.static.gpu_cap_mem[row, slot]),
                )
            )

    def release(self, entry: Holder) -> None:
        held = entry.held
        if held.charge is not None:
            self.apply(held.charge, -1)
        held.charge = None
        held.allocation = None

    def retask(self, entry: Holder) -> None:
        """The pod's Task was read again (its annotations changed): what preemption reads of
        its running allocation (do-not-disrupt, minimum runtime, its model) follows it; what
        it holds is recharged by the store when that changed."""
        held = entry.held
        if held.allocation is not None and entry.task is not None:
            held.allocation = dataclasses.replace(held.allocation, task=entry.task)

    def apply(self, c: Charge, sign: int) -> None:
        self._usage.apply(c, sign)

    # -- views for metrics and explain -----------------------------------------------------------

    def gpu_allocation(self, pods: Iterable[Holder]) -> dict[tuple[str, str, str], int]:
        """milli-GPU held per (node, model, queue) by pods with devices."""
        out: dict[tuple[str, str, str], int] = {}
        static = self.static
        if static is None:
            return out
        for e in pods:
            c = e.held.charge
            if c is None or not c.gpus:
                continue
            node = static.node_names[c.row]
            queue = e.task.queue if e.task is not None else ""
            for slot, milli, _ in c.gpus:
                code = int(static.gpu_model[c.row, slot])
                model = static.models[code] if code >= 0 else ""
                key = (node, model, queue)
                out[key] = out.get(key, 0) + milli
        return out

    def check(self, pods: Iterable[Holder]) -> None:
        """Recompute usage from the pods' charges and compare (tests and debugging)."""
        if self.static is None or self.stale:
            return
        fresh = Usage.zeros(self.static.n_nodes, self.static.max_gpus, self._usage.mig_holders.size)
        saved = self._usage
        self._usage = fresh
        try:
            for e in pods:
                if e.held.charge is not None:
                    self.apply(e.held.charge, +1)
        finally:
            self._usage = saved
        for name in (
            "cpu",
            "mem",
            "pods",
            "gpu_milli",
            "gpu_mem",
            "gpu_clients",
            "mig_holders",
            "shapes",
        ):
            if not np.array_equal(getattr(fresh, name), getattr(saved, name)):
                raise InvariantViolation(f"cache usage {name} drifted from its pods")
            if (getattr(saved, name) < 0).any():
                raise InvariantViolation(f"cache usage {name} went negative")
