"""``Session``: one scheduling period. Owns the Scratch, the Statement, the seeded node order
and the per-session plugin caches; ``place`` runs the Framework for one task.

Failure isolation: ``place`` (one task) and ``isolated`` (a gang, in the actions) are the
boundaries where an exception from a plugin or action is caught. Everything the failed task or
gang wrote is rolled back and it is rejected with a fault Diagnosis (``fault_diagnosis``) naming
the plugin, the exception and the line that raised it; every other task of the session is placed as
usual. ``core.errors.InvariantViolation`` is not caught: it means the session's own state is
no longer trustworthy.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Iterator, Mapping

import numpy as np

from kallot.core import fit
from kallot.core.decision import DeviceAssignment, Placement, Unschedulable
from kallot.core.errors import InvariantViolation
from kallot.core.framework.cycle import JOBS, Cycle, CycleState, SessionState
from kallot.core.framework.plugin import ShareChoice
from kallot.core.framework.runner import Framework
from kallot.core.session.statement import Statement
from kallot.core.snapshot import Scratch, Snapshot
from kallot.core.status import FAULT, NOT_EXPLAINED, Code, Diagnosis, Reason
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
        self.shared.put(JOBS, jobs)
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
            journal=self.statement,
        )

    def next_attempt(self) -> int:
        self._attempt += 1
        return self._attempt - 1

    def place(self, task: Task) -> Placement | Diagnosis:
        """Find a node and devices for ``task`` and allocate it through the Statement. A fault
        while doing so (any exception but an InvariantViolation) is rolled back and returned as
        a fault Diagnosis."""
        checkpoint = self.statement.checkpoint()
        try:
            return self._place(task)
        except InvariantViolation:
            raise
        except Exception as exc:  # a plugin bug must cost this task only, not the session
            self.statement.rollback(checkpoint)
            return fault_diagnosis(self.framework, exc)

    def _place(self, task: Task) -> Placement | Diagnosis:
        fw = self.framework
        cycle = self.cycle()
        status = fw.pre_filter(cycle, task)
        if not status.ok:
            unresolvable = status.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE
            return Diagnosis.of(status.plugin, status.reason, unresolvable=unresolvable)
        candidates = fw.feasible(cycle, task)
        if candidates.size == 0:
            return fw.diagnose(self.cycle(), task) if self.explain else NOT_EXPLAINED
        totals = fw.score(cycle, task, candidates)
        passed = candidates.size
        while candidates.size:
            node = fw.select(cycle, candidates, totals)
            placement = self.commit(cycle, task, node)
            if placement is not None:
                return placement
            # Every filter admitted the node but no device choice holds the task there (a
            # filter more lenient than the device choice): the next best node.
            keep = candidates != node
            candidates, totals = candidates[keep], totals[keep]
        message = (
            f"{passed} node{'s' if passed != 1 else ''} passed every filter but none has "
            "devices that take the request"
        )
        return Diagnosis(
            reasons=(Reason("DeviceChoice", message, passed),),
            nodes_considered=self.snapshot.n_nodes,
            summary=f"0/{self.snapshot.n_nodes} nodes are available: {message}",
        )

    @contextlib.contextmanager
    def isolated(self, tasks: Iterable[Task]) -> Iterator[None]:
        """Run an action's work for ``tasks`` (a gang) as one unit: on a fault, undo what it
        wrote and what it reported, and reject every task with the fault Diagnosis."""
        checkpoint = self.statement.checkpoint()
        reported = len(self.unschedulable)
        try:
            yield
        except InvariantViolation:
            raise
        except Exception as exc:  # a plugin bug must cost this gang only, not the session
            self.statement.rollback(checkpoint)
            del self.unschedulable[reported:]
            diagnosis = fault_diagnosis(self.framework, exc)
            for task in tasks:
                self.reject(task, diagnosis)

    def commit(self, cycle: Cycle, task: Task, node: int) -> Placement | None:
        """Choose the task's devices on ``node`` (a node every filter admitted) and allocate it
        through the Statement; a MIG request may first reconfigure the GPU (an explicit,
        undoable Statement step). None if the node has no MIG instance to give after all, or a
        Reserve plugin finds it cannot take the task (its DRA claims) after all."""
        fw = self.framework
        req = task.gpu
        checkpoint = self.statement.checkpoint()
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
            if req is not None and req.count > 0 and len(set(slots)) != req.count:
                return None  # no device choice on this node holds the request
            devices = fit.assign(self.snapshot, node, slots, req) if req else ()
        # Reserve: the claim allocations on this node, decided once (the shell writes these).
        claims = fw.reserve(cycle, task, node) if fw.reserves else None
        if isinstance(claims, str):
            self.statement.rollback(checkpoint)  # a MIG re-layout made for this node
            return None
        placement = Placement(
            task_id=task.id,
            node=self.snapshot.node_names[node],
            node_row=node,
            devices=devices,
            claims=claims,
            attempt=self.next_attempt(),
        )
        self.statement.allocate(placement, task)
        return placement

    def reject(self, task: Task, diagnosis: Diagnosis) -> None:
        self.unschedulable.append(
            Unschedulable(task_id=task.id, diagnosis=diagnosis, attempt=self.next_attempt())
        )


# Libraries the core calls into: a fault is located at the last line of our code that called them.
_LIBRARIES = frozenset({"numpy", "highspy"})


def _basename(path: str) -> str:
    """The file name of a code object's path (string work only: the core imports no ``os``)."""
    return path.rsplit("/", maxsplit=1)[-1]


def fault_diagnosis(framework: Framework, exc: BaseException) -> Diagnosis:
    """A Diagnosis for a task that a fault, not the cluster, kept from being placed: which
    plugin raised what, and the line that raised it."""
    by_instance = {id(p): name for name, p in framework.plugins.items()}
    plugin = ""
    where = ""
    tb = exc.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if owner is not None and id(owner) in by_instance:
            plugin = by_instance[id(owner)]
        code = tb.tb_frame.f_code
        module = str(tb.tb_frame.f_globals.get("__name__", ""))
        if module.split(".", maxsplit=1)[0] not in _LIBRARIES:
            where = f"{_basename(code.co_filename)}:{tb.tb_lineno} in {code.co_name}"
        tb = tb.tb_next
    text = str(exc)
    if len(text) > 200:
        text = text[:200] + "..."
    what = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    origin = f"plugin {plugin}" if plugin else "the scheduler"
    message = (
        f"kallot fault while placing this pod: {origin} raised {what}"
        + (f" ({where})" if where else "")
        + "; other pods are scheduled as usual, this one is retried with backoff"
    )
    return Diagnosis(
        reasons=(Reason(plugin or FAULT, message, 0),),
        summary=message,
        fault=f"{plugin or FAULT}: {what}",
    )
