"""The scheduler's cache: the store (kube.state.store), the scheduling queue (kube.state.queue)
and the usage ledger (kube.state.usage) behind the one object the session loop and the binder
use.

Flow: reflectors (kube.watch.reflector) feed the store's ``apply_*`` / ``replace_*`` with watch
events and lists; ``session_input()`` (a Snapshot plus the pending Tasks and Jobs the queue lets
in) is the first stage of the session-input pipeline (kube.state.pipeline); the session loop
(kube.schedule.loop) runs the core, ``assume``s each placement so the next session sees it at
once, and the binder confirms (the watch shows the pod bound) or ``forget``s it; pods the core
could not place are ``park``ed. A pod's GPUs come from its device record (``kallot.io/devices``),
so a restarted scheduler rebuilds exactly what was assigned before it died.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kallot.config import device_record
from kallot.core.decision import Placement
from kallot.core.errors import InvariantViolation
from kallot.core.snapshot import Snapshot
from kallot.core.status import Diagnosis
from kallot.core.workload import Job, Task
from kallot.kube import translate
from kallot.kube.state.queue import FAULT_KIND, CacheTuning, SchedulingQueue
from kallot.kube.state.store import PodEntry, PodState, Store, holds, transition

# The pending reason of a pod whose namespace may not use the queue it names (Queue
# spec.namespaces; translate.queue_refusal).
QUEUE_ACCESS = "QueueAccess"

# Names the session loop, the binder and the tests import from here (defined in kube.state.store and
# kube.state.queue).
__all__ = [
    "FAULT_KIND",
    "Cache",
    "CacheTuning",
    "PodEntry",
    "PodState",
    "SessionInput",
    "record_for",
]


@dataclass(frozen=True, slots=True)
class SessionInput:
    """What one session runs on. Made by ``Cache.session_input``; the pipeline's later stages
    (kube.state.pipeline) each rewrite their own part of ``snapshot`` or ``tasks``."""

    snapshot: Snapshot
    tasks: tuple[Task, ...]
    jobs: Mapping[str, Job]
    waiting: Mapping[str, Diagnosis]  # pods held back before the core (gang without a group)
    # ``Cache.capacity_generation`` when the snapshot was taken: pods this session finds
    # unschedulable are parked with it (``Cache.park``), so capacity freed while the session
    # ran wakes them.
    capacity_generation: int = -1


class Cache(Store):
    """Pods, nodes, pod groups and queues of one cluster, as the scheduler sees them
    (``Store``), with sessions, assume / forget and the scheduling queue on top.

    Not thread-safe: every method runs on the event loop. Snapshots it returns are immutable
    and may be used from a worker thread while the cache keeps changing.
    """

    def __init__(
        self,
        *,
        scheduler_name: str = translate.SCHEDULER_NAME,
        tolerated_taints: frozenset[str] = translate.DEFAULT_TOLERATED_TAINTS,
        tuning: CacheTuning | None = None,
        clock: Any = time.monotonic,
        wall_clock: Any = time.time,
    ) -> None:
        super().__init__(
            scheduler_name=scheduler_name,
            tolerated_taints=tolerated_taints,
            clock=clock,
            wall_clock=wall_clock,
        )
        self.scheduling_queue = SchedulingQueue(tuning or CacheTuning(), self._clock)
        #: eligible pods the last session_input() left for the next session (its cut)
        self.backlog = 0

    @property
    def tuning(self) -> CacheTuning:
        return self.scheduling_queue.tuning

    @tuning.setter
    def tuning(self, tuning: CacheTuning) -> None:
        self.scheduling_queue.tuning = tuning

    # -- assume / confirm / forget -----------------------------------------------------------

    def assume(self, placement: Placement) -> PodEntry | None:
        """Charge a placement before its bind, so the next session sees it. Returns the
        entry, or None when the pod changed since the session (deleted, bound elsewhere) or
        its node is gone."""
        entry = self._pods.get(placement.task_id)
        if entry is None or entry.state is not PodState.PENDING or entry.task is None:
            return None
        if placement.node not in self._nodes:
            return None
        if self.usage.stale and not self._rows_valid(placement):
            return None
        if not self.usage.still_free(placement):
            return None
        transition(entry, PodState.ASSUMED)
        entry.node = placement.node
        entry.devices = placement.devices
        self.scheduling_queue.assumed(entry)
        entry.started = self._wall_clock()
        self.usage.hold(entry)
        return entry

    def _rows_valid(self, placement: Placement) -> bool:
        # Nodes changed during the session: the placement is still good if every device it
        # names is still on that node.
        info = self._nodes.get(placement.node)
        if info is None:
            return False
        uuids = {g.uuid for g in info.spec.gpus}
        return all(d.uuid in uuids for d in placement.devices)

    def forget(self, uid: str, *, reason: str, backoff: bool = True) -> None:
        """A bind failed or was abandoned: release the assumed devices and retry later."""
        entry = self._pods.get(uid)
        if entry is None or entry.state is not PodState.ASSUMED:
            return
        self.usage.release(entry)
        transition(entry, PodState.PENDING)
        self._pending[uid] = entry
        entry.node = ""
        entry.devices = ()
        self.scheduling_queue.back_off_bind(entry, reason, backoff=backoff)
        self._bump_capacity()

    def park(self, uid: str, diagnosis: Diagnosis, *, generation: int | None = None) -> None:
        """The core found no place: wait for a cluster change (or the flush interval).

        ``generation`` is the capacity generation the deciding session's snapshot saw
        (``SessionInput.capacity_generation``); capacity freed after it wakes the pod. Parking
        with the current generation instead would absorb every change made while the session
        ran (a lost wake-up)."""
        entry = self._pods.get(uid)
        if entry is None or entry.state is not PodState.PENDING:
            return
        current = self.capacity_generation
        self.scheduling_queue.park(
            entry, diagnosis, current if generation is None else min(generation, current)
        )

    def back_off_fault(self, uid: str, diagnosis: Diagnosis) -> float:
        """The core faulted on this pod (``Diagnosis.fault``): retry after an exponential
        backoff, whatever the cluster does meanwhile. Returns the delay in seconds."""
        entry = self._pods.get(uid)
        if entry is None or entry.state is not PodState.PENDING:
            return 0.0
        return self.scheduling_queue.back_off_fault(entry, diagnosis)

    def decided(self, uid: str) -> None:
        """The core decided on this pod (placed or not) without faulting on it."""
        entry = self._pods.get(uid)
        if entry is not None:
            self.scheduling_queue.decided(entry)

    def invalid(self, uid: str, text: str) -> None:
        """The pod's request does not translate: ``text`` is its pending reason."""
        entry = self._pods.get(uid)
        if entry is not None:
            self.scheduling_queue.invalid(entry, text)

    # -- sessions ------------------------------------------------------------------------------

    def next_wakeup(self) -> float | None:
        """Seconds until a parked or backed-off pod becomes eligible by time alone."""
        return self.scheduling_queue.next_wakeup(self.pending_pods(), self.capacity_generation)

    def session_input(
        self, *, max_tasks: int = 0, exclude: frozenset[str] = frozenset()
    ) -> SessionInput:
        """Snapshot + eligible pending tasks (priority order, gangs kept whole) + their Jobs.

        At most ``max_tasks`` tasks outside gangs (0: all); pods in ``exclude`` sit this
        session out. ``changed`` stays set when the cut left eligible pods behind (``backlog``
        says how many), so the next session starts at once instead of waiting for a change
        that is not coming: those pods were neither parked nor backed off."""
        self.changed.clear()
        # Passes over the pending pods only: at 50,000 pods in the cluster a pass over every
        # pod costs several milliseconds, and a session made many of them.
        pending = self.pending_pods()
        snapshot = self.snapshot(pending)
        now = self._clock()
        gen = self.capacity_generation
        eligible = self.scheduling_queue.with_gang_peers(
            pending,
            [
                e
                for e in pending
                if self.scheduling_queue.eligible(e, now, gen) and e.uid not in exclude
            ],
            now,
        )
        eligible, backlog = self.scheduling_queue.cut(eligible, max_tasks)
        running: dict[str, int] = {}
        if any(e.task is not None and e.task.job for e in eligible):  # gang members placed
            for e in self._pods.values():
                if (
                    e.kallot
                    and e.task is not None
                    and e.task.job
                    and e.state in (PodState.ASSUMED, PodState.BOUND)
                ):
                    running[e.task.job] = running.get(e.task.job, 0) + 1
        tasks: list[Task] = []
        jobs: dict[str, Job] = {}
        waiting: dict[str, Diagnosis] = {}
        for e in eligible:
            assert e.task is not None
            e.task, derived = self.owners.resolve(e.uid, e.task, waited_s=now - e.queue.first_seen)
            task = e.task
            if derived.wait:
                waiting[e.uid] = Diagnosis.of("Owner", derived.wait)
                continue
            # A gang member naming no queue is charged to its PodGroup's: checked below.
            refused = (task.queue or not task.job) and translate.queue_refusal(
                task.queue, e.namespace, self.queues
            )
            if refused:  # it takes nothing: not in the session, pending with the reason
                waiting[e.uid] = Diagnosis.of(QUEUE_ACCESS, refused)
                continue
            if task.k8s is not None and task.k8s.claims:
                task = dataclasses.replace(
                    task,
                    k8s=dataclasses.replace(
                        task.k8s, volumes=self.volumes.resolve(e.namespace, task.k8s.claims)
                    ),
                )
            if task.job:
                job = self._groups.get(task.job) or derived.job
                if job is None:
                    err = self._group_errors.get(task.job)
                    ns, _, group = task.job.partition("/")
                    msg = (
                        f"PodGroup {task.job} is invalid: {err}"
                        if err
                        else f"waiting for PodGroup {group} in namespace {ns}"
                    )
                    waiting[e.uid] = Diagnosis.of("PodGroup", msg)
                    continue
                gang_queue = "" if task.queue else job.queue  # the PodGroup names it
                refused = gang_queue and translate.queue_refusal(
                    gang_queue, e.namespace, self.queues
                )
                if refused:
                    waiting[e.uid] = Diagnosis.of(QUEUE_ACCESS, refused)
                    continue
                if task.job not in jobs:
                    # Members already placed count towards the gang's minimum.
                    need = max(1, job.min_available - running.get(task.job, 0))
                    jobs[task.job] = dataclasses.replace(job, min_available=need)
            elif max_tasks and len(tasks) >= max_tasks:
                backlog += 1
                continue
            tasks.append(task)
        if any(j.exclusive for j in jobs.values()):  # JobSet/LWS exclusive placement
            held = ((e.task.job, e.node) for e in self._pods.values() if e.task and e.node)
            jobs = self.owners.hold_exclusive(jobs, held)
        self.backlog = backlog
        if backlog:
            self.changed.set()
        return SessionInput(
            snapshot=snapshot,
            tasks=tuple(tasks),
            jobs=jobs,
            waiting=waiting,
            capacity_generation=self.capacity_generation,
        )

    def current_rows(self) -> None:
        """Rebuild the node rows now if the nodes changed since the last snapshot, so that
        ``assume`` checks placements against current usage (not only their node's GPUs)."""
        if self.usage.stale or self.usage.static is None:
            self.usage.rebuild(self._nodes, self._pods.values(), holds)

    def snapshot(self, pending: list[PodEntry] | None = None) -> Snapshot:
        """The current state as an immutable Snapshot (node rows rebuilt only if nodes changed);
        ``pending``: ``pending_pods()`` if the caller has it."""
        if self.usage.stale or self.usage.static is None:
            self.usage.rebuild(self._nodes, self._pods.values(), holds)
        return self.usage.snapshot(
            self._pods.values(), self.pending_pods() if pending is None else pending
        )

    # -- views for metrics and explain -----------------------------------------------------------

    def gpu_allocation(self) -> dict[tuple[str, str, str], int]:
        """milli-GPU held per (node, model, queue) by pods with devices."""
        return self.usage.gpu_allocation(self._pods.values())

    def pending_by_reason(self) -> dict[str, int]:
        return self.scheduling_queue.pending_by_reason(self.pending_pods())

    def check_invariants(self) -> None:
        """Recompute usage from scratch and compare (tests and debugging)."""
        if self.usage.static is None or self.usage.stale:
            return
        self.usage.check(self._pods.values())
        for e in self._pods.values():
            if e.held.charge is not None and e.state not in (PodState.ASSUMED, PodState.BOUND):
                raise InvariantViolation(f"pod {e.key} is {e.state.value} and holds devices")


def record_for(placement: Placement) -> device_record.DeviceRecord:
    return device_record.DeviceRecord.of(placement)
