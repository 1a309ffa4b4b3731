"""Tells users what the scheduler decided, on the objects they look at: Kubernetes Events and
the pod's ``PodScheduled`` condition.

Flow: the controller calls ``unschedulable`` / ``invalid`` / ``scheduled`` / ``preempted`` /
``node_problem`` / ``queue_problem``;
each becomes a queued write done by a few workers. Writes are side effects that must never
fail or slow a decision: they are deduplicated per pod (a new message, or the same one again
after ``repeat_s``; a failure of the same kind at most once every 30 s, the latest one held
back written when the 30 s end), bounded (when the queue is full the write is dropped and counted), and
errors are logged, not raised. One pod's writes go out one at a time, in order: two workers
writing the same pod's condition at once could land in either order and leave an older reason
standing (the newer one is then deduplicated for ``repeat_s``). A write that fails (no answer, 5xx, 429, 409) is tried again
with back-off until it lands, the pod is gone (404), or a newer write for the same pod (or its
bind) made it moot, so every pending pod ends up with its reason even when the API was failing
when it was first written. A pod's Unschedulable condition whose write finds the pod bound
(the bind reached the API server first) is put back to what the binding set, with no Event.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kallot.config import wire
from kallot.kube.api.client import ApiError, KubeClient

logger = logging.getLogger(__name__)

COMPONENT = "kallot"
REASON_FAILED = "FailedScheduling"
REASON_INVALID = "InvalidRequest"
REASON_SCHEDULED = "Scheduled"
REASON_PREEMPTED = "Preempted"
# No gang derived from the pod's owner (kube.owners): it schedules as a single pod.
REASON_NO_GANG = "NoGangDerived"
QUEUE_API_VERSION = f"{wire.CRD_GROUP}/{wire.CRD_VERSION}"
# A condition message is shown by `kubectl describe`; the API allows 32 KiB, keep it readable.
MAX_MESSAGE = 4000


def _now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class PodRef:
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class _Write:
    ref: PodRef | None
    kind: str  # "Pod", "Node" or "Queue"
    name: str
    event_type: str  # Normal | Warning
    reason: str
    message: str
    condition: bool  # also patch PodScheduled=False
    api_version: str = "v1"
    seq: int = 0  # the pod's write number: a newer one makes this one moot
    attempt: int = 0


class Reporter:
    """Events and PodScheduled conditions, best effort."""

    def __init__(
        self,
        client: KubeClient,
        *,
        identity: str,
        workers: int = 4,
        queue_size: int = 20000,
        repeat_s: float = 300.0,
        scheduled_events: bool = True,
        on_dropped: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        still_pending: Callable[[str], bool] | None = None,
        retry_initial_s: float = 0.5,
        retry_max_s: float = 30.0,
    ) -> None:
        self.client = client
        self.identity = identity
        self.workers = workers
        self.repeat_s = repeat_s
        self.scheduled_events = scheduled_events
        self.on_dropped = on_dropped
        self._clock = clock
        self._queue: asyncio.Queue[_Write] = asyncio.Queue(maxsize=queue_size)
        self._last: dict[str, tuple[str, float, str]] = {}  # uid -> (message, when, kind)
        self._seq: dict[str, int] = {}  # uid -> number of its latest write
        # Whether a pod (uid) still waits: an Unschedulable write is not retried once it is not.
        self._still_pending = still_pending
        self._retry_initial_s = retry_initial_s
        self._retry_max_s = retry_max_s
        self._tasks: list[asyncio.Task[None]] = []
        self._retries: set[asyncio.Task[None]] = set()
        # uid -> (its lock, workers holding or waiting for it): one write per pod at a time.
        self._pod_locks: dict[str, tuple[asyncio.Lock, int]] = {}
        # uid -> (timer, report): the latest report the 30 s churn limit held back, written
        # when the limit's window ends (else the pod shows the older reason until its next).
        self._held: dict[str, tuple[asyncio.TimerHandle, tuple[PodRef, str, str, str, str]]] = {}
        self.in_flight = 0
        self.written = 0
        self.dropped = 0
        self.retried = 0

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._worker()) for _ in range(self.workers)]

    async def stop(self, timeout: float = 2.0) -> None:
        """Give queued writes ``timeout`` seconds, then stop."""
        deadline = time.monotonic() + timeout
        while not self._queue.empty() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for timer, _ in self._held.values():
            timer.cancel()
        self._held.clear()
        tasks = [*self._tasks, *self._retries]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks = []
        self._retries.clear()

    def forget(self, uid: str) -> None:
        self._last.pop(uid, None)
        self._seq.pop(uid, None)
        self._release_held(uid)

    def idle(self) -> bool:
        """Nothing queued, being written, held back or waiting to be retried."""
        return self._queue.empty() and self.in_flight == 0 and not self._retries and not self._held

    def last_message(self, uid: str) -> str | None:
        seen = self._last.get(uid)
        return seen[0] if seen else None

    # -- what happened ----------------------------------------------------------------------

    def unschedulable(self, ref: PodRef, message: str, kind: str = "") -> None:
        """``kind`` is what blocks the pod (the first plugin of the diagnosis, "PodGroup",
        "BindFailed"): a new kind is written at once, a new message of the same kind at
        most every 30 s."""
        self._pod(ref, "Warning", REASON_FAILED, message, kind)

    def invalid(self, ref: PodRef, message: str) -> None:
        self._pod(ref, "Warning", REASON_INVALID, f"invalid GPU request: {message}", "Invalid")

    def scheduled(self, ref: PodRef, node: str, devices: str) -> None:
        self._last.pop(ref.uid, None)
        seq = self._next_seq(ref.uid)  # a pending Unschedulable retry is moot now
        if not self.scheduled_events:
            return
        text = f"Successfully assigned {ref.namespace}/{ref.name} to {node}"
        if devices:
            text += f" ({devices})"
        self._put(_Write(ref, "Pod", ref.name, "Normal", REASON_SCHEDULED, text, False, seq=seq))

    def _next_seq(self, uid: str) -> int:
        seq = self._seq.get(uid, 0) + 1
        self._seq[uid] = seq
        return seq

    def node_problem(self, node: str, reason: str, message: str) -> None:
        self._put(_Write(None, "Node", node, "Warning", reason, message, False))

    def queue_problem(self, queue: str, reason: str, message: str) -> None:
        self._put(
            _Write(None, "Queue", queue, "Warning", reason, message, False, QUEUE_API_VERSION)
        )

    def pod_warning(self, ref: PodRef, reason: str, message: str) -> None:
        """A Warning Event on a pod that does not change why it waits (no condition)."""
        self._put(_Write(ref, "Pod", ref.name, "Warning", reason, message[:MAX_MESSAGE], False))

    def note(
        self, ref: PodRef | None, node: str, reason: str, message: str, *, warning: bool
    ) -> None:
        """An Event on the pod ``ref`` (when given) and on ``node`` (when given), Normal or
        Warning, changing no condition (MIG re-layouts, kube.schedule.migplan)."""
        kind = "Warning" if warning else "Normal"
        if ref is not None:
            self._put(_Write(ref, "Pod", ref.name, kind, reason, message[:MAX_MESSAGE], False))
        if node:
            self._put(_Write(None, "Node", node, kind, reason, message[:MAX_MESSAGE], False))

    def preempted(self, ref: PodRef, message: str) -> None:
        """The pod is being evicted so that another fits (reclaim or preemption)."""
        self._put(_Write(ref, "Pod", ref.name, "Normal", REASON_PREEMPTED, message, False))

    def _pod(self, ref: PodRef, event_type: str, reason: str, message: str, kind: str) -> None:
        message = message[:MAX_MESSAGE]
        now = self._clock()
        self._release_held(ref.uid)  # this report supersedes one held back
        last = self._last.get(ref.uid)
        if last is not None and last[0] == message and now - last[1] < self.repeat_s:
            return
        window = min(30.0, self.repeat_s)
        if (
            last is not None
            and now - last[1] < window
            and reason == REASON_FAILED
            and kind == last[2]
        ):
            # Churn changes numbers in the message ("largest free is 12 GiB"); keep at most
            # one write every 30 s per pod for the same kind of failure. The report is held,
            # not lost: the latest one held is written when the 30 s are up, if the pod still
            # waits (a reason that settles within them would otherwise stay unwritten until
            # the pod's next report, up to a minute later).
            self._hold(ref, (ref, event_type, reason, message, kind), last[1] + window - now)
            return
        self._enqueue(ref, event_type, reason, message, kind)

    def _enqueue(self, ref: PodRef, event_type: str, reason: str, message: str, kind: str) -> None:
        self._last[ref.uid] = (message, self._clock(), kind)
        seq = self._next_seq(ref.uid)
        if not self._put(_Write(ref, "Pod", ref.name, event_type, reason, message, True, seq=seq)):
            del self._last[ref.uid]  # dropped: the pod's next report is written, not deduplicated

    def _hold(self, ref: PodRef, report: tuple[PodRef, str, str, str, str], delay: float) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # reported outside an event loop: there is no clock to write it later by
        timer = loop.call_later(max(0.0, delay), self._write_held, ref.uid)
        self._held[ref.uid] = (timer, report)

    def _release_held(self, uid: str) -> tuple[PodRef, str, str, str, str] | None:
        held = self._held.pop(uid, None)
        if held is None:
            return None
        held[0].cancel()
        return held[1]

    def _write_held(self, uid: str) -> None:
        report = self._release_held(uid)
        if report is None or (self._still_pending is not None and not self._still_pending(uid)):
            return
        self._enqueue(*report)

    def _put(self, write: _Write) -> bool:
        try:
            self._queue.put_nowait(write)
        except asyncio.QueueFull:
            self.dropped += 1
            if self.on_dropped is not None:
                self.on_dropped()
            return False
        return True

    # -- writing -------------------------------------------------------------------------------

    async def _worker(self) -> None:
        while True:
            w = await self._queue.get()
            if self._moot(w):
                continue
            self.in_flight += 1
            try:
                await self._write_in_order(w)
            finally:
                self.in_flight -= 1

    async def _write_in_order(self, w: _Write) -> None:
        uid = w.ref.uid if w.ref is not None and w.seq else ""
        if not uid:
            await self._attempt(w)
            return
        lock, users = self._pod_locks.get(uid) or (asyncio.Lock(), 0)
        self._pod_locks[uid] = (lock, users + 1)
        try:
            async with lock:  # FIFO: the pod's writes go out in the order they were taken
                if not self._moot(w):  # a newer one may have been queued while this waited
                    await self._attempt(w)
        finally:
            lock, users = self._pod_locks[uid]
            if users == 1:
                del self._pod_locks[uid]
            else:
                self._pod_locks[uid] = (lock, users - 1)

    async def _attempt(self, w: _Write) -> None:
        try:
            await self._write(w)
            self.written += 1
        except asyncio.CancelledError:
            raise
        except ApiError as exc:
            if exc.not_found:
                return  # the pod (node, queue) is gone: nobody to tell
            if not (exc.outcome_unknown or exc.status in (409, 429)):
                # Refused for good (403, 422: a namespace being deleted, a bad write).
                logger.info("event/condition write refused object=%s error=%s", w.name, exc)
                return
            logger.info(
                "event/condition write failed object=%s attempt=%d error=%s",
                w.name,
                w.attempt + 1,
                exc,
            )
            self._retry(w)
        except Exception:
            logger.exception("event/condition write crashed object=%s", w.name)

    def _moot(self, w: _Write) -> bool:
        """A pod's write superseded by a newer one, or about a pod no longer pending."""
        if w.ref is None or w.seq == 0:
            return False
        if self._seq.get(w.ref.uid) != w.seq:
            return True
        return (
            w.condition and self._still_pending is not None and not self._still_pending(w.ref.uid)
        )

    def _retry(self, w: _Write) -> None:
        delay = min(self._retry_max_s, self._retry_initial_s * 2.0 ** min(w.attempt, 10))

        async def later() -> None:
            await asyncio.sleep(delay)
            self.retried += 1
            if not self._put(dataclasses.replace(w, attempt=w.attempt + 1)) and w.ref is not None:
                self._last.pop(w.ref.uid, None)  # its next report is written again

        t = asyncio.create_task(later())
        self._retries.add(t)
        t.add_done_callback(self._retries.discard)

    async def _write(self, w: _Write) -> None:
        if w.ref is not None and w.condition:
            pod = await self._condition(w.ref, "False", "Unschedulable", w.message)
            if (pod.get("spec") or {}).get("nodeName"):
                # Bound between the decision and this write (the binder and the reporter run
                # side by side, and a bind can reach the API server first): put back the
                # condition the binding set, and post no Event about a pod that is placed.
                await self._condition(w.ref, "True", None, None)
                return
        namespace = w.ref.namespace if w.ref is not None else "default"
        involved: dict[str, Any] = {"kind": w.kind, "name": w.name, "apiVersion": w.api_version}
        if w.ref is not None:
            involved.update(namespace=w.ref.namespace, uid=w.ref.uid)
        now = _now_rfc3339()
        await self.client.create_event(
            namespace,
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"generateName": f"{w.name}.", "namespace": namespace},
                "involvedObject": involved,
                "reason": w.reason,
                "message": w.message,
                "type": w.event_type,
                "source": {"component": COMPONENT},
                "reportingComponent": COMPONENT,
                "reportingInstance": self.identity,
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": 1,
            },
        )

    async def _condition(
        self, ref: PodRef, status: str, reason: str | None, message: str | None
    ) -> dict[str, Any]:
        """Patch the pod's PodScheduled condition (None removes a field); the pod as written."""
        return await self.client.patch_pod_status(
            ref.namespace,
            ref.name,
            {
                "metadata": {"uid": ref.uid},
                "status": {
                    "conditions": [
                        {
                            "type": "PodScheduled",
                            "status": status,
                            "reason": reason,
                            "message": message,
                            "lastTransitionTime": _now_rfc3339(),
                        }
                    ]
                },
            },
        )
