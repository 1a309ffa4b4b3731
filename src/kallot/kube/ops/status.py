"""``status`` of Queues and PodGroups, written by the leading scheduler from its cache.

Where it sits: beside the session loop, not in it. Every ``interval_s`` the leader computes
each object's status from the cache (``compute``: pure, from the pods it holds) and PATCHes
the ``status`` subresource of those whose status changed since it last wrote them (a new
leader writes everything once). What it writes:

- Queue: ``allocatedMilli`` / ``allocated`` (GPU-equivalents held by the pods of the queue and
  of every queue below it), ``pending`` (their pods waiting), ``guaranteed`` (the GPU quota),
  ``phase`` (``Active``; ``Invalid`` when the spec does not validate, with ``message``).
- PodGroup: ``scheduled`` (members bound), ``pending`` (members waiting), ``phase``
  (``Pending`` below ``minAvailable``, ``Scheduled`` at or above it, ``Failed`` when the spec
  does not validate) and ``message`` (why a waiting member waits).

Failures are logged and retried on the next round; status is a report, never an input.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from kallot.config import wire
from kallot.kube.api.client import ApiError, KubeClient
from kallot.kube.state.cache import Cache, PodState

logger = logging.getLogger(__name__)

BASE = f"/apis/{wire.CRD_GROUP}/{wire.CRD_VERSION}"
_HELD = (PodState.ASSUMED, PodState.BOUND)


def _gpus(milli: int) -> str:
    """milli GPU-equivalents as a decimal string of GPUs ("2.5"), as the Queue spec writes it."""
    return str((Decimal(milli) / 1000).normalize()) if milli else "0"


def queue_statuses(cache: Cache) -> dict[str, dict[str, Any]]:
    """Each Queue's status (valid and invalid ones), keyed by name."""
    own_milli: dict[str, int] = {}
    own_pending: dict[str, int] = {}
    for e in cache.pods():
        queue = e.task.queue if e.task is not None else ""
        if not queue:
            continue
        if e.state in _HELD and e.charge is not None:
            own_milli[queue] = own_milli.get(queue, 0) + sum(m for _, m, _ in e.charge.gpus)
        elif e.state is PodState.PENDING and e.kallot:
            own_pending[queue] = own_pending.get(queue, 0) + 1
    specs = cache.queues
    milli = dict.fromkeys(specs, 0)
    pending = dict.fromkeys(specs, 0)
    for queue in set(own_milli) | set(own_pending):
        seen: set[str] = set()
        q = queue
        while q in specs and q not in seen:  # the queue and its ancestors (cycles: once)
            seen.add(q)
            milli[q] += own_milli.get(queue, 0)
            pending[q] += own_pending.get(queue, 0)
            q = specs[q].parent
    out: dict[str, dict[str, Any]] = {}
    for name, spec in specs.items():
        out[name] = {
            "allocatedMilli": milli[name],
            "allocated": _gpus(milli[name]),
            "pending": pending[name],
            "guaranteed": _gpus(max(0, spec.gpu_quota_milli)),
            "phase": "Active",
            "message": "",
        }
    for name, err in cache.queue_errors.items():
        out[name] = {
            "allocatedMilli": own_milli.get(name, 0),
            "allocated": _gpus(own_milli.get(name, 0)),
            "pending": own_pending.get(name, 0),
            "guaranteed": "0",
            "phase": "Invalid",
            "message": f"kallot ignores this Queue: {err}"[:1024],
        }
    return out


def pod_group_statuses(cache: Cache) -> dict[str, dict[str, Any]]:
    """Each PodGroup's status, keyed by ``namespace/name`` (the core's job id)."""
    scheduled: dict[str, int] = {}
    waiting: dict[str, int] = {}
    reason: dict[str, str] = {}
    for e in cache.pods():
        job = e.task.job if e.task is not None else ""
        if not job:
            continue
        if e.state is PodState.BOUND:
            scheduled[job] = scheduled.get(job, 0) + 1
        elif e.state is PodState.PENDING:
            waiting[job] = waiting.get(job, 0) + 1
            if e.reason and job not in reason:
                reason[job] = e.reason
    out: dict[str, dict[str, Any]] = {}
    for gid, group in cache.pod_groups().items():
        bound = scheduled.get(gid, 0)
        out[gid] = {
            "phase": "Scheduled" if bound >= group.min_available else "Pending",
            "scheduled": bound,
            "pending": waiting.get(gid, 0),
            "message": "" if bound >= group.min_available else reason.get(gid, "")[:1024],
        }
    for gid, err in cache.pod_group_errors().items():
        out[gid] = {
            "phase": "Failed",
            "scheduled": scheduled.get(gid, 0),
            "pending": waiting.get(gid, 0),
            "message": str(err)[:1024],
        }
    return out


class StatusWriter:
    """Writes the statuses above while ``is_leader()``; one round every ``interval_s``."""

    def __init__(
        self,
        client: KubeClient,
        cache: Cache,
        *,
        is_leader: Callable[[], bool],
        interval_s: float = 5.0,
    ) -> None:
        self.client = client
        self.cache = cache
        self.is_leader = is_leader
        self.interval_s = interval_s
        self._written: dict[str, Mapping[str, Any]] = {}  # path -> status last written

    async def run(self) -> None:
        while True:
            if self.is_leader():
                try:
                    await self.write_once()
                except Exception:  # a report: never stop the scheduler for it
                    logger.exception("writing Queue/PodGroup status failed")
            else:
                self._written.clear()  # a new term writes everything again
            await asyncio.sleep(self.interval_s)

    async def write_once(self) -> int:
        """One round; returns how many statuses were written."""
        wanted: dict[str, dict[str, Any]] = {}
        for name, status in queue_statuses(self.cache).items():
            wanted[f"{BASE}/queues/{name}/status"] = status
        for gid, status in pod_group_statuses(self.cache).items():
            namespace, _, name = gid.partition("/")
            wanted[f"{BASE}/namespaces/{namespace}/podgroups/{name}/status"] = status
        for path in [p for p in self._written if p not in wanted]:
            del self._written[path]
        written = 0
        for path, status in wanted.items():
            if self._written.get(path) == status:
                continue
            try:
                await self.client.patch(path, {"status": status})
            except ApiError as exc:
                if not exc.not_found:  # deleted meanwhile: nothing to report on
                    logger.warning("status write failed path=%s error=%s", path, exc)
                continue
            self._written[path] = status
            written += 1
        return written
