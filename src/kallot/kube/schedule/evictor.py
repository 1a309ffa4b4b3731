"""The live scheduler's evictor: carries out a Decision's evictions, and keeps the preemptors
out of sessions until their victims are gone.

Where it sits: the session loop (``kube.schedule.loop``) hands it each Decision after the core
(``carry_out``) and asks it, before the next session's input, which pods sit out
(``sitting_out``). A placement that needs victims is not bound in the session that decided it:
the victims are evicted through the Eviction API (PodDisruptionBudgets and grace periods hold),
the preemptor is nominated on the node (``status.nominatedNodeName``, as kube-scheduler's
preemption writes it) and sits out of sessions until its victims are gone (or
``preemption_wait_s`` passes); the next session then places it on the capacity they freed,
deciding afresh. Until then no other victims are chosen for it, so one preemptor never evicts
twice for the same need.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from kallot.core.decision import Decision, Eviction
from kallot.kube.api.client import ApiError, KubeClient
from kallot.kube.ops.metrics import Metrics
from kallot.kube.ops.reporter import Reporter
from kallot.kube.schedule.problems import pod_ref
from kallot.kube.state.cache import Cache

logger = logging.getLogger(__name__)


class Evictor:
    """Evictions in flight and the preemptors that wait for them. Runs on the event loop."""

    def __init__(
        self,
        client: KubeClient,
        cache: Cache,
        reporter: Reporter,
        metrics: Metrics,
        *,
        preemption_wait_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.cache = cache
        self.reporter = reporter
        self.metrics = metrics
        self.preemption_wait_s = preemption_wait_s
        self._clock = clock
        # preemptor uid -> (victim uids, monotonic deadline): sits out sessions meanwhile
        self._preempting: dict[str, tuple[frozenset[str], float]] = {}
        self._evicting: set[asyncio.Task[None]] = set()

    def sitting_out(self) -> frozenset[str]:
        """The preemptors whose victims are still there (and whose wait has not run out)."""
        return frozenset(u for u in list(self._preempting) if self._waits_for_victims(u))

    def _waits_for_victims(self, uid: str) -> bool:
        held = self._preempting.get(uid)
        if held is None:
            return False
        victims, deadline = held
        if self._clock() < deadline and any(self.cache.pod(v) is not None for v in victims):
            return True
        del self._preempting[uid]
        return False

    def carry_out(self, decision: Decision) -> set[str]:
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
                self._spawn(self._nominate(preemptor.namespace, preemptor.name, evictions[0].node))
            for ev in evictions:
                victim = self.cache.pod(ev.task_id)
                if victim is None:
                    continue
                victims.add(victim.uid)
                kind = ev.reason.split(" ", 1)[0]
                self.metrics.evictions.labels(kind).inc()
                logger.info("evict pod=%s node=%s for=%s reason=%s", victim.key, ev.node, who, kind)
                self.reporter.preempted(
                    pod_ref(victim), f"evicted by kallot ({kind}) so that {who} fits on {ev.node}"
                )
                self._spawn(self._evict(victim.namespace, victim.name, victim.uid))
        # Every held task waits for all of this session's victims: conservative, and simple.
        hold = (frozenset(victims), self._clock() + self.preemption_wait_s)
        for uid in held:
            self._preempting[uid] = hold
        return held

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        t = asyncio.create_task(coro)
        self._evicting.add(t)
        t.add_done_callback(self._evicting.discard)

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
