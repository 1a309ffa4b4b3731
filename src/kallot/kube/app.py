"""The live scheduler's composition root: builds the parts of one process and runs them,
with leader election, health and metrics servers, start-up and graceful shutdown around the
session loop.

The parts, in the order of the flow: the reflectors (``kube.watch``) feed the state
(``kube.state``: the cache, with its store, scheduling queue and usage ledger) and DRA's
(``kube.dra.cache``); the session loop (``kube.schedule.loop``) takes each session's input from
the pipeline (``kube.state.pipeline``: the cache, then the MIG stage, then the DRA stage), runs
the core with the session's actions (``kube.schedule.actions``), has the evictor
(``kube.schedule.evictor``) and the MIG planner (``kube.schedule.migplan``) carry out what
needs them, and hands placements to the binder (``kube.bind.binder``); problems go out through
``kube.schedule.problems``. Nothing here decides anything: what stays is which part gets which
others, and the start-up and shutdown order.

Start-up: bound pods are listed before pending ones, and the first session runs on the first
page of pending pods and of nodes (the rest of both arrive after it has handed its placements
to the binder: ``_others_usable``, ``_first_session_inputs``); a new leader re-lists before its
first session (``SessionLoop.run``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kallot.config import tls, wire
from kallot.core.actions import Action
from kallot.core.queueing.queue_tree import QueueTree
from kallot.core.scheduler import Scheduler
from kallot.k8sclient.delegated import DelegatedAuth
from kallot.kube import owners, translate
from kallot.kube.api.client import KubeClient
from kallot.kube.bind.binder import Binder
from kallot.kube.dra.cache import DEVICE_CLASSES, RESOURCE_CLAIMS, RESOURCE_SLICES, DraCache
from kallot.kube.ops.leader import LeaderElector
from kallot.kube.ops.metrics import HealthServer, Metrics
from kallot.kube.ops.reporter import Reporter
from kallot.kube.ops.sizing import SessionSizer, SessionSizing
from kallot.kube.ops.status import StatusWriter
from kallot.kube.schedule.actions import SessionActions
from kallot.kube.schedule.evictor import Evictor
from kallot.kube.schedule.loop import SessionLoop
from kallot.kube.schedule.migplan import MigPlanner
from kallot.kube.schedule.problems import Problems, pod_ref
from kallot.kube.state.cache import Cache, CacheTuning, PodState
from kallot.kube.state.pipeline import DraStage, MigStage, SessionPipeline
from kallot.kube.watch.reflector import Reflector

logger = logging.getLogger(__name__)

# /readyz answers 503 after this many sessions in a row raised.
FAILED_SESSIONS_NOT_READY = 3

CRD_GROUP = wire.CRD_GROUP
CRD_VERSION = wire.CRD_VERSION
NODES = "/api/v1/nodes"


def _queue_actions(tree: QueueTree) -> tuple[Action, ...]:
    """The core's queue actions, imported once a session has Queues: most clusters have none,
    and the live scheduler's start-up does not pay for preempt, reclaim and the ledger."""
    from kallot.core.actions.queue import queue_actions

    return queue_actions(tree)


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
    queue_actions: Callable[[QueueTree], tuple[Action, ...]] = _queue_actions


def default_identity() -> str:
    return f"{socket.gethostname()}_{os.getpid()}"


