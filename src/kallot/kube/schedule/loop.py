"""The live scheduler's session loop: wait for work, build the session's input, run the core,
carry out the Decision, then the post-steps.

Where it sits: the composition root (``kube.app``) builds it and runs ``run`` once the caches
are usable. One session (``schedule_once``):

1. problem reports (``kube.schedule.problems``) and the session's actions from the Queues
   (``kube.schedule.actions``: given to the core per session, the scheduler never changes);
2. the input from the pipeline (``kube.state.pipeline``: cache -> MIG adjust -> DRA attach),
   without the pods that sit out (preemptors waiting for victims: ``kube.schedule.evictor``;
   pods whose MIG re-layout is in flight: ``kube.schedule.migplan``); the pods held back
   before the core are parked and told why;
3. the core's ``Scheduler.run_session`` in a worker thread (CPU-bound numpy; the event loop
   keeps serving watches and binds meanwhile);
4. evictions and MIG re-layouts carried out (their placements wait), each other placement
   ``assume``d at once (the next session sees it) and handed to the binder; each
   unschedulable pod parked, its Diagnosis an Event and its ``PodScheduled`` condition;
5. the session observers (``session_observers``: per-session hooks such as autoscaling,
   ``kube.autoscale.scaleup``), in order, with the session's input and Decision, once the node list is
   complete.

Only the leader runs sessions; a new leader re-lists pods and nodes before its first one, so it
starts from what the API says, not from a cache that may lag behind the previous leader's binds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

import numpy as np

from kallot.core.actions import Action
from kallot.core.decision import Decision, Placement
from kallot.core.scheduler import Scheduler
from kallot.core.status import Diagnosis
from kallot.kube.bind.binder import Binder
from kallot.kube.dra.cache import DraCache
from kallot.kube.ops.leader import LeaderElector
from kallot.kube.ops.metrics import Metrics
from kallot.kube.ops.reporter import Reporter
from kallot.kube.ops.sizing import SessionSizer
from kallot.kube.schedule.actions import SessionActions
from kallot.kube.schedule.evictor import Evictor
from kallot.kube.schedule.migplan import MigPlanner
from kallot.kube.schedule.problems import Problems, pod_ref
from kallot.kube.state.cache import Cache, PodState, SessionInput
from kallot.kube.state.pipeline import SessionPipeline
from kallot.kube.watch.reflector import Reflector

logger = logging.getLogger(__name__)

# Why a pod the first sessions could not place (nodes still listing) waits, without a report.
NODES_LISTING = Diagnosis.of("NodeList", "waiting for the rest of the node list")
HANDOFF_CHUNK = 256  # placements assumed and handed to the binder between yields to the loop


# Called with a session's input and Decision once the node list is complete, on the event
# loop: must be quick (start a task for slow work) and must not raise (a raise counts as a
# failed session). Autoscaling reads the pods no node could hold from it (kube.autoscale.scaleup).
SessionObserver = Callable[[SessionInput, Decision], None]


class SessionLoop:
    """Runs the sessions of one process. Not thread-safe: runs on the event loop (the core
    alone runs in a worker thread)."""

    def __init__(
        self,
        *,
        scheduler: Scheduler,
        cache: Cache,
        pipeline: SessionPipeline,
        actions: SessionActions,
        binder: Binder,
        dra: DraCache,
        migplan: MigPlanner,
        evictor: Evictor,
        problems: Problems,
        reporter: Reporter,
        metrics: Metrics,
        sizer: SessionSizer,
        reflectors: Mapping[str, Reflector],
        elector: LeaderElector | None,
        stop: asyncio.Event,
        first_handoff: asyncio.Event,
        seed: int = 0,
        idle_wait_s: float = 5.0,
    ) -> None:
        self.scheduler = scheduler
        self.cache = cache
        self.pipeline = pipeline
        self.actions = actions
        self.binder = binder
        self.dra = dra
        self.migplan = migplan
        self.evictor = evictor
        self.problems = problems
        self.reporter = reporter
        self.metrics = metrics
        self.sizer = sizer
        self.reflectors = reflectors
        self.elector = elector
        self.rng = np.random.default_rng(seed)
        self.idle_wait_s = idle_wait_s
        self.session_observers: list[SessionObserver] = []
        self._stop = stop
        # Set once the first session's placements are with the binder (or no session is
        # coming soon: a standby, a failed or empty first session); the nodes after the
        # first page are listed from then on.
        self._first_handoff = first_handoff
        self.sessions = 0
        self.binds_done = 0  # binds that succeeded (the sizer keeps the binder fed)
        self.failed_sessions = 0  # sessions in a row that raised
        self.beat = time.monotonic()  # the loop's last heartbeat (/healthz)

    def bind_done(self) -> None:
        self.binds_done += 1

    def nodes_partial(self) -> bool:
        """The first list of nodes is still arriving (sessions run on the nodes so far)."""
        return not self.reflectors["nodes"].synced.is_set()

    # -- the loop -------------------------------------------------------------------------------

    async def run(self) -> int:
        """Sessions while this process leads: 0 once stopped, 1 once leadership is lost."""
        if self.elector is not None:
            self._first_handoff.set()  # a standby keeps every list whole
            elected = asyncio.ensure_future(self.elector.elected.wait())
            stop = asyncio.ensure_future(self._stop.wait())
            while not self.elector.is_leader and not self._stop.is_set():
                self.beat = time.monotonic()
                await asyncio.wait(
                    {elected, stop}, timeout=5.0, return_when=asyncio.FIRST_COMPLETED
                )
            elected.cancel()
            stop.cancel()
            if self._stop.is_set():
                return 0
            # The previous leader's last binds may not have reached our watch yet.
            await asyncio.gather(
                self.reflectors["pods"].relist(), self.reflectors["nodes"].relist()
            )
            logger.info("leading identity=%s", self.elector.identity)
        while not self._stop.is_set():
            if self.elector is not None and not self.elector.is_leader:
                return 1
            self.beat = time.monotonic()
            await self.wait_for_work()
            if self._stop.is_set():
                break
            if self.elector is not None and not self.elector.is_leader:
                return 1
            try:
                await self.schedule_once()
                self.failed_sessions = 0
                self._first_handoff.set()
            except Exception:
                self._first_handoff.set()
                # Not a pod's fault (those are isolated in the core): the snapshot, the cache or
                # the loop. Counted, and /readyz reports a run of them.
                self.failed_sessions += 1
                self.metrics.session_failures.inc()
                logger.exception("session failed in_a_row=%d", self.failed_sessions)
                await asyncio.sleep(min(30.0, float(2 ** min(self.failed_sessions - 1, 5))))
        return 0

    async def wait_for_work(self) -> None:
        """Return at once while the cache has work (``changed``: new pods, freed capacity, or
        eligible pods the last session's cut left behind); otherwise wait for a change, the
        next parked or backed-off pod's retry time, or the idle timeout. The binds of the
        previous session are not waited for: they run on the event loop meanwhile."""
        if self.cache.changed.is_set():
            return
        idle = self.idle_wait_s
        timeout = self.cache.next_wakeup()
        timeout = idle if timeout is None else min(idle, max(0.01, timeout))
        waiters = {
            asyncio.ensure_future(self.cache.changed.wait()),
            asyncio.ensure_future(self._stop.wait()),
        }
        if self.elector is not None:
            waiters.add(asyncio.ensure_future(self.elector.lost.wait()))
        try:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()

    async def fresh_lists(self, timeout: float = 1.0) -> int | None:
        """Wait (up to ``timeout``) until the pods and nodes reflectors hold a complete list
        (not mid-resync); returns how many lists they have taken, None if still listing."""
        mirrors = [self.reflectors[n] for n in ("pods", "nodes") if n in self.reflectors]
        try:
            await asyncio.wait_for(asyncio.gather(*(r.fresh.wait() for r in mirrors)), timeout)
        except TimeoutError:
            return None
        return sum(r.lists for r in mirrors)

    # -- one session ----------------------------------------------------------------------------

    async def schedule_once(self) -> int:
        """One session over the eligible pending pods; returns how many were placed."""
        # Never on a cache mid-resync (a 410 re-list): wait until pods and nodes are whole
        # again, and drop a decision taken on a snapshot from before a list landed.
        lists = await self.fresh_lists()
        if lists is None:
            return 0  # still listing: the loop comes back (and keeps beating meanwhile)
        self.problems.report_invalid()
        self.problems.report_pods()
        self.problems.report_nodes()
        actions = self.actions.for_session()
        start = time.monotonic()
        # The sizer is fed the CPU the session itself used (this thread's for the input and
        # the hand-off, the worker's for the core), not wall time: binds and watch events
        # share the interpreter meanwhile and would make every pod look dearer than it is.
        cpu = time.thread_time()
        sitting_out = self.evictor.sitting_out()
        sitting_out |= self.migplan.waiting()  # their MIG re-layout is not advertised yet
        # Start-up: the first sessions run on the nodes listed so far (docs/design/003,
        # "Start-up"); what they could not place may fit on a node still to come.
        partial = self.nodes_partial()
        inp = self.pipeline.build(max_tasks=self.sizer.next_size(), exclude=sitting_out)
        self.problems.report_owner_notes()
        for uid, diagnosis in inp.waiting.items():
            entry = self.cache.pod(uid)
            if entry is not None:
                self.cache.park(uid, diagnosis, generation=inp.capacity_generation)
                self.reporter.unschedulable(pod_ref(entry), diagnosis.message(), entry.reason_kind)
        if not inp.tasks:
            return 0
        cpu = time.thread_time() - cpu
        binds = self.binds_done
        decision, core_cpu = await asyncio.to_thread(self._run_core, inp, actions)
        cpu += core_cpu
        wall = time.monotonic() - start
        self.sizer.fed(
            (self.binds_done - binds) / max(wall, 1e-3), wall, dry=self.binder.in_flight == 0
        )
        self.sessions += 1
        if await self.fresh_lists() != lists:
            logger.info("session dropped: the cache was re-listed while it ran")
            return 0
        placed, handoff_cpu = await self._carry_out(inp, decision, partial)
        cpu += handoff_cpu
        took = time.monotonic() - start
        self.sizer.observe(len(inp.tasks), cpu, took)
        self.metrics.session_duration.observe(took)
        self.metrics.session_pods.observe(len(inp.tasks))
        self.metrics.attempts.labels("scheduled").inc(placed)
        self.metrics.attempts.labels("unschedulable").inc(len(decision.unschedulable))
        logger.info(
            "session pods=%d placed=%d unschedulable=%d evictions=%d nodes=%d backlog=%d "
            "took=%.3fs cpu=%.3fs",
            len(inp.tasks),
            placed,
            len(decision.unschedulable),
            len(decision.evictions),
            inp.snapshot.n_nodes,
            self.cache.backlog,
            took,
            cpu,
        )
        return placed

    def _run_core(self, inp: SessionInput, actions: tuple[Action, ...]) -> tuple[Decision, float]:
        """The core's session (in a worker thread), and the CPU time it took there."""
        cpu = time.thread_time()
        decision = self.scheduler.run_session(
            inp.snapshot, inp.tasks, now=time.time(), rng=self.rng, jobs=inp.jobs, actions=actions
        )
        return decision, time.thread_time() - cpu

    async def _carry_out(
        self, inp: SessionInput, decision: Decision, partial: bool
    ) -> tuple[int, float]:
        """Evictions, MIG plans, assumes and binds, parks and reports of one Decision; returns
        how many placements went to the binder, and the CPU time this thread spent on it
        (without the binds and watch events that ran at its yields to the event loop)."""
        cpu = 0.0
        mark = time.thread_time()
        if partial:
            held = self._held_while_partial(decision)
        else:
            held = self.evictor.carry_out(decision)
            held |= self.migplan.carry_out(  # bound once the node advertises the new layout
                decision,
                {
                    r.for_task: pod_ref(e)
                    for r in decision.reconfigurations
                    if (e := self.cache.pod(r.for_task)) is not None
                },
            )
        # Nodes changed while the session ran: rows rebuilt now, so that ``assume`` checks
        # each placement against the current usage.
        self.cache.current_rows()
        placed = 0
        for i, p in enumerate(decision.placements):
            if i and i % HANDOFF_CHUNK == 0:
                # Let the binds of what is handed over already go out (and the watch be read):
                # thousands of assumes in one go would stall them for a noticeable time.
                cpu += time.thread_time() - mark
                await asyncio.sleep(0)
                mark = time.thread_time()
            if p.task_id in held:
                if partial:  # decided again once more nodes are in
                    self.cache.park(p.task_id, NODES_LISTING, generation=inp.capacity_generation)
                continue  # placed by a later session, once its victims are gone
            if not self._plan_claims(p):
                continue  # its claims no longer fit there; it is re-decided later
            entry = self.cache.assume(p)
            if entry is None:
                self.dra.drop(p.task_id, allocations=True)
                continue  # deleted or changed during the session; it is re-decided later
            placed += 1
            self.binder.submit(p, entry.namespace, entry.name)
        for u in decision.unschedulable:
            entry = self.cache.pod(u.task_id)
            if entry is None or entry.state is not PodState.PENDING:
                continue
            if u.diagnosis.fault:
                self.problems.fault(entry, u.diagnosis)
                continue
            self.cache.decided(entry.uid)
            message = self.dra.unschedulable(u.task_id, u.diagnosis.message())
            if message is None:
                self.cache.changed.set()  # its extended resources by DRA, next session
                continue
            self.cache.park(u.task_id, u.diagnosis, generation=inp.capacity_generation)
            if not partial:  # with nodes still to come, no report: it may fit on one of them
                self.reporter.unschedulable(pod_ref(entry), message, entry.reason_kind)
        if not partial:
            for observe in self.session_observers:
                observe(inp, decision)
        cpu += time.thread_time() - mark
        return placed, cpu

    def _held_while_partial(self, decision: Decision) -> set[str]:
        """Nodes still listing: placements that need victims or a MIG re-layout are not
        carried out (a node not listed yet may have room without them), nor the placements
        of the other members of those gangs; they are decided again once more nodes are in."""
        held = {ev.for_task for ev in decision.evictions}
        held |= {r.for_task for r in decision.reconfigurations}
        if not held:
            return held
        jobs = {
            e.task.job
            for uid in held
            if (e := self.cache.pod(uid)) is not None and e.task is not None and e.task.job
        }
        for p in decision.placements:
            entry = self.cache.pod(p.task_id)
            if entry is not None and entry.task is not None and entry.task.job in jobs:
                held.add(p.task_id)
        return held

    def _plan_claims(self, p: Placement) -> bool:
        """DRA: the placed pod's claim allocations as the session decided them (kept in
        flight for the binder); False when what they were decided on changed meanwhile."""
        entry = self.cache.pod(p.task_id)
        if entry is None or entry.task is None or entry.task.k8s is None:
            return True
        if not entry.task.k8s.resource_claims and p.task_id not in self.dra.extended:
            return True
        plan, reason = self.dra.reserve(p.task_id, entry.task, p)
        if plan is None:
            logger.info("claims no longer fit pod=%s node=%s why=%s", entry.key, p.node, reason)
            return False
        return True
