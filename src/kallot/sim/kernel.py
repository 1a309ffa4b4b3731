"""The simulation kernel every ``kallot sim`` command with time in it runs on: a virtual clock
with an event heap (``Clock``) and a simulated cluster (``Cluster``) that applies Decisions,
keeps usage and yields Snapshots.

Where it sits: between the workload generators and metrics of ``sim.openb``, ``sim.replay``,
``sim.tenants``, ``sim.training`` and ``sim.serving`` and the core. A simulator pushes its
events (arrivals, completions, scheduling ticks) on the Clock and handles them as they pop; when
it schedules it takes ``Cluster.snapshot()``, calls ``Scheduler.run_session`` and hands the
Decision back with ``Cluster.apply`` (or ``place`` / ``release`` per pod). Usage is the core's
(``core.usage``), the same accounting the live scheduler's cache keeps, so a simulated and a
live cluster turn what runs into a Snapshot the same way. Nothing here reads the wall clock.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Generic, TypeVar

import numpy as np

from kallot.core.decision import Decision, MigReconfiguration, Placement
from kallot.core.errors import InvariantViolation
from kallot.core.snapshot import Allocation, MigLayout, Snapshot
from kallot.core.usage import Charge, Usage
from kallot.core.workload import Task

E = TypeVar("E")


class Clock(Generic[E]):
    """Virtual time and its events. Events pop in (time, priority, sequence) order: the earliest
    first, at equal times the lowest priority first, then in the order they were pushed (the
    sequence number keeps the order total, so events themselves are never compared and the same
    pushes always pop the same way). ``now`` is the time of the last event popped."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self._heap: list[tuple[float, int, int, E]] = []
        self._seq = 0

    def push(self, time: float, event: E, priority: int = 0) -> None:
        """Schedule ``event`` at ``time`` (not before ``now``: the past cannot change)."""
        if time < self.now:
            raise InvariantViolation(f"event {event!r} at {time} is before now ({self.now})")
        self._seq += 1
        heapq.heappush(self._heap, (time, priority, self._seq, event))

    def __len__(self) -> int:
        return len(self._heap)

    def next_time(self) -> float:
        """Time of the next event (infinity when none is left)."""
        return self._heap[0][0] if self._heap else float("inf")

    def pop(self) -> E:
        """The next event; the clock moves to its time."""
        time, _, _, event = heapq.heappop(self._heap)
        self.now = time
        return event

    def batch(self) -> list[E]:
        """Every event at the next event's time, in order; the clock moves to that time."""
        time = self.next_time()
        out = [self.pop()]
        while self._heap and self._heap[0][0] == time:
            out.append(self.pop())
        return out


@dataclass(slots=True)
class Applied:
    """What ``Cluster.apply`` did with one Decision: the allocations it evicted (as they were)
    and the ones it started, each in the Decision's order."""

    evicted: list[Allocation] = field(default_factory=list)
    placed: list[Allocation] = field(default_factory=list)


class Cluster:
    """A simulated cluster: fixed node rows (``base``), the core Usage of what runs on them and
    the running Allocations by task id.

    ``show_running=False`` gives sessions Snapshots without the running allocations (usage
    only): for simulators whose sessions never disrupt and whose policies should learn their
    target workload from the pending work alone (``sim.training``, ``sim.serving``).
    """

    def __init__(self, base: Snapshot, *, show_running: bool = True) -> None:
        self.base = base
        self.usage = Usage.of(base)
        self.show_running = show_running
        self.running: dict[str, Allocation] = {}
        self._charges: dict[str, Charge] = {}

    def snapshot(self, generation: int = 0) -> Snapshot:
        """The cluster now, frozen (core.usage: the one way usage becomes a Snapshot)."""
        running = tuple(self.running.values()) if self.show_running else ()
        return self.usage.snapshot(self.base, generation=generation, running=running)

    def place(self, placement: Placement, task: Task, now: float) -> Allocation:
        """Start ``task`` where ``placement`` puts it, charging its devices."""
        if task.id in self.running:
            raise InvariantViolation(f"task {task.id} placed while it runs")
        charge = Charge.of(self.base, task, placement.node_row, placement.devices)
        self.usage.apply(charge, +1)
        alloc = Allocation(
            task=task, node_row=placement.node_row, devices=placement.devices, started=now
        )
        self.running[task.id] = alloc
        self._charges[task.id] = charge
        return alloc

    def release(self, task_id: str) -> Allocation:
        """Stop ``task_id`` (completed or evicted), releasing exactly what it was charged."""
        alloc = self.running.pop(task_id)
        self.usage.apply(self._charges.pop(task_id), -1)
        return alloc

    def apply(self, decision: Decision, tasks: Mapping[str, Task], now: float) -> Applied:
        """Carry out ``decision`` at ``now``: its evictions first, then its MIG
        reconfigurations, then its placements (tasks by id from ``tasks``)."""
        out = Applied()
        for e in decision.evictions:
            out.evicted.append(self.release(e.task_id))
        for rec in decision.reconfigurations:
            self.reconfigure(rec)
        for p in decision.placements:
            out.placed.append(self.place(p, tasks[p.task_id], now))
        return out

    def reconfigure(self, rec: MigReconfiguration) -> None:
        """Change one GPU's MIG layout as a node agent would: the destroyed instances (idle)
        leave the layout, the created ones join it idle; running pods keep their instances."""
        m, holders = self.base.mig, self.usage.mig_holders
        row = self.base.node_row(rec.node)
        gone = {(i.profile, i.start) for i in rec.destroy}
        keep = [
            r
            for r in range(m.node.size)
            if not (
                int(m.node[r]) == row
                and int(m.slot[r]) == rec.slot
                and (m.profiles[int(m.profile[r])], int(m.start[r])) in gone
            )
        ]
        if m.node.size - len(keep) != len(gone):
            raise InvariantViolation(
                f"MIG reconfiguration of {rec.node}/{rec.slot}: {rec.destroy} not all there"
            )
        if any(holders[r] for r in set(range(m.node.size)) - set(keep)):
            raise InvariantViolation(
                f"MIG reconfiguration of {rec.node}/{rec.slot} destroys a held instance"
            )
        profiles = tuple(sorted({*m.profiles, *(i.profile for i in rec.create)}))
        code = [profiles.index(p) for p in m.profiles]
        k = len(rec.create)
        layout = MigLayout(
            profiles=profiles,
            node=np.concatenate([m.node[keep], np.full(k, row, np.int32)]),
            slot=np.concatenate([m.slot[keep], np.full(k, rec.slot, np.int32)]),
            profile=np.array(
                [code[int(m.profile[r])] for r in keep]
                + [profiles.index(i.profile) for i in rec.create],
                np.int32,
            ),
            start=np.concatenate(
                [m.start[keep], np.array([i.start for i in rec.create], np.int32)]
            ),
            used=np.zeros(len(keep) + k, np.bool_),  # the Usage says what is held
        )
        for a in (layout.node, layout.slot, layout.profile, layout.start, layout.used):
            a.flags.writeable = False
        self.base = replace(self.base, mig=layout)
        self.usage.mig_holders = np.concatenate([holders[keep], np.zeros(k, np.int32)])
        moved = {old: new for new, old in enumerate(keep)}
        for tid, c in self._charges.items():
            if c.mig_rows:
                self._charges[tid] = replace(c, mig_rows=[moved[r] for r in c.mig_rows])

    def used_milli(self) -> int:
        """milli-GPU allocated now."""
        return int(self.usage.gpu_milli.sum())
