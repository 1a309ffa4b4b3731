"""The live scheduler's main loop: watch -> cache -> session -> assume -> bind, with leader
election, events, metrics and graceful shutdown around it.

Flow of one session: when the cluster has ``Queue`` objects the session runs the core's queue
actions (fair share, reclaim, preemption) instead of plain allocation;
``Cache.session_input()`` gives a Snapshot and the eligible pending Tasks;
the core's ``Scheduler.run_session`` runs in a worker thread (it is CPU-bound numpy; the event
loop keeps serving watches and binds meanwhile); each Placement is ``assume``d at once (the next
session sees it) and handed to the Binder; each unschedulable Task is parked and its Diagnosis
written as an Event and the ``PodScheduled`` condition. Only the leader runs sessions; a new
leader re-lists pods before its first one, so it starts from what the API says, not from a
cache that may lag behind the previous leader's binds.

Evictions: a placement that needs victims is not bound in the session that decided it. The
victims are evicted through the Eviction API (PodDisruptionBudgets and grace periods hold) and
the preemptor sits out of sessions until they are gone (or ``preemption_wait_s`` passes); the
next session then places it on the capacity they freed, deciding afresh. Until then no other
victims are chosen for it, so one preemptor never evicts twice for the same need.

Long module: the controller is the live scheduler's composition root and its session loop: it
wires the reflectors, the cache, the binder, DRA, MIG plans, queues and leadership, and runs
the one loop that hands sessions to the binder. The jobs themselves live in their own modules
(store, queue, usage, binder, dra_*, migplan, sizing, reporter); what stays here is the order
in which they run.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import ssl
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kallot.config import tls, wire
from kallot.core.actions import Action
from kallot.core.actions.queue import queue_actions
from kallot.core.decision import Decision, Eviction, Placement
from kallot.core.errors import ConfigError
from kallot.core.queueing.queue_tree import QueueTree
from kallot.core.scheduler import Scheduler
from kallot.core.status import Diagnosis
from kallot.core.workload import Task
from kallot.k8sclient.delegated import DelegatedAuth
from kallot.kube import logs, owners
from kallot.kube.binder import Binder
from kallot.kube.client import ApiError, KubeClient
from kallot.kube.dra_cache import DEVICE_CLASSES, RESOURCE_CLAIMS, RESOURCE_SLICES, DraCache
from kallot.kube.leader import LeaderElector
from kallot.kube.metrics import HealthServer, Metrics
from kallot.kube.reporter import REASON_NO_GANG, PodRef, Reporter
from kallot.kube.schedule.migplan import MigPlanner
from kallot.kube.sizing import SessionSizer, SessionSizing
from kallot.kube.state import translate
from kallot.kube.state.cache import FAULT_KIND, Cache, CacheTuning, PodEntry, PodState, SessionInput
from kallot.kube.status import StatusWriter
from kallot.kube.watch.reflector import Reflector

logger = logging.getLogger(__name__)

# /readyz answers 503 after this many sessions in a row raised.
FAILED_SESSIONS_NOT_READY = 3

CRD_GROUP = wire.CRD_GROUP
# Why a pod the first sessions could not place (nodes still listing) waits, without a report.
NODES_LISTING = Diagnosis.of("NodeList", "waiting for the rest of the node list")
HANDOFF_CHUNK = 256  # placements assumed and handed to the binder between yields to the loop
CRD_VERSION = wire.CRD_VERSION
NODES = "/api/v1/nodes"


@dataclass(frozen=True, slots=True, kw_only=True)
class ControllerConfig:
    scheduler_name: str = translate.SCHEDULER_NAME
    identity: str = ""
    leader_elect: bool = True
    lease_namespace: str = "kube-system"
    lease_name: str = "kallot-scheduler"
    lease_duration_s: float = 10.0
    renew_deadline_s: float = 7.0
    retry_period_s: float = 2.0
    acquire_period_s: float = 1.0  # how often a standby tries to take the Lease
    max_clock_skew_s: float = 2.0  # a Lease renewed longer ago than duration + this is expired
    metrics_host: str = "127.0.0.1"
    # Plain HTTP /metrics and probes: off unless asked for, since the metrics name every queue
    # and node (docs/security.md); 0 = any free port.
    metrics_port: int | None = None
    # The secure port: TLS, and /metrics only for callers the cluster's RBAC lets get it
    # (k8sclient.delegated); `kallot scheduler` opens it on 10259 as kube-scheduler does.
    secure_host: str = "0.0.0.0"
    secure_port: int | None = None
    tls: ssl.SSLContext | None = None  # its certificate (config.tls); None: self-signed
    # Concurrent binds, and as many concurrent Event and status writes: the Scheduled Events
    # keep pace with the binds (fewer writers left them minutes behind in a drain), and many
    # binds in flight cost the API server and etcd less CPU per bind than a few (issue 26).
    bind_workers: int = 16
    sizing: SessionSizing = field(default_factory=SessionSizing)
    idle_wait_s: float = 5.0  # longest wait for work with nothing eligible (also the heartbeat)
    seed: int = 0
    resync_s: float = 600.0
    watch_timeout_s: int = 300
    shutdown_timeout_s: float = 10.0
    scheduled_events: bool = True
    watch_crds: bool = True
    preemption_wait_s: float = 300.0
    tolerated_taints: frozenset[str] = translate.DEFAULT_TOLERATED_TAINTS
    tuning: CacheTuning = field(default_factory=CacheTuning)
    # The session's actions over a queue tree once Queue objects exist (the scheduler
    # configuration's ``actions`` turn the disruptive ones off: config.scheduler).
    queue_actions: Callable[[QueueTree], tuple[Action, ...]] = queue_actions


def default_identity() -> str:
    return f"{socket.gethostname()}_{os.getpid()}"


class Controller:
    """Owns the cache, reflectors, binder, reporter, elector and health server of one process."""

    def __init__(self, client: KubeClient, scheduler: Scheduler, config: ControllerConfig) -> None:
        self.client = client
        self.scheduler = scheduler
        self.config = config
        self.identity = config.identity or default_identity()
        self.cache = Cache(
            scheduler_name=config.scheduler_name,
            tolerated_taints=config.tolerated_taints,
            tuning=config.tuning,
        )
        # DRA (kube.dra_cache): a change to classes, slices or claims may let pods fit.
        self.dra = DraCache(on_change=self.cache._bump_capacity)
        self.metrics = Metrics(lambda: self.cache)
        self.rng = np.random.default_rng(config.seed)
        self.reporter = Reporter(
            client,
            identity=self.identity,
            scheduled_events=config.scheduled_events,
            workers=config.bind_workers,
            on_dropped=self.metrics.dropped_writes.inc,
            still_pending=self._still_pending,
        )
        self.migplan = MigPlanner(  # live MIG re-layouts (issue 21)
            client,
            self.reporter,
            on_outcome=lambda outcome: self.metrics.mig_relayouts.labels(outcome).inc(),
        )
        self.binder = Binder(
            client,
            self.cache,
            workers=config.bind_workers,
            on_bound=self._on_bound,
            on_failed=self._on_bind_failed,
            dra=self.dra,
        )
        self.elector: LeaderElector | None = None
        if config.leader_elect:
            self.elector = LeaderElector(
                client,
                namespace=config.lease_namespace,
                name=config.lease_name,
                identity=self.identity,
                lease_duration_s=config.lease_duration_s,
                renew_deadline_s=config.renew_deadline_s,
                retry_period_s=config.retry_period_s,
                acquire_period_s=config.acquire_period_s,
                max_clock_skew_s=config.max_clock_skew_s,
                on_change=lambda leader: self.metrics.leader.set(1 if leader else 0),
            )
        self.reflectors = self._reflectors()
        self.status = StatusWriter(
            client, self.cache, is_leader=lambda: self.is_leader and self.ready()
        )
        self.server: HealthServer | None = None
        if config.metrics_port is not None:
            self.server = HealthServer(
                self.metrics,
                host=config.metrics_host,
                port=config.metrics_port,
                ready=self.ready,
                healthy=self.healthy,
            )
        self.secure_server: HealthServer | None = None
        if config.secure_port is not None:
            self.secure_server = HealthServer(
                self.metrics,
                host=config.secure_host,
                port=config.secure_port,
                ready=self.ready,
                healthy=self.healthy,
                tls=config.tls or tls.server_context(None, None, hosts=[config.secure_host]),
                auth=DelegatedAuth(client),
                flag="--secure-address",
            )
        self.sessions = 0
        self.binds_done = 0  # binds that succeeded (the sizer keeps the binder fed)
        self.failed_sessions = 0  # sessions in a row that raised
        self.sizer = SessionSizer(config.sizing)
        self._stop = asyncio.Event()
        self._reported_invalid: dict[str, str] = {}
        self._reported_pods: dict[str, set[str]] = {}
        self._reported_nodes: dict[str, str] = {}
        self._reported_queues: dict[str, str] = {}
        self._reported_owner_notes: dict[str, str] = {}
        self._plain_actions = scheduler.actions
        self._queues_seen = -1
        # preemptor uid -> (victim uids, monotonic deadline): sits out sessions meanwhile
        self._preempting: dict[str, tuple[frozenset[str], float]] = {}
        self._evicting: set[asyncio.Task[None]] = set()
        self._loop_beat = time.monotonic()
        # Called with each session's input and decision once the node list is complete:
        # autoscaling reads the pods no node could hold from it (kube.scaleup).
        self.session_observers: list[Callable[[SessionInput, Decision], None]] = []
        # Set once the first session's placements are with the binder (or no session is
        # coming soon: a standby, a failed or empty first session); the nodes after the
        # first page are listed from then on.
        self._first_handoff = asyncio.Event()

    # -- wiring ----------------------------------------------------------------------------

    def _reflectors(self) -> dict[str, Reflector]:
        c, cfg = self.cache, self.config

        def make(
            path: str,
            name: str,
            replace: Callable[..., None],
            event: Callable[..., None],
            optional: bool = False,
            *,
            bound_first: bool = False,
        ) -> Reflector:
            rest_after = None
            if bound_first:
                rest_after = self._others_usable
            elif path == NODES:
                rest_after = self._first_session_inputs
            return Reflector(
                self.client,
                path,
                name=name,
                on_replace=replace,
                on_event=event,
                resync_s=cfg.resync_s,
                watch_timeout_s=cfg.watch_timeout_s,
                optional=optional,
                bound_first=bound_first,
                rest_after=rest_after,
                usable_on_first_page=path == NODES,
            )

        out = {
            "nodes": make(NODES, "nodes", self._replace_nodes, self._apply_node),
            # Bound pods first, then pending ones page by page: sessions start on the first
            # pending page, never before every pod that holds a GPU is known.
            "pods": make("/api/v1/pods", "pods", c.replace_pods, c.apply_pod, bound_first=True),
            # Namespace labels, for the namespaceSelector of pod affinity terms.
            "namespaces": make(
                "/api/v1/namespaces", "namespaces", c.replace_namespaces, c.apply_namespace
            ),
            # Volume topology (kube.volumes): claims, volumes and classes.
            "pvcs": make("/api/v1/persistentvolumeclaims", "pvcs", c.replace_claims, c.apply_claim),
            "pvs": make("/api/v1/persistentvolumes", "pvs", c.replace_volumes, c.apply_volume),
            "storageclasses": make(
                "/apis/storage.k8s.io/v1/storageclasses",
                "storageclasses",
                c.replace_storage_classes,
                c.apply_storage_class,
            ),
        }
        d = self.dra  # DRA (resource.k8s.io/v1): optional, a cluster may not serve it
        out["deviceclasses"] = make(
            DEVICE_CLASSES, "deviceclasses", d.replace_classes, d.apply_class, True
        )
        out["resourceslices"] = make(
            RESOURCE_SLICES, "resourceslices", d.replace_slices, d.apply_slice, True
        )
        out["resourceclaims"] = make(
            RESOURCE_CLAIMS, "resourceclaims", d.replace_claims, d.apply_claim, True
        )
        if cfg.watch_crds:
            base = f"/apis/{CRD_GROUP}/{CRD_VERSION}"
            out["podgroups"] = make(
                f"{base}/podgroups", "podgroups", c.replace_pod_groups, c.apply_pod_group, True
            )
            out["queues"] = make(f"{base}/queues", "queues", c.replace_queues, c.apply_queue, True)
            for kind, path in owners.OWNER_PATHS.items():  # gangs of Jobs, JobSets, ...
                out[kind.lower()] = make(path, kind.lower(), *c.owners.handlers(kind), True)
        return out

    def _replace_nodes(self, items: Iterable[Mapping[str, Any]]) -> None:
        items = list(items)
        self.cache.replace_nodes(items)
        self.migplan.on_replace(items)
        self.dra.replace_nodes(items)

    def _apply_node(self, event: str, obj: Mapping[str, Any]) -> None:
        self.cache.apply_node(event, obj)
        self.migplan.on_event(event, obj)
        self.dra.apply_node(event, obj)

    def serves_models(self) -> bool:
        """Whether a pod of ours that names a model (a model server) is placed: the
        disruption guard has work only then."""
        return any(
            e.kallot
            and e.task is not None
            and e.task.model is not None
            and e.state in (PodState.BOUND, PodState.ASSUMED)
            for e in list(self.cache.pods())
        )

    async def _others_usable(self) -> None:
        """Until every reflector but the pods' is usable and the first session has handed
        its placements to the binder: the pending pods after the first page wait, so that
        digesting pods the first session does not need does not delay it; then they arrive
        alongside the rest of the nodes, and the next sessions have pods to place."""
        others = [r for name, r in self.reflectors.items() if name != "pods"]
        await asyncio.gather(*(r.usable.wait() for r in others))
        await self._first_handoff.wait()

    async def _first_session_inputs(self) -> None:
        """Until the first session has handed its placements to the binder: the node pages
        after the first wait, so that digesting them does not delay the first binds (the
        first session runs on the first page, and the rest of the nodes join the next)."""
        await self._first_handoff.wait()

    async def _wake_when_nodes_listed(self) -> None:
        """The pods the first sessions parked while nodes were still listing (without a
        report) are decided again, on every node, once the list is complete."""
        await self.reflectors["nodes"].synced.wait()
        self.cache._bump_capacity()

    def nodes_partial(self) -> bool:
        """The first list of nodes is still arriving (sessions run on the nodes so far)."""
        return not self.reflectors["nodes"].synced.is_set()

    def ready(self) -> bool:
        """Caches synced, and sessions are not failing again and again."""
        if self.failed_sessions >= FAILED_SESSIONS_NOT_READY:
            return False
        return all(r.synced.is_set() for r in self.reflectors.values())

    def healthy(self) -> bool:
        # The scheduling loop beats at least every few seconds, leader or not.
        return time.monotonic() - self._loop_beat < 60.0

    @property
    def is_leader(self) -> bool:
        return self.elector is None or self.elector.is_leader

    def stop(self) -> None:
        self._stop.set()

    # -- the loop -----------------------------------------------------------------------------

    async def run(self) -> int:
        """Until ``stop()`` (exit code 0) or leadership is lost (exit code 1)."""
        tasks: list[asyncio.Task[Any]] = []
        for server in (self.server, self.secure_server):
            if server is not None:
                await server.start()
        self.binder.start()
        self.reporter.start()
        for r in self.reflectors.values():
            tasks.append(asyncio.create_task(r.run(), name=f"reflector-{r.name}"))
        tasks.append(asyncio.create_task(self._wake_when_nodes_listed(), name="nodes-listed"))
        if self.config.watch_crds:
            tasks.append(asyncio.create_task(self.status.run(), name="crd-status"))
        elector_task = None
        if self.elector is not None:
            elector_task = asyncio.create_task(self.elector.run(), name="leader-election")
            tasks.append(elector_task)
        else:
            self.metrics.leader.set(1)
        code = 0
        try:
            await self._until_synced()
            if not self._stop.is_set():
                logger.info(
                    "caches synced identity=%s nodes=%d",
                    self.identity,
                    len(self.cache.node_names()),
                )
                code = await self._schedule_while_leader()
        finally:
            await self._shutdown(tasks)
        return code

    async def _until_synced(self) -> None:
        """Until every reflector's first list is usable (pods: the bound ones and the first
        page of pending ones; the rest of the pending pods keep arriving meanwhile)."""
        waits = [asyncio.ensure_future(r.usable.wait()) for r in self.reflectors.values()]
        stop = asyncio.ensure_future(self._stop.wait())
        try:
            all_synced: asyncio.Future[Any] = asyncio.ensure_future(asyncio.gather(*waits))
            await asyncio.wait(
                {all_synced, stop},
                return_when=asyncio.FIRST_COMPLETED,
            )
            all_synced.cancel()
        finally:
            stop.cancel()
            for w in waits:
                w.cancel()

    async def _schedule_while_leader(self) -> int:
        if self.elector is not None:
            self._first_handoff.set()  # a standby keeps every list whole
            elected = asyncio.ensure_future(self.elector.elected.wait())
            stop = asyncio.ensure_future(self._stop.wait())
            while not self.elector.is_leader and not self._stop.is_set():
                self._loop_beat = time.monotonic()
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
            logger.info("leading identity=%s", self.identity)
        while not self._stop.is_set():
            if self.elector is not None and not self.elector.is_leader:
                return 1
            self._loop_beat = time.monotonic()
            await self._wait_for_work()
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
                # the controller. Counted, and /readyz reports a run of them.
                self.failed_sessions += 1
                self.metrics.session_failures.inc()
                logger.exception("session failed in_a_row=%d", self.failed_sessions)
                await asyncio.sleep(min(30.0, float(2 ** min(self.failed_sessions - 1, 5))))
        return 0

    async def _wait_for_work(self) -> None:
        """Return at once while the cache has work (``changed``: new pods, freed capacity, or
        eligible pods the last session's cut left behind); otherwise wait for a change, the
        next parked or backed-off pod's retry time, or the idle timeout. The binds of the
        previous session are not waited for: they run on the event loop meanwhile."""
        if self.cache.changed.is_set():
            return
        idle = self.config.idle_wait_s
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

    async def schedule_once(self) -> int:
        """One session over the eligible pending pods; returns how many were placed."""
        # Never on a cache mid-resync (a 410 re-list): wait until pods and nodes are whole
        # again, and drop a decision taken on a snapshot from before a list landed.
        lists = await self._fresh_lists()
        if lists is None:
            return 0  # still listing: the loop comes back (and keeps beating meanwhile)
        self._report_invalid()
        self._report_pod_problems()
        self._report_nodes()
        self._sync_queues()
        start = time.monotonic()
        # The sizer is fed the CPU the session itself used (this thread's for the input and
        # the hand-off, the worker's for the core), not wall time: binds and watch events
        # share the interpreter meanwhile and would make every pod look dearer than it is.
        cpu = time.thread_time()
        sitting_out = frozenset(u for u in list(self._preempting) if self._waits_for_victims(u))
        sitting_out |= self.migplan.waiting()  # their MIG re-layout is not advertised yet
        # Start-up: the first sessions run on the nodes listed so far (docs/design/003,
        # "Start-up"); what they could not place may fit on a node still to come.
        partial = self.nodes_partial()
        inp = self.cache.session_input(max_tasks=self.sizer.next_size(), exclude=sitting_out)
        inp = dataclasses.replace(inp, snapshot=self.migplan.adjust(inp.snapshot))
        self._report_owner_notes()
        for uid, diagnosis in inp.waiting.items():
            entry = self.cache.pod(uid)
            if entry is not None:
                self.cache.park(uid, diagnosis, generation=inp.capacity_generation)
                self.reporter.unschedulable(_ref(entry), diagnosis.message(), entry.reason_kind)
        tasks = self.dra.attach(inp.tasks)  # pods with ResourceClaims carry them (PodInfo.dra)
        if not tasks:
            return 0
        cpu = time.thread_time() - cpu
        binds = self.binds_done
        decision, core_cpu = await asyncio.to_thread(self._run_core, inp, tasks)
        cpu += core_cpu
        wall = time.monotonic() - start
        self.sizer.fed(
            (self.binds_done - binds) / max(wall, 1e-3), wall, dry=self.binder.in_flight == 0
        )
        self.sessions += 1
        placed = 0
        if await self._fresh_lists() != lists:
            logger.info("session dropped: the cache was re-listed while it ran")
            return 0
        mark = time.thread_time()
        if partial:
            held = self._held_while_partial(decision)
        else:
            held = self._carry_out_evictions(decision)
            held |= self.migplan.carry_out(  # bound once the node advertises the new layout
                decision,
                {
                    r.for_task: _ref(e)
                    for r in decision.reconfigurations
                    if (e := self.cache.pod(r.for_task)) is not None
                },
            )
        # Nodes changed while the session ran: rows rebuilt now, so that ``assume`` checks
        # each placement against the current usage.
        self.cache.current_rows()
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
                self._report_fault(entry, u.diagnosis)
                continue
            entry.faults = 0
            message = self.dra.unschedulable(u.task_id, u.diagnosis.message())
            if message is None:
                self.cache.changed.set()  # its extended resources by DRA, next session
                continue
            self.cache.park(u.task_id, u.diagnosis, generation=inp.capacity_generation)
            if not partial:  # with nodes still to come, no report: it may fit on one of them
                self.reporter.unschedulable(_ref(entry), message, entry.reason_kind)
        if not partial:
            for observe in self.session_observers:
                observe(inp, decision)
        cpu += time.thread_time() - mark
        took = time.monotonic() - start
        self.sizer.observe(len(tasks), cpu, took)
        self.metrics.session_duration.observe(took)
        self.metrics.session_pods.observe(len(inp.tasks))
        self.metrics.attempts.labels("scheduled").inc(placed)
        self.metrics.attempts.labels("unschedulable").inc(len(decision.unschedulable))
        logger.info(
            "session pods=%d placed=%d unschedulable=%d evictions=%d nodes=%d backlog=%d "
            "took=%.3fs cpu=%.3fs",
            len(tasks),
            placed,
            len(decision.unschedulable),
            len(decision.evictions),
            inp.snapshot.n_nodes,
            self.cache.backlog,
            took,
            cpu,
        )
        return placed

    def _plan_claims(self, p: Placement) -> bool:
        """DRA: the placed pod's claims allocated on its node, on the newest state (kept in
        flight for the binder); False when they no longer fit there."""
        entry = self.cache.pod(p.task_id)
        if entry is None or entry.task is None or entry.task.k8s is None:
            return True
        if not entry.task.k8s.resource_claims and p.task_id not in self.dra.extended:
            return True
        info = self.cache.node(p.node)
        labels = info.spec.labels if info is not None else {}
        plan, reason = self.dra.plan(p.task_id, entry.task, p.node, labels)
        if plan is None:
            logger.info("claims no longer fit pod=%s node=%s why=%s", entry.key, p.node, reason)
            return False
        return True

    def _run_core(self, inp: SessionInput, tasks: list[Task]) -> tuple[Decision, float]:
        """The core's session (in a worker thread), and the CPU time it took there."""
        cpu = time.thread_time()
        decision = self.scheduler.run_session(
            inp.snapshot, tasks, now=time.time(), rng=self.rng, jobs=inp.jobs
        )
        return decision, time.thread_time() - cpu

    def _report_fault(self, entry: PodEntry, diagnosis: Diagnosis) -> None:
        """The core faulted on this pod (a plugin raised): Event and pending reason, backoff;
        the session placed everyone else."""
        delay = self.cache.back_off_fault(entry.uid, diagnosis)
        self.metrics.task_faults.inc()
        logger.warning(
            "fault pod=%s fault=%s retry_in=%.0fs",
            entry.key,
            logs.truncate(diagnosis.fault),
            delay,
        )
        self.reporter.unschedulable(_ref(entry), diagnosis.message(), FAULT_KIND)

    async def _fresh_lists(self, timeout: float = 1.0) -> int | None:
        """Wait (up to ``timeout``) until the pods and nodes reflectors hold a complete list
        (not mid-resync); returns how many lists they have taken, None if still listing."""
        mirrors = [self.reflectors[n] for n in ("pods", "nodes") if n in self.reflectors]
        try:
            await asyncio.wait_for(asyncio.gather(*(r.fresh.wait() for r in mirrors)), timeout)
        except TimeoutError:
            return None
        return sum(r.lists for r in mirrors)

    # -- queues and evictions -------------------------------------------------------------------

    def _sync_queues(self) -> None:
        """Queue objects -> the session's actions: queue actions over the tree they form, plain
        allocation when there are none. A tree that does not validate keeps the previous one
        in force and says why on every Queue."""
        if self.cache.queues_generation == self._queues_seen:
            return
        self._queues_seen = self.cache.queues_generation
        for name, err in self.cache.queue_errors.items():
            self._queue_event(name, f"kallot ignores this Queue: {err}")
        if not self.cache.queues:
            self.scheduler.actions = self._plain_actions
            logger.info("no Queues: plain allocation")
            return
        try:
            tree = translate.queue_tree(self.cache.queues.values())
        except ConfigError as exc:
            for name in self.cache.queues:
                self._queue_event(name, f"kallot keeps its previous queue tree: {exc}")
            return
        self.scheduler.actions = self.config.queue_actions(tree)
        logger.info("queue tree queues=%s", ",".join(tree.names))

    def _queue_event(self, name: str, text: str) -> None:
        if self._reported_queues.get(name) == text:
            return
        self._reported_queues[name] = text
        logger.warning("invalid Queue queue=%s error=%s", name, text)
        self.reporter.queue_problem(name, "InvalidQueue", text)

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

    def _waits_for_victims(self, uid: str) -> bool:
        held = self._preempting.get(uid)
        if held is None:
            return False
        victims, deadline = held
        if time.monotonic() < deadline and any(self.cache.pod(v) is not None for v in victims):
            return True
        del self._preempting[uid]
        return False

    def _carry_out_evictions(self, decision: Decision) -> set[str]:
        """Evict what the session chose; returns the task ids whose placements wait for it
        (the preemptors, with every member of their gangs)."""
        if not decision.evictions:
            return set()
        by_preemptor: dict[str, list[Eviction]] = {}
        for ev in decision.evictions:
            by_preemptor.setdefault(ev.for_task, []).append(ev)
        jobs = set()
        for uid in by_preemptor:
            entry = self.cache.pod(uid)
            if entry is not None and entry.task is not None and entry.task.job:
                jobs.add(entry.task.job)
        held = set(by_preemptor)
        for p in decision.placements:
            entry = self.cache.pod(p.task_id)
            if entry is not None and entry.task is not None and entry.task.job in jobs:
                held.add(p.task_id)
        victims: set[str] = set()
        for uid, evictions in by_preemptor.items():
            preemptor = self.cache.pod(uid)
            who = preemptor.key if preemptor is not None else uid
            if preemptor is not None and evictions:
                # status.nominatedNodeName, as kube-scheduler's preemption writes it: the
                # preemptor's next session prefers that node (core NominatedNode).
                nominate = asyncio.create_task(
                    self._nominate(preemptor.namespace, preemptor.name, evictions[0].node)
                )
                self._evicting.add(nominate)
                nominate.add_done_callback(self._evicting.discard)
            for ev in evictions:
                victim = self.cache.pod(ev.task_id)
                if victim is None:
                    continue
                victims.add(victim.uid)
                kind = ev.reason.split(" ", 1)[0]
                self.metrics.evictions.labels(kind).inc()
                logger.info("evict pod=%s node=%s for=%s reason=%s", victim.key, ev.node, who, kind)
                self.reporter.preempted(
                    _ref(victim), f"evicted by kallot ({kind}) so that {who} fits on {ev.node}"
                )
                t = asyncio.create_task(self._evict(victim.namespace, victim.name, victim.uid))
                self._evicting.add(t)
                t.add_done_callback(self._evicting.discard)
        # Every held task waits for all of this session's victims: conservative, and simple.
        hold = (frozenset(victims), time.monotonic() + self.config.preemption_wait_s)
        for uid in held:
            self._preempting[uid] = hold
        return held

    async def _nominate(self, namespace: str, name: str, node: str) -> None:
        try:
            await self.client.patch_pod_status(
                namespace, name, {"status": {"nominatedNodeName": node}}
            )
        except ApiError as exc:
            logger.info("cannot nominate pod=%s/%s node=%s error=%s", namespace, name, node, exc)

    async def _evict(self, namespace: str, name: str, uid: str, attempts: int = 3) -> None:
        for attempt in range(attempts):
            try:
                await self.client.evict(namespace, name, uid=uid)
                return
            except ApiError as exc:
                if exc.not_found:
                    return
                if not exc.outcome_unknown:
                    # A PodDisruptionBudget (429) or a race: the preemptor waits out its
                    # deadline and is then decided afresh.
                    logger.warning("eviction failed pod=%s/%s error=%s", namespace, name, exc)
                    return
                error = exc
            # No answer or a 5xx: only a read says whether the eviction happened.
            if await self._evicted(namespace, name, uid):
                return
            logger.info(
                "eviction not done, trying again pod=%s/%s attempt=%d error=%s",
                namespace,
                name,
                attempt + 1,
                error,
            )
        logger.warning("eviction failed pod=%s/%s after %d attempts", namespace, name, attempts)

    async def _evicted(self, namespace: str, name: str, uid: str) -> bool:
        """Whether the pod is gone or being deleted (False also when it cannot be read)."""
        try:
            pod = await self.client.get_pod(namespace, name)
        except ApiError as exc:
            return exc.not_found
        meta = pod.get("metadata") or {}
        return str(meta.get("uid", "")) != uid or bool(meta.get("deletionTimestamp"))

    def _report_invalid(self) -> None:
        for entry in self.cache.pending_pods():
            if not entry.kallot:
                continue
            if entry.error is None:
                self._reported_invalid.pop(entry.uid, None)
                continue
            text = str(entry.error)
            if self._reported_invalid.get(entry.uid) == text:
                continue
            self._reported_invalid[entry.uid] = text
            entry.reason = text
            entry.reason_kind = "InvalidRequest"
            self.metrics.attempts.labels("invalid").inc()
            logger.info("invalid request pod=%s error=%s", entry.key, logs.truncate(text))
            self.reporter.invalid(_ref(entry), text)
        for uid in [u for u in self._reported_invalid if self.cache.pod(u) is None]:
            del self._reported_invalid[uid]

    def _report_pod_problems(self) -> None:
        """Once per pod and text: unknown kallot.io/ keys, and device records that name GPUs
        the node does not have (charged conservatively by the cache)."""
        for entry in list(self.cache.pods()):
            if not entry.warnings and not entry.missing_devices:
                continue
            texts = [("UnknownAnnotation", w) for w in entry.warnings]
            if entry.missing_devices:
                texts.append(
                    (
                        "UnknownDevice",
                        f"the device record names GPU {', '.join(entry.missing_devices)}, which "
                        f"node {entry.node} does not have; kallot charges an idle GPU of the node "
                        "for each until the pod ends",
                    )
                )
            if not texts:
                continue
            seen = self._reported_pods.setdefault(entry.uid, set())
            for reason, text in texts:
                if text in seen:
                    continue
                seen.add(text)
                logger.warning("pod problem pod=%s reason=%s text=%s", entry.key, reason, text)
                self.reporter.pod_warning(_ref(entry), reason, text)
        for uid in [u for u in self._reported_pods if self.cache.pod(u) is None]:
            del self._reported_pods[uid]

    def _report_owner_notes(self) -> None:
        for uid, text in list(self.cache.owners.notes.items()):
            entry = self.cache.pod(uid)
            if entry is None or self._reported_owner_notes.get(uid) == text:
                continue
            self._reported_owner_notes[uid] = text
            logger.info("no gang derived pod=%s why=%s", entry.key, text)
            self.reporter.pod_warning(_ref(entry), REASON_NO_GANG, text)
        for uid in [u for u in self._reported_owner_notes if self.cache.pod(u) is None]:
            del self._reported_owner_notes[uid]

    def _report_nodes(self) -> None:
        for name, err in list(self.cache.node_errors.items()):
            text = str(err)
            if self._reported_nodes.get(name) == text:
                continue
            self._reported_nodes[name] = text
            logger.warning("invalid node inventory node=%s error=%s", name, text)
            self.reporter.node_problem(
                name, "InvalidGPUInventory", f"kallot ignores this node's GPUs: {text}"
            )

    def _still_pending(self, uid: str) -> bool:
        entry = self.cache.pod(uid)
        return entry is not None and entry.state is PodState.PENDING

    def _on_bound(self, uid: str, took: float) -> None:
        self.binds_done += 1
        self.metrics.bind_duration.observe(took)
        entry = self.cache.pod(uid)
        if entry is None:
            return
        self.metrics.pod_latency.observe(max(0.0, time.monotonic() - entry.first_seen))
        devices = ", ".join(
            f"GPU {d.slot} {d.milli}m/{d.mem_mib}MiB {d.mode.label}" for d in entry.devices
        )
        self.reporter.scheduled(_ref(entry), entry.node, devices)

    def _on_bind_failed(self, uid: str, reason: str) -> None:
        self.metrics.attempts.labels("bind_failed").inc()
        entry = self.cache.pod(uid)
        if entry is not None:
            self.reporter.unschedulable(_ref(entry), reason, "BindFailed")

    # -- shutdown -------------------------------------------------------------------------------

    async def _shutdown(self, tasks: list[asyncio.Task[Any]]) -> None:
        """Stop deciding, let in-flight binds finish, hand the lease back, close."""
        logger.info("shutting down in_flight_binds=%d", self.binder.in_flight)
        drained = await self.binder.drain(self.config.shutdown_timeout_s)
        if not drained:
            logger.warning("binds still in flight at shutdown count=%d", self.binder.in_flight)
        await self.binder.stop()
        if self.elector is not None:
            await self.elector.release()
        await self.reporter.stop(timeout=2.0)
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        for server in (self.server, self.secure_server):
            if server is not None:
                await server.stop()


def _ref(entry: PodEntry) -> PodRef:
    return PodRef(entry.namespace, entry.name, entry.uid)
