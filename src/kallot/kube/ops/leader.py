"""Leader election on a ``coordination.k8s.io/v1`` Lease, so that of several replicas exactly
one schedules (after client-go's leaderelection).

The leader renews the Lease every ``retry_period_s``; a candidate takes it over once it has
seen the same Lease record unchanged for ``lease_duration_s`` by its *own* clock (never by
comparing timestamps written by another machine, so clock skew cannot elect two leaders).
A leader that cannot renew within ``renew_deadline_s`` (< lease duration) stops being leader
before anyone else may take over. Updates carry the Lease's resourceVersion, so two candidates
racing for an expired Lease cannot both win. ``release`` hands the Lease back on shutdown so a
standby takes over within one acquire period.

A candidate polls every ``acquire_period_s`` (default: half the retry period). When it first
sees a Lease record whose ``renewTime`` is already older, by its wall clock, than the clock skew
it allows (``max_clock_skew_s``), it counts the excess as time already observed: a holder that
died long ago is replaced at once instead of after a full lease duration (a crash loop with
fresh identities would otherwise leave the cluster without a leader for most of the time). A
negative ``max_clock_skew_s`` never trusts the timestamps (client-go's rule).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import random
import time
from collections.abc import Callable
from typing import Any

from kallot.kube.api.client import ApiError, KubeClient

logger = logging.getLogger(__name__)


def _micro_time() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """One candidate for one Lease. ``run()`` until cancelled; watch ``is_leader``."""

    def __init__(
        self,
        client: KubeClient,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_duration_s: float = 10.0,
        renew_deadline_s: float = 7.0,
        retry_period_s: float = 2.0,
        acquire_period_s: float | None = None,
        max_clock_skew_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        if not retry_period_s < renew_deadline_s < lease_duration_s:
            raise ValueError(
                "leader election needs retry period < renew deadline < lease duration, got "
                f"{retry_period_s} / {renew_deadline_s} / {lease_duration_s}"
            )
        self.client = client
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        self.collection = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration_s = lease_duration_s
        self.renew_deadline_s = renew_deadline_s
        self.retry_period_s = retry_period_s
        self.acquire_period_s = retry_period_s / 2 if acquire_period_s is None else acquire_period_s
        if self.acquire_period_s <= 0:
            raise ValueError(f"acquire period: got {self.acquire_period_s}, expected > 0")
        self.max_clock_skew_s = max_clock_skew_s
        self._clock = clock
        self._wall_clock = wall_clock
        self.on_change = on_change
        self.is_leader = False
        self.elected = asyncio.Event()
        self.lost = asyncio.Event()
        self.holder = ""
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0
        self._last_renew = 0.0

    async def run(self) -> None:
        """Acquire, then renew until renewal fails past the deadline (sets ``lost``)."""
        while not await self._try_acquire_or_renew():
            await asyncio.sleep(self.acquire_period_s * (1 + 0.2 * random.random()))
        self._set_leader(True)
        while True:
            await asyncio.sleep(self.retry_period_s)
            deadline = self._last_renew + self.renew_deadline_s
            renewed = False
            while not renewed and self._clock() < deadline:
                try:
                    renewed = await asyncio.wait_for(
                        self._try_acquire_or_renew(), max(0.1, deadline - self._clock())
                    )
                except TimeoutError:
                    renewed = False
                if not renewed and self._clock() < deadline:
                    await asyncio.sleep(min(self.retry_period_s / 4, 0.5))
            if not renewed:
                logger.error(
                    "leader lease lost lease=%s/%s identity=%s",
                    self.namespace,
                    self.name,
                    self.identity,
                )
                self._set_leader(False)
                self.lost.set()
                return

    def _set_leader(self, leader: bool) -> None:
        if leader == self.is_leader:
            return
        self.is_leader = leader
        if leader:
            self.elected.set()
            logger.info(
                "became leader lease=%s/%s identity=%s", self.namespace, self.name, self.identity
            )
        else:
            self.elected.clear()
        if self.on_change is not None:
            self.on_change(leader)

    async def _try_acquire_or_renew(self) -> bool:
        now_text = _micro_time()
        try:
            lease = await self.client.get(self.path, timeout=self.renew_deadline_s)
        except ApiError as exc:
            if not exc.not_found:
                logger.warning("lease read failed lease=%s error=%s", self.name, exc)
                return False
            body = self._lease_body({}, now_text, transitions=0, acquire=True)
            try:
                await self.client.create(self.collection, body)
            except ApiError as create_exc:
                logger.info("lease create lost lease=%s error=%s", self.name, create_exc)
                return False
            self._last_renew = self._clock()
            self.holder = self.identity
            return True
        spec: dict[str, Any] = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        record = (holder, str(spec.get("renewTime") or ""))
        if record != self._observed:
            first = self._observed is None
            self._observed = record
            self._observed_at = self._clock() - (self._stale_for(record[1]) if first else 0.0)
        self.holder = holder
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration_s)
        if holder and holder != self.identity and self._clock() < self._observed_at + duration:
            return False  # someone else holds a lease that has not expired by our clock
        transitions = int(spec.get("leaseTransitions") or 0)
        mine = holder == self.identity
        body = self._lease_body(
            lease.get("metadata") or {},
            now_text,
            transitions=transitions if mine else transitions + 1,
            acquire=not mine,
            acquire_time=str(spec.get("acquireTime") or now_text),
        )
        try:
            await self.client.replace(self.path, body)
        except ApiError as exc:
            if not exc.conflict:
                logger.warning("lease update failed lease=%s error=%s", self.name, exc)
            return False
        self._last_renew = self._clock()
        self.holder = self.identity
        return True

    def _stale_for(self, renew_time: str) -> float:
        """Seconds the record had not been renewed before we first saw it, beyond the clock
        skew we allow (0 when unknown, fresh, or timestamps are not trusted)."""
        if self.max_clock_skew_s < 0 or not renew_time:
            return 0.0
        try:
            renewed = dt.datetime.fromisoformat(renew_time.replace("Z", "+00:00"))
        except ValueError:
            return 0.0
        age = self._wall_clock() - renewed.timestamp()
        return max(0.0, age - self.max_clock_skew_s)

    def _lease_body(
        self,
        metadata: dict[str, Any],
        now_text: str,
        *,
        transitions: int,
        acquire: bool,
        acquire_time: str = "",
    ) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if metadata.get("resourceVersion"):
            meta["resourceVersion"] = metadata["resourceVersion"]
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": int(self.lease_duration_s),
                "acquireTime": now_text if acquire else acquire_time,
                "renewTime": now_text,
                "leaseTransitions": transitions,
            },
        }

    async def release(self) -> None:
        """Give the Lease up (if held) so a standby need not wait for it to expire."""
        if not self.is_leader:
            return
        self._set_leader(False)
        try:
            lease = await self.client.get(self.path, timeout=2.0)
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != self.identity:
                return
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": self.name,
                    "namespace": self.namespace,
                    "resourceVersion": (lease.get("metadata") or {}).get("resourceVersion"),
                },
                "spec": {
                    **spec,
                    "holderIdentity": "",
                    "leaseDurationSeconds": 1,
                    "renewTime": _micro_time(),
                },
            }
            await self.client.replace(self.path, body)
            logger.info(
                "released lease=%s/%s identity=%s", self.namespace, self.name, self.identity
            )
        except ApiError as exc:
            logger.warning("lease release failed lease=%s error=%s", self.name, exc)
