"""The live scheduler's scheduling queue: which pending pods the next session takes, in what
order, and when a pod that did not fit (or whose bind failed, or that the core faulted on) is
retried.

Flow: the cache (``kube.state.cache``) asks ``eligible`` / ``cut`` / ``with_gang_peers`` for each
session's pods and ``next_wakeup`` for the loop's wait; the session loop's outcomes come back as
``park`` (unschedulable: wait for a capacity change, at most ``retry_interval`` often, at least
every ``flush_interval``), ``back_off_bind`` (a failed bind) and ``back_off_fault`` (the core
raised), both exponential. The pods themselves live in the store (``kube.state.store``); each
pod's place in the queue is its ``QueueState`` (``PodEntry.queue``), which only this module
writes. The queue reads the rest of the pod through ``Queued`` and does not import the store.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from kallot.core.status import Diagnosis

if TYPE_CHECKING:
    from kallot.core.errors import ConfigError
    from kallot.core.workload import Task

# QueueState.reason_kind of a pod the core faulted on (its Event says which plugin raised what).
FAULT_KIND = "SchedulerError"


@dataclass(frozen=True, slots=True)
class CacheTuning:
    """Retry timing for pods that did not fit (seconds)."""

    retry_interval: float = 1.0  # at most this often after a cluster change
    flush_interval: float = 60.0  # retried at least this often even without a change
    backoff_initial: float = 1.0  # after a failed bind
    backoff_max: float = 30.0


@dataclass(slots=True)
class QueueState:
    """One pod's place in the scheduling queue. Written by this module only (the
    ``SchedulingQueue``'s outcomes); the store creates it when the pod first shows up."""

    first_seen: float = 0.0  # monotonic time the cache first saw it pending
    attempts: int = 0  # sessions that placed it (a failed bind backs off by these)
    backoff_until: float = 0.0
    parked_generation: int = -1  # capacity generation when last found unschedulable
    parked_at: float = 0.0
    reason: str = ""  # why it is pending (diagnosis message or error), for metrics/explain
    reason_kind: str = "Queued"
    faults: int = 0  # sessions in a row whose core faulted on this pod (backoff doubles)


class Queued(Protocol):
    """What the queue reads of a pod (``kube.state.store.PodEntry``), and its ``QueueState``."""

    @property
    def uid(self) -> str: ...
    @property
    def kallot(self) -> bool: ...
    @property
    def pending(self) -> bool: ...
    @property
    def gated(self) -> bool: ...
    @property
    def task(self) -> Task | None: ...
    @property
    def error(self) -> ConfigError | None: ...
    @property
    def queue(self) -> QueueState: ...


Q = TypeVar("Q", bound=Queued)


def priority_order(e: Queued) -> tuple[int, float, str]:
    """A session's order: higher priority first, then older, then by uid."""
    assert e.task is not None
    return (-e.task.priority, e.task.created, e.uid)


def in_gang(e: Queued) -> bool:
    return e.task is not None and bool(e.task.job)


