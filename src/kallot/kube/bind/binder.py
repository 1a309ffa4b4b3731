"""The binding cycle's driver: per placement the PreBind steps (``kube.bind.steps``), then the
Bind, one ``pods/binding`` call that sets ``spec.nodeName`` and the device record in the same
write, with retries kept here (never in the core); a pod that ends unbound has every step
undone through one path (``_settle``).

Flow: the controller ``submit``s each placement right after its Reserve (``Cache.assume``,
and ``DraCache.reserve`` for its claims); workers run the cycles concurrently. Success leaves the pod assumed until the watch confirms it. Any failure (404: the
pod is gone; 409: a conflict; no answer or 5xx: outcome unknown; 429 after the client's retries)
reads the pod back, and only that read settles it: bound (by this bind or another) -> the cache
follows the pod and its record; gone or replaced -> released; still unbound and the same pod ->
the bind is applied again with its devices still charged (``attempts`` in all), and only after
the last attempt released (``Cache.forget``) and retried by a later session with back-off. So a
bind that did succeed can never leave its GPUs free for another pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kallot.config import device_record
from kallot.core.decision import Placement
from kallot.kube import translate
from kallot.kube.api.client import ApiError, KubeClient
from kallot.kube.bind.steps import BindCycle, BindRequest, PreBindStep, default_steps
from kallot.kube.dra.cache import DraCache
from kallot.kube.state.cache import Cache, PodState

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class BindStats:
    bound: int = 0
    failed: int = 0
    abandoned: int = 0
    retried: int = 0  # binds applied again after a failure the read showed had not bound
    durations: list[float] = field(default_factory=list)


class Binder:
    """Concurrent binds with the cache kept in step. Runs on the event loop."""

    def __init__(
        self,
        client: KubeClient,
        cache: Cache,
        *,
        workers: int = 16,
        on_bound: Callable[[str, float], None] | None = None,
        on_failed: Callable[[str, str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        verify_retry_s: float = 1.0,
        attempts: int = 3,
        dra: DraCache | None = None,
        steps: Sequence[PreBindStep] | None = None,
    ) -> None:
        """``steps``: the PreBind steps in order (default: ``steps.default_steps``)."""
        self.client = client
        self.dra = dra
        self.cache = cache
        self.steps: tuple[PreBindStep, ...] = (
            tuple(steps) if steps is not None else default_steps(client, cache, dra)
        )
        self.workers = workers
        self.on_bound = on_bound
        self.on_failed = on_failed
        self._clock = clock
        self._verify_retry_s = verify_retry_s
        self._attempts = attempts
        self._queue: asyncio.Queue[BindRequest] = asyncio.Queue()
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._tasks: list[asyncio.Task[None]] = []
        self.stats = BindStats()

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._worker(i)) for i in range(self.workers)]

    def submit(self, placement: Placement, namespace: str, name: str) -> None:
        self._idle.clear()
        self._in_flight += 1
        self._queue.put_nowait(
            BindRequest(
                uid=placement.task_id,
                namespace=namespace,
                name=name,
                node=placement.node,
                record=device_record.DeviceRecord.of(placement),
                submitted=self._clock(),
            )
        )

    @property
    def in_flight(self) -> int:
        return self._in_flight

    async def drain(self, timeout: float) -> bool:
        """Wait until every submitted bind finished (True) or ``timeout`` passed (False)."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks = []

    async def _worker(self, index: int) -> None:
        del index
        while True:
            req = await self._queue.get()
            try:
                await self._cycle(req)
            except asyncio.CancelledError:
                raise
            except Exception:
                # A bug must not kill the worker: keep the devices charged (safe) and log.
                logger.exception(
                    "bind crashed pod=%s/%s node=%s", req.namespace, req.name, req.node
                )
            finally:
                self._in_flight -= 1
                if self._in_flight == 0:
                    self._idle.set()

    async def _cycle(self, req: BindRequest) -> None:
        """One binding cycle: PreBind steps, Bind, and whatever happened, ``_settle``."""
        entry = self.cache.pod(req.uid)
        if entry is None or entry.state is not PodState.ASSUMED or entry.node != req.node:
            self.stats.abandoned += 1
            # deleted or re-decided since the session: nothing to bind (what was reserved
            # for it is given back below, unless a newer placement on this node owns it)
            await self._settle(BindCycle(req, entry))
            return
        cycle = BindCycle(req, entry)
        try:
            await self._bind(cycle)
        finally:
            await self._settle(cycle)

    async def _settle(self, cycle: BindCycle) -> None:
        """The one way a cycle ends: a pod bound (or still assumed on this node: bound by a
        retry in flight, or a crash that keeps its devices charged) keeps what every step
        wrote; any other undoes every step, newest first."""
        req = cycle.req
        entry = self.cache.pod(req.uid)
        if entry is not None and (
            entry.state is PodState.BOUND
            or (entry.state is PodState.ASSUMED and entry.node == req.node)
        ):
            for step in self.steps:
                step.bound(cycle)
            return
        await self._undo(cycle)

    async def _undo(self, cycle: BindCycle) -> None:
        for step in reversed(self.steps):
            try:
                await step.undo(cycle)
            except asyncio.CancelledError:
                raise
            except Exception:
                # One undo's bug must not keep the steps before it from being undone.
                logger.exception("undo crashed step=%s pod=%s", step.name, cycle.req.uid)

    async def _bind(self, cycle: BindCycle) -> None:
        req = cycle.req
        if not self.cache.has_node(req.node):
            self.stats.abandoned += 1
            self.cache.forget(req.uid, reason=f"node {req.node} was deleted before the bind")
            return
        start = self._clock()
        for step in self.steps:
            problem = await step.pre_bind(cycle)
            if problem:
                self.stats.failed += 1
                reason = f"binding to {req.node} failed: {problem}"
                self.cache.forget(req.uid, reason=reason)
                if self.on_failed is not None:
                    self.on_failed(req.uid, reason)
                return
        for attempt in range(1, self._attempts + 1):
            try:
                await self.client.bind(
                    req.namespace,
                    req.name,
                    uid=req.uid,
                    node=req.node,
                    annotations=(
                        translate.record_annotations(cycle.record, time.time_ns())
                        if cycle.record is not None
                        else {}
                    ),
                )
                break
            except ApiError as exc:
                self.stats.failed += 1
                if not await self._after_failure(req, exc, last=attempt == self._attempts):
                    return
        took = self._clock() - start
        self.stats.bound += 1
        self.stats.durations.append(took)
        logger.debug("bound pod=%s/%s node=%s took=%.3fs", req.namespace, req.name, req.node, took)
        if self.on_bound is not None:
            self.on_bound(req.uid, took)

    async def _after_failure(self, req: BindRequest, exc: ApiError, *, last: bool) -> bool:
        """Settle a failed bind by reading the pod; True when the bind should be applied
        again (the same pod, still unbound, its devices still charged)."""
        logger.info(
            "bind failed pod=%s/%s node=%s status=%d error=%s",
            req.namespace,
            req.name,
            req.node,
            exc.status,
            exc.message,
        )
        # Read the pod back until the API answers: only the truth may release the devices.
        while True:
            try:
                pod = await self.client.get_pod(req.namespace, req.name)
            except ApiError as read_exc:
                if read_exc.not_found:
                    self.cache.forget(req.uid, reason="pod deleted before the bind", backoff=False)
                    return False
                logger.warning(
                    "cannot read pod after failed bind pod=%s/%s error=%s",
                    req.namespace,
                    req.name,
                    read_exc,
                )
                await asyncio.sleep(self._verify_retry_s)
                entry = self.cache.pod(req.uid)
                if entry is None or entry.state is not PodState.ASSUMED:
                    return False  # the watch already told us
                continue
            break
        meta: dict[str, Any] = pod.get("metadata") or {}
        if str(meta.get("uid", "")) != req.uid:
            # Same name, new pod: ours was deleted.
            self.cache.forget(req.uid, reason="pod replaced before the bind", backoff=False)
            return False
        if translate.pod_node(pod):
            # Bound after all (a retried request, or another replica): follow the pod.
            self.cache.apply_pod("MODIFIED", pod)
            return False
        entry = self.cache.pod(req.uid)
        if (
            not last
            and not meta.get("deletionTimestamp")
            and entry is not None
            and entry.state is PodState.ASSUMED
            and entry.node == req.node
            and self.cache.has_node(req.node)
        ):
            # Not bound, same pod, our devices still charged: apply the bind again.
            self.stats.retried += 1
            return True
        reason = f"binding to {req.node} failed: {exc.message or exc.reason or exc.status}"
        self.cache.forget(req.uid, reason=reason)
        if self.on_failed is not None:
            self.on_failed(req.uid, reason)
        return False
