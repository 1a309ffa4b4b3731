"""``Session``: one scheduling period. Owns the Scratch, the Statement, the seeded node order
and the per-session plugin caches; ``place`` runs the Framework for one task.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from kallot.core import fit
from kallot.core.decision import DeviceAssignment, Placement, Unschedulable
from kallot.core.framework.cycle import Cycle, CycleState, SessionState
from kallot.core.framework.plugin import ShareChoice
from kallot.core.framework.runner import Framework
from kallot.core.session.statement import Statement
from kallot.core.snapshot import Scratch, Snapshot
from kallot.core.status import NOT_EXPLAINED, Diagnosis
from kallot.core.workload import Job, Task


class Session:
    """State of one ``Scheduler.run_session`` call. Not thread-safe; lives for one call."""

    def __init__(
        self,
        framework: Framework,
        snapshot: Snapshot,
        *,
        now: float,
        rng: np.random.Generator,
        jobs: Mapping[str, Job],
        explain: bool = True,
    ) -> None:
        self.framework = framework
        self.snapshot = snapshot
        self.scratch = Scratch.of(snapshot)
        self.statement = Statement(snapshot, self.scratch)
        self.rng = rng
        self.now = now
        self.jobs = jobs
        self.explain = explain
        # Seeded node order for ties, drawn once per session (the FGD simulator renames nodes
        # with a random prefix once per experiment; selectHost then takes the smallest name).
        self.tie_rank = rng.permutation(snapshot.n_nodes).astype(np.int64)
        self.shared = SessionState()
        self.unschedulable: list[Unschedulable] = []
        self._attempt = 0

    def cycle(self) -> Cycle:
        return Cycle(
            snapshot=self.snapshot,
            scratch=self.scratch,
            rng=self.rng,
            tie_rank=self.tie_rank,
            now=self.now,
            state=CycleState(),
            session=self.shared,
        )

    def next_attempt(self) -> int:
        self._attempt += 1
        return self._attempt - 1

    def place(self, task: Task) -> Placement | Diagnosis:
        """Find a node and devices for ``task`` and allocate it through the Statement."""
        fw = self.framework
        cycle = self.cycle()
        status = fw.pre_filter(cycle, task)
        if not status.ok:
            return Diagnosis.of(status.plugin, status.reason)
        candidates = fw.feasible(cycle, task)
        if candidates.size == 0:
            return fw.diagnose(self.cycle(), task) if self.explain else NOT_EXPLAINED
        totals = fw.score(cycle, task, candidates)
        node = fw.select(cycle, candidates, totals)
        placement = self.commit(cycle, task, node)
        assert placement is not None, "a node that passed every filter must take the task"
        return placement

    def commit(self, cycle: Cycle, task: Task, node: int) -> Placement | None:
        """Choose the task's devices on ``node`` (a node every filter admitted) and allocate it
        through the Statement; a MIG request may first reconfigure the GPU (an explicit,
        undoable Statement step). None if the node has no MIG instance to give after all."""
        fw = self.framework
        req = task.gpu
        choice = None
        if req is not None and fw.mig is not None and fw.mig.serves(cycle, task):
            choice = fw.mig.choose_mig(cycle, task, node)
            if choice is None:
                return None
        elif req is not None and req.mig_profile:
            return None
        if isinstance(choice, ShareChoice):
            assert req is not None
            devices: tuple[DeviceAssignment, ...] = fit.assign(
                self.snapshot, node, (choice.slot,), req
            )
        elif choice is not None:
            if choice.reconfiguration is not None:
                rec = dataclasses.replace(choice.reconfiguration, for_task=task.id)
                self.statement.reconfigure(node, rec)
            devices = (fit.mig_assignment(self.snapshot, node, choice.slot, choice.instance),)
        else:
            slots = fw.choose_devices(cycle, task, node)
            devices = fit.assign(self.snapshot, node, slots, req) if req else ()
        placement = Placement(
            task_id=task.id,
            node=self.snapshot.node_names[node],
            node_row=node,
            devices=devices,
            attempt=self.next_attempt(),
        )
        self.statement.allocate(placement, task)
        return placement

    def reject(self, task: Task, diagnosis: Diagnosis) -> None:
        self.unschedulable.append(
            Unschedulable(task_id=task.id, diagnosis=diagnosis, attempt=self.next_attempt())
        )