class SchedulingQueue:
    """Eligibility, order and back-off of pending pods (each pod's ``QueueState``).

    Not thread-safe: every method runs on the event loop.
    """

    def __init__(self, tuning: CacheTuning, clock: Any) -> None:
        self.tuning = tuning
        self._clock = clock

    def next_wakeup(self, pods: Iterable[Queued], capacity_generation: int) -> float | None:
        """Seconds until a parked or backed-off pod becomes eligible by time alone."""
        now = self._clock()
        soonest: float | None = None
        for e in pods:
            if not e.kallot or not e.pending or e.task is None or e.gated:
                continue
            q = e.queue
            t = q.backoff_until
            if q.parked_generation >= 0:
                flush = q.parked_at + self.tuning.flush_interval
                retry = q.parked_at + self.tuning.retry_interval
                t = max(t, retry if q.parked_generation < capacity_generation else flush)
            if t > now and (soonest is None or t - now < soonest):
                soonest = t - now
        return soonest

    def eligible(self, e: Queued, now: float, capacity_generation: int) -> bool:
        if not e.kallot or not e.pending or e.task is None or e.gated:
            return False
        q = e.queue
        if q.backoff_until > now:
            return False
        if q.parked_generation >= 0:
            since = now - q.parked_at
            if since < self.tuning.retry_interval:
                return False
            if q.parked_generation >= capacity_generation and (since < self.tuning.flush_interval):
                return False
        return True

    @staticmethod
    def cut(eligible: list[Q], max_tasks: int) -> tuple[list[Q], int]:
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
    def with_gang_peers(pods: Iterable[Q], eligible: list[Q], now: float) -> list[Q]:
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
                and e.pending
                and e.task is not None
                and e.task.job in jobs
                and not e.gated
                and e.queue.backoff_until <= now
            ):
                out.append(e)
        return out

    # -- outcomes --------------------------------------------------------------------------------

    @staticmethod
    def assumed(entry: Queued) -> None:
        """A session placed it (a bind attempt): a failed bind backs off by these."""
        entry.queue.attempts += 1

    def back_off_bind(self, entry: Queued, reason: str, *, backoff: bool = True) -> None:
        """A bind failed or was abandoned (``reason``): back in the queue, after an exponential
        backoff in the pod's bind attempts unless ``backoff`` is False."""
        q = entry.queue
        q.reason = reason
        q.reason_kind = "BindFailed"
        if not backoff:
            return
        delay = min(
            self.tuning.backoff_max,
            self.tuning.backoff_initial * 2 ** max(0, q.attempts - 1),
        )
        q.backoff_until = self._clock() + delay

    def park(self, entry: Queued, diagnosis: Diagnosis, generation: int) -> None:
        """The core found no place: wait for a capacity generation after ``generation``."""
        q = entry.queue
        q.parked_generation = generation
        q.parked_at = self._clock()
        q.reason = diagnosis.message()
        plugins = [r.plugin for r in diagnosis.reasons if r.plugin]
        q.reason_kind = plugins[0] if plugins else "Unschedulable"

    def back_off_fault(self, entry: Queued, diagnosis: Diagnosis) -> float:
        """The core faulted on this pod: retry after an exponential backoff, whatever the
        cluster does meanwhile. Returns the delay in seconds."""
        q = entry.queue
        q.faults += 1
        delay = min(self.tuning.backoff_max, self.tuning.backoff_initial * 2.0 ** (q.faults - 1))
        q.backoff_until = self._clock() + delay
        q.parked_generation = -1
        q.reason = diagnosis.message()
        q.reason_kind = FAULT_KIND
        return delay

    @staticmethod
    def decided(entry: Queued) -> None:
        """The core decided on this pod without faulting: the fault backoff starts over."""
        entry.queue.faults = 0

    @staticmethod
    def invalid(entry: Queued, text: str) -> None:
        """The pod's request does not translate (``text`` says why): its pending reason."""
        entry.queue.reason = text
        entry.queue.reason_kind = "InvalidRequest"

    @staticmethod
    def readable_again(entry: Queued) -> None:
        """The pod's request translates again after an error: tried again at once."""
        entry.queue.parked_generation = -1

    # -- views for metrics and explain -----------------------------------------------------------

    def pending_by_reason(self, pods: Iterable[Queued]) -> dict[str, int]:
        out: dict[str, int] = {}
        now = self._clock()
        for e in pods:
            if not e.kallot or not e.pending:
                continue
            q = e.queue
            if e.error is not None:
                kind = "InvalidRequest"
            elif e.gated:
                kind = "Gated"
            elif q.backoff_until > now:
                kind = "Backoff"
            elif q.parked_generation >= 0:
                kind = q.reason_kind
            else:
                kind = "Queued"
            out[kind] = out.get(kind, 0) + 1
        return out