class Controller:
    """The parts of one scheduler process, wired: reflectors, cache, DRA, MIG planner,
    binder, reporter, evictor, problem reports, session loop, elector and servers."""

    def __init__(
        self,
        client: KubeClient,
        scheduler: Scheduler,
        config: ControllerConfig,
    ) -> None:
        self.client = client
        self.scheduler = scheduler
        self.config = config
        self.identity = config.identity or default_identity()
        self.cache = Cache(
            scheduler_name=config.scheduler_name,
            tolerated_taints=config.tolerated_taints,
            tuning=config.tuning,
        )
        # DRA (kube.dra.cache): a change to classes, slices or claims may let pods fit.
        self.dra = DraCache(on_change=self.cache._bump_capacity)
        self.metrics = Metrics(lambda: self.cache)
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
        self._stop = asyncio.Event()
        # Set once the first session's placements are with the binder (or no session is
        # coming soon): the nodes and pending pods after the first page wait for it.
        self._first_handoff = asyncio.Event()
        self.reflectors = self._reflectors()
        self.problems = Problems(self.cache, self.reporter, self.metrics)
        self.evictor = Evictor(
            client,
            self.cache,
            self.reporter,
            self.metrics,
            preemption_wait_s=config.preemption_wait_s,
        )
        self.loop = SessionLoop(
            scheduler=scheduler,
            cache=self.cache,
            pipeline=SessionPipeline(self.cache, [MigStage(self.migplan), DraStage(self.dra)]),
            actions=SessionActions(
                self.cache,
                self.problems,
                plain=scheduler.actions,
                queue_actions=config.queue_actions,
            ),
            binder=self.binder,
            dra=self.dra,
            migplan=self.migplan,
            evictor=self.evictor,
            problems=self.problems,
            reporter=self.reporter,
            metrics=self.metrics,
            sizer=SessionSizer(config.sizing),
            reflectors=self.reflectors,
            elector=self.elector,
            stop=self._stop,
            first_handoff=self._first_handoff,
            seed=config.seed,
            idle_wait_s=config.idle_wait_s,
        )
        # Called with each session's input and decision once the node list is complete:
        # autoscaling appends its observer (kube.autoscale.wiring); the loop calls them in order.
        self.session_observers = self.loop.session_observers
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

    @property
    def sessions(self) -> int:
        """Sessions run so far (``SessionLoop.sessions``)."""
        return self.loop.sessions

    @property
    def failed_sessions(self) -> int:
        """Sessions in a row that raised (``SessionLoop.failed_sessions``)."""
        return self.loop.failed_sessions

    async def _wait_for_work(self) -> None:
        await self.loop.wait_for_work()

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
            # Volume topology (kube.state.volumes): claims, volumes and classes.
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
        return self.loop.nodes_partial()

    def ready(self) -> bool:
        """Caches synced, and sessions are not failing again and again."""
        if self.loop.failed_sessions >= FAILED_SESSIONS_NOT_READY:
            return False
        return all(r.synced.is_set() for r in self.reflectors.values())

    def healthy(self) -> bool:
        # The scheduling loop beats at least every few seconds, leader or not.
        return time.monotonic() - self.loop.beat < 60.0

    @property
    def is_leader(self) -> bool:
        return self.elector is None or self.elector.is_leader

    def stop(self) -> None:
        self._stop.set()

    # -- start-up and shutdown -----------------------------------------------------------------

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
                code = await self.loop.run()
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

    # -- the binder's outcomes ------------------------------------------------------------------

    def _still_pending(self, uid: str) -> bool:
        entry = self.cache.pod(uid)
        return entry is not None and entry.state is PodState.PENDING

    def _on_bound(self, uid: str, took: float) -> None:
        self.loop.bind_done()
        self.metrics.bind_duration.observe(took)
        entry = self.cache.pod(uid)
        if entry is None:
            return
        self.metrics.pod_latency.observe(max(0.0, time.monotonic() - entry.queue.first_seen))
        devices = ", ".join(
            f"GPU {d.slot} {d.milli}m/{d.mem_mib}MiB {d.mode.label}" for d in entry.devices
        )
        self.reporter.scheduled(pod_ref(entry), entry.node, devices)

    def _on_bind_failed(self, uid: str, reason: str) -> None:
        self.metrics.attempts.labels("bind_failed").inc()
        entry = self.cache.pod(uid)
        if entry is not None:
            self.reporter.unschedulable(pod_ref(entry), reason, "BindFailed")

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
