"""The live scheduler's scheduling queue: which pending pods the next session takes, in what
order, and when a pod that did not fit (or whose bind failed, or that the core faulted on) is
retried.

Flow: the cache (``kube.cache``) asks ``eligible`` / ``cut`` / ``with_gang_peers`` for each
session's pods and ``next_wakeup`` for the loop's wait; the controller's outcomes come back as
``park`` (unschedulable: wait for a capacity change, at most ``retry_interval`` often, at least
every ``flush_interval``), ``back_off_bind`` (a failed bind) and ``back_off_fault`` (the core
raised), both exponential. The pods themselves live in the store (``kube.store``).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kallot.core.status import Diagnosis
from kallot.kube.store import PodEntry, PodState

# PodEntry.reason_kind of a pod the core faulted on (its Event says which plugin raised what).
FAULT_KIND = "SchedulerError"


@dataclass(frozen=True, slots=True)
class CacheTuning:
    """Retry timing for pods that did not fit (seconds)."""

    retry_interval: float = 1.0  # at most this often after a cluster change
    flush_interval: float = 60.0  # retried at least this often even without a change
    backoff_initial: float = 1.0  # after a failed bind
    backoff_max: float = 30.0


def priority_order(e: PodEntry) -> tuple[int, float, str]:
    """A session's order: higher priority first, then older, then by uid."""
    assert e.task is not None
    return (-e.task.priority, e.task.created, e.uid)


def in_gang(e: PodEntry) -> bool:
    return e.task is not None and bool(e.task.job)


class SchedulingQueue:
    """Eligibility, order and back-off of pending pods (the state is kept on each PodEntry).

    Not thread-safe: every method runs on the event loop.
    """

    def __init__(self, tuning: CacheTuning, clock: Any) -> None:
        self.tuning = tuning
        self._clock = clock

    def next_wakeup(self, pods: Iterable[PodEntry], capacity_generation: int) -> float | None:
        """Seconds until a parked or backed-off pod becomes eligible by time alone."""
        now = self._clock()
        soonest: float | None = None
        for e in pods:
            if not e.kallot or e.state is not PodState.PENDING or e.task is None or e.gated:
                continue
            t = e.backoff_until
            if e.parked_generation >= 0:
                flush = e.parked_at + self.tuning.flush_interval
                retry = e.parked_at + self.tuning.retry_interval
                t = max(t, retry if e.parked_generation < capacity_generation else flush)
            if t > now and (soonest is None or t - now < soonest):
                soonest = t - now
        return soonest

    def eligible(self, e: PodEntry, now: float, capacity_generation: int) -> bool:
        if not e.kallot or e.state is not PodState.PENDING or e.task is None or e.gated:
            return False
        if e.backoff_until > now:
            return False
        if e.parked_generation >= 0:
            since = now - e.parked_at
            if since < self.tuning.retry_interval:
                return False
            if e.parked_generation >= capacity_generation and (since < self.tuning.flush_interval):
                return False
        return True

    @staticmethod
    def cut(eligible: list[PodEntry], max_tasks: int) -> tuple[list[PodEntry], int]:
        """``eligible`` in priority order, cut to at most ``max_tasks`` pods outside gangs plus
        every gang member (0: no cut); and how many eligible pods the cut left behind."""
        backlog = 0
        gang = sum(1 for e in eligible if in_gang(e))
        if max_tasks and len(eligible) > max_tasks + gang:
            # Only the first max_tasks + gang entries in priority order can be taken (gang
            # members are always taken, plain pods while the session has room): select them
            # instead of sorting every pending pod, then add the gang members further back.
            head = heapq.nsmallest(max_tasks + gang, eligible, key=priority_order)
            taken = {e.uid for e in head}
            rest = sorted(
                (e for e in eligible if in_gang(e) and e.uid not in taken),
                key=priority_order,
            )
            backlog = len(eligible) - len(head) - len(rest)
            eligible = head + rest
        else:
            eligible.sort(key=priority_order)
        return eligible, backlog

    @staticmethod
    def with_gang_peers(
        pods: Iterable[PodEntry], eligible: list[PodEntry], now: float
    ) -> list[PodEntry]:
        """``eligible`` plus every other pending member of their gangs, parked or not: a gang
        is decided with all its members together, so a member that arrives (or wakes) brings
        the parked rest along, whatever order the members and the PodGroup came in."""
        jobs = {e.task.job for e in eligible if e.task is not None and e.task.job}
        if not jobs:
            return eligible
        have = {e.uid for e in eligible}
        out = list(eligible)
        for e in pods:
            if (
                e.uid not in have
                and e.kallot
                and e.state is PodState.PENDING
                and e.task is not None
                and e.task.job in jobs
                and not e.gated
                and e.backoff_until <= now
            ):
                out.append(e)
        return out

    # -- outcomes --------------------------------------------------------------------------------

    def back_off_bind(self, entry: PodEntry) -> None:
        """A bind failed: retry after an exponential backoff in the pod's bind attempts."""
        delay = min(
            self.tuning.backoff_max,
            self.tuning.backoff_initial * 2 ** max(0, entry.attempts - 1),
        )
        entry.backoff_until = self._clock() + delay

    def park(self, entry: PodEntry, diagnosis: Diagnosis, generation: int) -> None:
        """The core found no place: wait for a capacity generation after ``generation``."""
        entry.parked_generation = generation
        entry.parked_at = self._clock()
        entry.reason = diagnosis.message()
        plugins = [r.plugin for r in diagnosis.reasons if r.plugin]
        entry.reason_kind = plugins[0] if plugins else "Unschedulable"

    def back_off_fault(self, entry: PodEntry, diagnosis: Diagnosis) -> float:
        """The core faulted on this pod: retry after an exponential backoff, whatever the
        cluster does meanwhile. Returns the delay in seconds."""
        entry.faults += 1
        delay = min(
            self.tuning.backoff_max, self.tuning.backoff_initial * 2.0 ** (entry.faults - 1)
        )
        entry.backoff_until = self._clock() + delay
        entry.parked_generation = -1
        entry.reason = diagnosis.message()
        entry.reason_kind = FAULT_KIND
        return delay

    # -- views for metrics and explain -----------------------------------------------------------

    def pending_by_reason(self, pods: Iterable[PodEntry]) -> dict[str, int]:
        out: dict[str, int] = {}
        now = self._clock()
        for e in pods:
            if not e.kallot or e.state is not PodState.PENDING:
                continue
            if e.error is not None:
                kind = "InvalidRequest"
            elif e.gated:
                kind = "Gated"
            elif e.backoff_until > now:
                kind = "Backoff"
            elif e.parked_generation >= 0:
                kind = e.reason_kind
            else:
                kind = "Queued"
            out[kind] = out.get(kind, 0) + 1
        return out
