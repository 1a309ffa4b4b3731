"""Consolidation in the live scheduler: empty a nearly empty node by evicting only what may move,
so the autoscaler can remove it (``autoscale.consolidation`` in the scheduler configuration,
off by default; docs/autoscaling.md, "What consolidation may move").

Where it sits: the kube shell, a loop of its own next to the Controller (like
``kube.autoscale.disruption``), leader only. Every ``interval_s`` it takes the cache's snapshot, works out
what the core does not know and must not move (``protected``), asks the core's
``core.provision.consolidate`` for the move worth making within the eviction budget, and carries
it out: one Event per eviction (reason ``Consolidation``, the node and the GPUs it frees) and
the eviction through the Eviction API, so PodDisruptionBudgets and grace periods hold. The
evicted pods' controllers make new ones, nominated (in kallot's memory, kube.state.steer) to the
node the move planned for each, so they go there, not back onto the node being emptied; the
empty node is the autoscaler's to remove, and no move's target for ``HOLD_S`` meanwhile, while
a node replacements are on their way to is not emptied (``Steering.incoming``).

Never moved (``protected``), besides what ``core.provision.consolidate.movable`` refuses
(do-not-disrupt, inside min-runtime, gang members):

- a model server that is loading, in its grace window after Ready or the last Ready replica of
  its model (``kube.autoscale.disruption.protection``, read from the pods, not from the annotation the
  guard writes one round later);
- a pod a PodDisruptionBudget with no disruption left covers (the Eviction API would refuse
  it, and a half-emptied node frees nothing);
- a pod being deleted, a pod kallot does not schedule, any member of a gang (moved whole or
  not at all: the core does not move running gangs);
- a pod no controller owns: nothing would make it again, so an eviction would delete it
  (cluster-autoscaler keeps nodes with such pods too);
- a pod on a node replacements of an earlier move are on their way to.

The budget is ``evictionsPerMinute`` over the last 60 seconds; ``gainThreshold`` is the least
GPUs a move must free.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from kallot.core.errors import ConfigError
from kallot.core.framework.runner import Framework
from kallot.core.k8s import selector_matches
from kallot.core.provision.consolidate import REASON, ConsolidationConfig, Move, consolidate
from kallot.kube import translate
from kallot.kube.api import k8s_fields
from kallot.kube.api.client import ApiError, KubeClient
from kallot.kube.autoscale import disruption
from kallot.kube.ops.reporter import PodRef, Reporter
from kallot.kube.state import steer
from kallot.kube.state.cache import Cache, PodState

log = logging.getLogger(__name__)

PDBS = "/apis/policy/v1/poddisruptionbudgets"
WINDOW_S = 60.0
# A node a move emptied is no move's target for this long (steer's expectation lifetime): it
# waits for the autoscaler to remove it. And a node replacements are on their way to is not
# emptied while they are (``Steering.incoming``). Without both, two nodes of one movable pod
# each traded it back and forth every round (bench/autoscale_live.py, 11 evictions).
HOLD_S = steer.TTL_S


def pdb_blocked(pdbs: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]) -> set[str]:
    """Uids of the pods a PodDisruptionBudget with ``disruptionsAllowed`` < 1 selects."""
    closed = []
    for pdb in pdbs:
        meta = pdb.get("metadata") or {}
        if int((pdb.get("status") or {}).get("disruptionsAllowed", 0) or 0) >= 1:
            continue
        where = f"PodDisruptionBudget {meta.get('namespace')}/{meta.get('name')}: spec.selector"
        try:
            sel = k8s_fields.label_selector((pdb.get("spec") or {}).get("selector"), where)
        except ConfigError as exc:  # the API server validates selectors; be safe anyway
            log.warning("%s", exc)
            continue
        closed.append((str(meta.get("namespace", "")), sel))
    out = set()
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        ns = str(meta.get("namespace", ""))
        if any(n == ns and selector_matches(sel, labels) for n, sel in closed):
            out.add(str(meta.get("uid", "")))
    return out


class Consolidator:
    """The loop of the module docstring."""

    def __init__(
        self,
        client: KubeClient,
        cache: Cache,
        framework: Framework,
        config: ConsolidationConfig,
        reporter: Reporter,
        *,
        scheduler_name: str = translate.SCHEDULER_NAME,
        grace_s: float = disruption.GRACE_S,
        is_leader: Callable[[], bool] = lambda: True,
        on_evict: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.cache = cache
        self.framework = framework
        self.config = config
        self.reporter = reporter
        self.scheduler_name = scheduler_name
        self.grace_s = grace_s
        self.is_leader = is_leader
        self.on_evict = on_evict
        self.clock = clock
        self.wall_clock = wall_clock
        self.recent: deque[float] = deque()  # monotonic times of the last window's evictions
        self.moves: list[Move] = []
        self.evicted: list[str] = []  # namespace/name of every pod evicted
        self._owners: dict[str, str] = {}  # pod uid -> its controller's uid (last listing)
        self.emptied: dict[str, float] = {}  # node -> when a move emptied it (monotonic)

    def budget(self) -> int:
        now = self.clock()
        while self.recent and now - self.recent[0] >= WINDOW_S:
            self.recent.popleft()
        return max(0, self.config.evictions_per_minute - len(self.recent))

    async def protected(self) -> set[str]:
        """Uids the core must not move (module docstring), from the API and the cache."""
        pods, _ = await self.client.list_all(
            "/api/v1/pods", query=[("fieldSelector", f"spec.schedulerName={self.scheduler_name}")]
        )
        pdbs, _ = await self.client.list_all(PDBS)
        self._owners = {
            str((p.get("metadata") or {}).get("uid", "")): steer.controller_uid(p) for p in pods
        }
        out = pdb_blocked(pdbs, pods)
        for pod, reason in disruption.protection(pods, self.wall_clock(), self.grace_s):
            if reason:
                out.add(str((pod.get("metadata") or {}).get("uid", "")))
        for pod in pods:
            meta = pod.get("metadata") or {}
            if meta.get("deletionTimestamp") or not steer.controller_uid(pod):
                out.add(str(meta.get("uid", "")))
        for e in list(self.cache.pods()):
            if not e.kallot or e.task is None or e.task.job or e.state is not PodState.BOUND:
                out.add(e.uid)
        return out

    async def once(self) -> tuple[Move, ...]:
        budget = self.budget()
        if not self.config.enabled or budget <= 0:
            return ()
        protected = await self.protected()
        snapshot = self.cache.snapshot()
        now = self.clock()
        for node in [n for n, t in self.emptied.items() if now - t >= HOLD_S]:
            del self.emptied[node]
        if self.emptied:
            mask = np.array(snapshot.node_schedulable, dtype=np.bool_)
            for i, name in enumerate(snapshot.node_names):
                if name in self.emptied:
                    mask[i] = False
            mask.flags.writeable = False
            snapshot = dataclasses.replace(snapshot, node_schedulable=mask)
        incoming = self.cache.steering.incoming()
        for e in list(self.cache.pods()):
            if e.node in incoming:
                protected.add(e.uid)
        # Pending pods that fit nowhere may be made room for (defragmentation); gang members are
        # left out by the core.
        pending = [
            e.task
            for e in list(self.cache.pods())
            if e.kallot and e.task is not None and e.state is PodState.PENDING
        ]
        moves = await asyncio.to_thread(
            consolidate,
            self.framework,
            snapshot,
            self.config,
            now=self.wall_clock(),
            budget=budget,
            protected=frozenset(protected),
            pending=pending,
        )
        for move in moves:
            self.moves.append(move)
            log.info(
                "consolidate node=%s gain=%g pods=%d", move.node, move.gain, len(move.evictions)
            )
            target = {p.task_id: p.node for p in move.placements}
            if not move.for_task:  # a defragmentation frees a GPU for a pending pod there
                self.emptied[move.node] = self.clock()
            reason = move.reason
            if move.for_task and (pending_pod := self.cache.pod(move.for_task)) is not None:
                reason = reason.replace(move.for_task, pending_pod.key)  # a name, not a uid
            for ev in move.evictions:
                entry = self.cache.pod(ev.task_id)
                if entry is None or entry.uid in protected:
                    continue
                owner = self._owners.get(entry.uid, "")
                # Before the eviction: the owner's new pod may be read before evict() returns.
                self.cache.steering.expect(entry.namespace, owner, target.get(ev.task_id, ""))
                self.reporter.note(
                    PodRef(entry.namespace, entry.name, entry.uid),
                    move.node,
                    REASON,
                    f"evicted by kallot: {reason}",
                    warning=False,
                )
                self.recent.append(self.clock())
                try:
                    await self.client.evict(entry.namespace, entry.name, uid=entry.uid)
                except ApiError as exc:  # a PDB (429), gone: the next round decides afresh
                    log.warning("consolidation eviction pod=%s: %s", entry.key, exc)
                    self.cache.steering.cancel(entry.namespace, owner, target.get(ev.task_id, ""))
                    continue
                self.evicted.append(entry.key)
                self.on_evict()
        return moves

    async def run(self) -> None:
        while True:
            try:
                if self.is_leader():
                    await self.once()
            except Exception as exc:
                log.warning("consolidation: %s", exc)
            await asyncio.sleep(self.config.interval_s)
