"""The scheduler's cache: pods and nodes from the watch, assumed placements, and the Snapshot
each session runs on.

Flow: reflectors (kube.reflector) feed ``apply_*`` / ``replace_*`` with watch events and lists;
the controller takes ``session_input()`` (a Snapshot plus the pending Tasks and Jobs), runs the
core, ``assume``s each placement so the next session sees it at once, and the binder ``confirm``s
or ``forget``s it. Every pod has a state (``PodState``) that moves only along
``VALID_TRANSITIONS`` (kube-scheduler's cache diagram: Initial -> Assumed -> Added -> Deleted).

Accounting is incremental: node rows (capacities, GPUs, labels) are rebuilt only when a node
really changes; usage (CPU, memory, pods, per-GPU compute, memory, clients, MIG instances) is
charged and released per pod as it moves, and copied into each Snapshot. A pod's GPUs come from
its device record (``kallot.io/devices``), so a restarted scheduler rebuilds exactly what was
assigned before it died.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import heapq
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from kallot.config import device_record
from kallot.core import k8s, usage
from kallot.core.decision import DeviceAssignment, Placement
from kallot.core.errors import ConfigError, InvariantViolation
from kallot.core.snapshot import (
    Allocation,
    MigLayout,
    NodeSpec,
    Snapshot,
    SnapshotBuilder,
    shape_column,
)
from kallot.core.status import Diagnosis
from kallot.core.workload import Job, Task
from kallot.kube import k8s_fields, owners, translate, volumes

logger = logging.getLogger(__name__)


# PodEntry.reason_kind of a pod the core faulted on (its Event says which plugin raised what).
FAULT_KIND = "SchedulerError"


class PodState(enum.Enum):
    PENDING = "pending"  # kallot's pod, not bound: a candidate for the next session
    ASSUMED = "assumed"  # placed by this scheduler; its bind is in flight or not yet watched
    BOUND = "bound"  # the API server says spec.nodeName is set
    DELETED = "deleted"  # deleted, or finished (Succeeded/Failed): holds nothing


VALID_TRANSITIONS: Mapping[PodState, Mapping[PodState, str]] = {
    PodState.PENDING: {
        PodState.ASSUMED: "assume: a session placed it; its devices are charged at once",
        PodState.BOUND: "bound by a bind we no longer track (a previous run, another replica)",
        PodState.DELETED: "deleted while pending",
    },
    PodState.ASSUMED: {
        PodState.PENDING: "forget: the bind failed or was abandoned; devices released",
        PodState.BOUND: "confirm: the watch shows the bind; charges follow the pod's record",
        PodState.DELETED: "deleted mid-bind; devices released",
    },
    PodState.BOUND: {
        PodState.DELETED: "deleted or finished; devices released",
    },
    PodState.DELETED: {},
}


def transition(entry: PodEntry, to: PodState) -> None:
    """Move ``entry`` to ``to`` or raise InvariantViolation for an edge not in the table."""
    if to is entry.state:
        return
    if to not in VALID_TRANSITIONS[entry.state]:
        raise InvariantViolation(
            f"pod {entry.namespace}/{entry.name}: {entry.state.value} -> {to.value} is not a "
            "valid cache transition"
        )
    entry.state = to


@dataclass(slots=True)
class PodEntry:
    """One pod as the cache knows it."""

    uid: str
    namespace: str
    name: str
    state: PodState
    kallot: bool
    node: str = ""
    cpu_milli: int = 0
    mem_mib: int = 0
    task: Task | None = None
    error: ConfigError | None = None
    devices: tuple[DeviceAssignment, ...] = ()  # from the record (bound) or the placement
    foreign_gpus: int = 0  # whole GPUs of a bound pod without a record
    resource_version: str = ""
    gated: bool = False  # scheduling gates, or being deleted
    first_seen: float = 0.0  # monotonic time the cache first saw it pending
    attempts: int = 0
    backoff_until: float = 0.0
    parked_generation: int = -1  # capacity generation when last found unschedulable
    parked_at: float = 0.0
    reason: str = ""  # why it is pending (diagnosis message or error), for metrics/explain
    reason_kind: str = "Queued"
    charge: usage.Charge | None = None
    allocation: Allocation | None = None
    record_error: ConfigError | None = None
    started: float = 0.0  # unix time it began holding its devices (minimum runtime counts from it)
    faults: int = 0  # sessions in a row whose core faulted on this pod (backoff doubles)
    missing_devices: tuple[str, ...] = ()  # GPUs its record names that its node does not have
    warnings: tuple[str, ...] = ()  # unknown kallot.io/ keys (translate.unknown_key_warnings)
    info: k8s.PodInfo | None = None  # labels, anti-affinity, ports (inter-pod rules), any pod

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class SessionInput:
    """What one session runs on."""

    snapshot: Snapshot
    tasks: tuple[Task, ...]
    jobs: Mapping[str, Job]
    waiting: Mapping[str, Diagnosis]  # pods held back before the core (gang without a group)
    # ``Cache.capacity_generation`` when the snapshot was taken: pods this session finds
    # unschedulable are parked with it (``Cache.park``), so capacity freed while the session
    # ran wakes them.
    capacity_generation: int = -1


@dataclass(frozen=True, slots=True)
class CacheTuning:
    """Retry timing for pods that did not fit (seconds)."""

    retry_interval: float = 1.0  # at most this often after a cluster change
    flush_interval: float = 60.0  # retried at least this often even without a change
    backoff_initial: float = 1.0  # after a failed bind
    backoff_max: float = 30.0


def _priority_order(e: PodEntry) -> tuple[int, float, str]:
    """A session's order: higher priority first, then older, then by uid."""
    assert e.task is not None
    return (-e.task.priority, e.task.created, e.uid)


def _in_gang(e: PodEntry) -> bool:
    return e.task is not None and bool(e.task.job)


class Cache:
    """Pods, nodes, pod groups and queues of one cluster, as the scheduler sees them.

    Not thread-safe: every method runs on the event loop. Snapshots it returns are immutable
    and may be used from a worker thread while the cache keeps changing.
    """

    def __init__(
        self,
        *,
        scheduler_name: str = translate.SCHEDULER_NAME,
        tolerated_taints: frozenset[str] = translate.DEFAULT_TOLERATED_TAINTS,
        tuning: CacheTuning | None = None,
        clock: Any = time.monotonic,
        wall_clock: Any = time.time,
    ) -> None:
        self.scheduler_name = scheduler_name
        self.tolerated_taints = tolerated_taints
        self.tuning = tuning or CacheTuning()
        self._clock = clock
        self._wall_clock = wall_clock
        self._pods: dict[str, PodEntry] = {}
        self._nodes: dict[str, translate.NodeInfo] = {}
        self._groups: dict[str, Job] = {}
        self._group_errors: dict[str, ConfigError] = {}
        #: owner objects (Jobs, JobSets, ...) the gangs and queues of pods are derived from
        self.owners = owners.OwnerIndex(on_change=self._bump_capacity)
        self.queues: dict[str, translate.QueueSpec] = {}
        #: increases whenever the set of Queues (or one of them) changes
        self.queues_generation = 0
        self.queue_errors: dict[str, ConfigError] = {}
        self._nodes_dirty = True
        self._static: Snapshot | None = None
        self._rows: dict[str, int] = {}
        self._uuid_slots: list[dict[str, int]] = []
        self._mig_index: dict[tuple[int, int, str, int], int] = {}
        self._usage = usage.Usage.zeros(0, 0, 0)
        self._generation = 0
        #: increases whenever capacity may have been freed or added (retry unschedulable pods)
        self.capacity_generation = 0
        #: set whenever there may be work for a session
        self.changed = asyncio.Event()
        #: eligible pods the last session_input() left for the next session (its cut)
        self.backlog = 0
        #: node name -> inventory error, for the controller to report once
        self.node_errors: dict[str, ConfigError] = {}
        # Watch events may come again or late (a watch resumed from an older version, a read
        # answered after the watch moved on): uids of deleted pods (a uid is never reused), with
        # the version of their deletion, and the newest version the last full list covered (a
        # pod unknown to the cache with an older version was gone before that list).
        self._tombstones: dict[str, int] = {}
        self._listed_rv = -1
        #: PVCs, PVs and StorageClasses (pods' volume topology, kube.volumes)
        self.volumes = volumes.VolumeIndex()
        #: namespace -> its labels (namespaceSelector of pod affinity terms)
        self._namespace_labels: dict[str, dict[str, str]] = {}

    # -- reading ---------------------------------------------------------------------------

    def pod(self, uid: str) -> PodEntry | None:
        return self._pods.get(uid)

    def pods(self) -> Iterable[PodEntry]:
        return self._pods.values()

    def find(self, namespace: str, name: str) -> PodEntry | None:
        for e in self._pods.values():
            if e.namespace == namespace and e.name == name:
                return e
        return None

    def node_names(self) -> list[str]:
        return sorted(self._nodes)

    def node(self, name: str) -> translate.NodeInfo | None:
        return self._nodes.get(name)

    def has_node(self, name: str) -> bool:
        return name in self._nodes

    def job(self, job_id: str) -> Job | None:
        return self._groups.get(job_id)

    def pod_groups(self) -> Mapping[str, Job]:
        """The valid PodGroups, by job id (``namespace/name``)."""
        return self._groups

    def pod_group_errors(self) -> Mapping[str, ConfigError]:
        """The PodGroups whose spec does not validate, by job id."""
        return self._group_errors

    # -- nodes -----------------------------------------------------------------------------

    def apply_node(self, event: str, obj: Mapping[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name", ""))
        if event == "DELETED":
            if self._nodes.pop(name, None) is not None:
                self.node_errors.pop(name, None)
                self._mark_nodes_dirty()
            return
        info = translate.node_info(obj, tolerated_taints=self.tolerated_taints)
        old = self._nodes.get(name)
        if info.inventory_error is not None:
            self.node_errors[name] = info.inventory_error
        else:
            self.node_errors.pop(name, None)
        if old is not None and old.signature == info.signature:
            return  # heartbeats and other changes the scheduler does not read
        self._nodes[name] = info
        self._mark_nodes_dirty()

    def replace_nodes(self, items: Iterable[Mapping[str, Any]]) -> None:
        seen = set()
        for obj in items:
            seen.add(str((obj.get("metadata") or {}).get("name", "")))
            self.apply_node("ADDED", obj)
        for name in [n for n in self._nodes if n not in seen]:
            self.apply_node("DELETED", {"metadata": {"name": name}})

    def _mark_nodes_dirty(self) -> None:
        self._nodes_dirty = True
        self._bump_capacity()

    def _bump_capacity(self) -> None:
        self.capacity_generation += 1
        self.changed.set()

    # -- pod groups and queues -----------------------------------------------------------

    def apply_pod_group(self, event: str, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        gid = translate.job_id(str(meta.get("namespace", "")), str(meta.get("name", "")))
        if event == "DELETED":
            self._groups.pop(gid, None)
            self._group_errors.pop(gid, None)
        else:
            try:
                self._groups[gid] = translate.pod_group_to_job(obj)
                self._group_errors.pop(gid, None)
            except ConfigError as exc:
                self._groups.pop(gid, None)
                self._group_errors[gid] = exc
        self._bump_capacity()

    def replace_pod_groups(self, items: Iterable[Mapping[str, Any]]) -> None:
        self._groups.clear()
        self._group_errors.clear()
        for obj in items:
            self.apply_pod_group("ADDED", obj)

    def apply_queue(self, event: str, obj: Mapping[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name", ""))
        self.queues_generation += 1
        self._bump_capacity()  # quotas changed: pending pods may fit now
        if event == "DELETED":
            self.queues.pop(name, None)
            self.queue_errors.pop(name, None)
            return
        try:
            self.queues[name] = translate.queue_spec(obj)
            self.queue_errors.pop(name, None)
        except ConfigError as exc:
            # Kept out of the tree (as if absent) and reported as an Event on the Queue.
            self.queues.pop(name, None)
            self.queue_errors[name] = exc
            logger.warning("invalid Queue queue=%s error=%s", name, exc)

    def replace_queues(self, items: Iterable[Mapping[str, Any]]) -> None:
        self.queues.clear()
        self.queue_errors.clear()
        for obj in items:
            self.apply_queue("ADDED", obj)

    # -- volumes -------------------------------------------------------------------------------

    def apply_claim(self, event: str, obj: Mapping[str, Any]) -> None:
        self.volumes.apply_claim(event, obj)
        self._bump_capacity()

    def replace_claims(self, items: Iterable[Mapping[str, Any]]) -> None:
        self.volumes.replace_claims(items)
        self._bump_capacity()

    def apply_volume(self, event: str, obj: Mapping[str, Any]) -> None:
        self.volumes.apply_volume(event, obj)
        self._bump_capacity()

    def replace_volumes(self, items: Iterable[Mapping[str, Any]]) -> None:
        self.volumes.replace_volumes(items)
        self._bump_capacity()

    def apply_storage_class(self, event: str, obj: Mapping[str, Any]) -> None:
        self.volumes.apply_class(event, obj)
        self._bump_capacity()

    def replace_storage_classes(self, items: Iterable[Mapping[str, Any]]) -> None:
        self.volumes.replace_classes(items)
        self._bump_capacity()

    def apply_namespace(self, event: str, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        if event == "DELETED":
            self._namespace_labels.pop(name, None)
            return
        labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
        labels.setdefault(k8s_fields.LABEL_NAMESPACE_NAME, name)
        if self._namespace_labels.get(name) == labels:
            return
        self._namespace_labels[name] = labels
        for e in self._pods.values():
            if e.namespace == name:
                self._label_namespace(e)
        self._bump_capacity()

    def replace_namespaces(self, items: Iterable[Mapping[str, Any]]) -> None:
        for obj in items:
            self.apply_namespace("ADDED", obj)

    def _label_namespace(self, entry: PodEntry) -> None:
        """Give the pod's PodInfo its namespace's current labels."""
        labels = self._namespace_labels.get(entry.namespace)
        if labels is None:
            return
        if entry.task is not None and entry.task.k8s is not None:
            if entry.task.k8s.namespace_labels != labels:
                entry.task = dataclasses.replace(
                    entry.task,
                    k8s=dataclasses.replace(entry.task.k8s, namespace_labels=labels),
                )
            entry.info = entry.task.k8s
        elif entry.info is not None and entry.info.namespace_labels != labels:
            entry.info = dataclasses.replace(entry.info, namespace_labels=labels)

    # -- pods --------------------------------------------------------------------------------

    def apply_pod(self, event: str, obj: Mapping[str, Any]) -> None:
        """One watch event (ADDED, MODIFIED, DELETED) or a freshly read pod.

        Idempotent and order-safe: an event older than the version the cache holds for that
        pod, any event for a pod already deleted, and an unknown pod older than the last full
        list are ignored, so a replayed, duplicated or reordered stream cannot bring a deleted
        pod back or release what a live pod holds."""
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        if uid in self._tombstones:
            return
        rv = _version(meta)
        entry = self._pods.get(uid)
        if entry is None:
            if rv is not None and rv <= self._listed_rv:
                return
        elif rv is not None and (held := _version(entry)) is not None and rv < held:
            return
        if event == "DELETED" or translate.pod_finished(obj):
            if entry is not None:
                self._delete(entry)
                self._tombstones[uid] = -1 if rv is None else rv
            return
        node = translate.pod_node(obj)
        kallot = translate.is_kallot_pod(obj, self.scheduler_name)
        if entry is None:
            if not node and not kallot:
                return  # another scheduler's pending pod: nothing to account yet
            entry = PodEntry(
                uid=uid,
                namespace=str(meta.get("namespace", "")),
                name=str(meta.get("name", "")),
                state=PodState.PENDING,
                kallot=kallot,
                first_seen=self._clock(),
            )
            self._pods[uid] = entry
            self._refresh(entry, obj)
            changed = True
        elif entry.resource_version != str(meta.get("resourceVersion", "")):
            changed = self._refresh(entry, obj)
        else:
            changed = False
        entry.resource_version = str(meta.get("resourceVersion", ""))
        if node:
            self._observe_bound(entry, node, changed)
        elif entry.state is PodState.PENDING and entry.kallot:
            self.changed.set()

    def replace_pods(self, items: Iterable[Mapping[str, Any]]) -> None:
        """A full list: apply every pod, delete what the list no longer has, and recharge
        usage from scratch from every pod's record, so nothing a missed or replayed event did
        survives the list."""
        seen: set[str] = set()
        newest = self._listed_rv
        for obj in items:
            meta = obj.get("metadata") or {}
            uid = str(meta.get("uid", ""))
            seen.add(uid)
            self._tombstones.pop(uid, None)  # the list is the truth
            self.apply_pod("ADDED", obj)
            rv = _version(meta)
            if rv is not None:
                newest = max(newest, rv)
        for entry in [e for uid, e in self._pods.items() if uid not in seen]:
            self._delete(entry)
            self._tombstones[entry.uid] = newest
        self._listed_rv = newest
        # Deletions at or before the list are covered by the version floor.
        self._tombstones = {u: v for u, v in self._tombstones.items() if v > newest}
        self._recharge()

    def _recharge(self) -> None:
        """Usage recomputed from every assumed and bound pod (after a list)."""
        if self._nodes_dirty or self._static is None:
            return  # the next snapshot rebuilds the rows and recharges everything
        u = self._usage
        self._usage = usage.Usage.zeros(u.cpu.size, u.gpu_milli.shape[1], u.mig_holders.size)
        for e in self._pods.values():
            e.charge = None
            e.allocation = None
        for e in self._pods.values():
            if e.state in (PodState.ASSUMED, PodState.BOUND):
                self._hold(e)

    def _refresh(self, entry: PodEntry, obj: Mapping[str, Any]) -> bool:
        """Re-read what the scheduler uses from a new version of the pod; True if what the
        pod holds on its node (host resources, devices) changed."""
        spec = obj.get("spec") or {}
        meta = obj.get("metadata") or {}
        before = (entry.cpu_milli, entry.mem_mib, entry.devices, entry.foreign_gpus)
        entry.gated = bool(spec.get("schedulingGates")) or bool(meta.get("deletionTimestamp"))
        entry.cpu_milli, entry.mem_mib = translate.host_requests(obj)
        if entry.kallot:
            entry.warnings = translate.unknown_key_warnings(obj)
            previous = entry.error
            try:
                entry.task = self.owners.observe_pod(
                    uid=entry.uid, pod=obj, task=translate.pod_to_task(obj)
                )
                entry.error = None
            except ConfigError as exc:
                entry.task = None
                entry.error = exc
            if entry.state is PodState.PENDING and (previous is not None and entry.error is None):
                entry.parked_generation = -1  # fixed: try again at once
        if entry.allocation is not None and entry.task is not None:
            # What preemption reads of a running pod (do-not-disrupt, minimum runtime, its
            # model) follows the pod's annotations; what it holds is recharged below if changed.
            entry.allocation = dataclasses.replace(entry.allocation, task=entry.task)
        entry.info = entry.task.k8s if entry.task is not None else _pod_info(obj)
        self._label_namespace(entry)
        if translate.pod_node(obj):
            entry.started = translate.pod_started(obj) or entry.started
            try:
                record = translate.pod_record(obj)
                entry.record_error = None
            except ConfigError as exc:
                record = None
                entry.record_error = exc
            if record is not None:
                entry.devices = record.assignments()
                entry.foreign_gpus = 0
            else:
                entry.devices = ()
                entry.foreign_gpus = translate.foreign_whole_gpus(obj)
        return before != (entry.cpu_milli, entry.mem_mib, entry.devices, entry.foreign_gpus)

    def _observe_bound(self, entry: PodEntry, node: str, changed: bool) -> None:
        if entry.state is PodState.BOUND:
            if changed or entry.node != node:
                self._release(entry)
                entry.node = node
                self._hold(entry)
                self._bump_capacity()  # it may hold less now (resized, record changed)
            return
        was = entry.state
        if was is PodState.ASSUMED:
            self._release(entry)
        transition(entry, PodState.BOUND)
        entry.node = node
        self._hold(entry)
        if was is PodState.ASSUMED:
            logger.debug("confirmed pod=%s node=%s", entry.key, node)

    def _delete(self, entry: PodEntry) -> None:
        self.owners.forget_pod(entry.uid)
        self._release(entry)
        transition(entry, PodState.DELETED)
        self._pods.pop(entry.uid, None)
        self._bump_capacity()

    # -- assume / confirm / forget -----------------------------------------------------------

    def assume(self, placement: Placement) -> PodEntry | None:
        """Charge a placement before its bind, so the next session sees it. Returns the
        entry, or None when the pod changed since the session (deleted, bound elsewhere) or
        its node is gone."""
        entry = self._pods.get(placement.task_id)
        if entry is None or entry.state is not PodState.PENDING or entry.task is None:
            return None
        if placement.node not in self._nodes:
            return None
        if self._nodes_dirty and not self._rows_valid(placement):
            return None
        if not self._still_free(placement):
            return None
        transition(entry, PodState.ASSUMED)
        entry.node = placement.node
        entry.devices = placement.devices
        entry.attempts += 1
        entry.started = self._wall_clock()
        self._hold(entry)
        return entry

    def _still_free(self, placement: Placement) -> bool:
        """Whether the placement's devices are still free now: the session decided on a
        snapshot, and a list or a read may have charged them since (a pod bound behind our
        back). A placement that no longer fits is decided again by the next session."""
        if self._nodes_dirty or self._static is None:
            return True  # rows are rebuilt (and checked by _rows_valid) before the next use
        row = self._rows.get(placement.node)
        if row is None:
            return False
        u, static = self._usage, self._static
        slots = self._uuid_slots[row]
        for d in placement.devices:
            slot = slots.get(d.uuid)
            if slot is None:
                return False
            if u.gpu_milli[row, slot] + d.milli > static.gpu_cap_milli[row, slot]:
                return False
            if u.gpu_mem[row, slot] + d.mem_mib > static.gpu_cap_mem[row, slot]:
                return False
            if d.mig is not None:
                idx = self._mig_index.get((row, slot, d.mig.profile, d.mig.start))
                if idx is not None and u.mig_holders[idx] > 0:
                    return False
        return True

    def _rows_valid(self, placement: Placement) -> bool:
        # Nodes changed during the session: the placement is still good if every device it
        # names is still on that node.
        info = self._nodes.get(placement.node)
        if info is None:
            return False
        uuids = {g.uuid for g in info.spec.gpus}
        return all(d.uuid in uuids for d in placement.devices)

    def forget(self, uid: str, *, reason: str, backoff: bool = True) -> None:
        """A bind failed or was abandoned: release the assumed devices and retry later."""
        entry = self._pods.get(uid)
        if entry is None or entry.state is not PodState.ASSUMED:
            return
        self._release(entry)
        transition(entry, PodState.PENDING)
        entry.node = ""
        entry.devices = ()
        entry.reason = reason
        entry.reason_kind = "BindFailed"
        if backoff:
            delay = min(
                self.tuning.backoff_max,
                self.tuning.backoff_initial * 2 ** max(0, entry.attempts - 1),
            )
            entry.backoff_until = self._clock() + delay
        self._bump_capacity()

    def park(self, uid: str, diagnosis: Diagnosis, *, generation: int | None = None) -> None:
        """The core found no place: wait for a cluster change (or the flush interval).

        ``generation`` is the capacity generation the deciding session's snapshot saw
        (``SessionInput.capacity_generation``); capacity freed after it wakes the pod. Parking
        with the current generation instead would absorb every change made while the session
        ran (a lost wake-up)."""
        entry = self._pods.get(uid)
        if entry is None or entry.state is not PodState.PENDING:
            return
        current = self.capacity_generation
        entry.parked_generation = current if generation is None else min(generation, current)
        entry.parked_at = self._clock()
        entry.reason = diagnosis.message()
        plugins = [r.plugin for r in diagnosis.reasons if r.plugin]
        entry.reason_kind = plugins[0] if plugins else "Unschedulable"

    def back_off_fault(self, uid: str, diagnosis: Diagnosis) -> float:
        """The core faulted on this pod (``Diagnosis.fault``): retry after an exponential
        backoff, whatever the cluster does meanwhile. Returns the delay in seconds."""
        entry = self._pods.get(uid)
        if entry is None or entry.state is not PodState.PENDING:
            return 0.0
        entry.faults += 1
        delay = min(
            self.tuning.backoff_max, self.tuning.backoff_initial * 2.0 ** (entry.faults - 1)
        )
        entry.backoff_until = self._clock() + delay
        entry.parked_generation = -1
        entry.reason = diagnosis.message()
        entry.reason_kind = FAULT_KIND
        return delay

    # -- sessions ------------------------------------------------------------------------------

    def next_wakeup(self) -> float | None:
        """Seconds until a parked or backed-off pod becomes eligible by time alone."""
        now = self._clock()
        soonest: float | None = None
        for e in self._pods.values():
            if not e.kallot or e.state is not PodState.PENDING or e.task is None or e.gated:
                continue
            t = e.backoff_until
            if e.parked_generation >= 0:
                flush = e.parked_at + self.tuning.flush_interval
                retry = e.parked_at + self.tuning.retry_interval
                t = max(t, retry if e.parked_generation < self.capacity_generation else flush)
            if t > now and (soonest is None or t - now < soonest):
                soonest = t - now
        return soonest

    def _eligible(self, e: PodEntry, now: float) -> bool:
        if not e.kallot or e.state is not PodState.PENDING or e.task is None or e.gated:
            return False
        if e.backoff_until > now:
            return False
        if e.parked_generation >= 0:
            since = now - e.parked_at
            if since < self.tuning.retry_interval:
                return False
            if e.parked_generation >= self.capacity_generation and (
                since < self.tuning.flush_interval
            ):
                return False
        return True

    def session_input(
        self, *, max_tasks: int = 0, exclude: frozenset[str] = frozenset()
    ) -> SessionInput:
        """Snapshot + eligible pending tasks (priority order, gangs kept whole) + their Jobs.

        At most ``max_tasks`` tasks outside gangs (0: all); pods in ``exclude`` sit this
        session out. ``changed`` stays set when the cut left eligible pods behind (``backlog``
        says how many), so the next session starts at once instead of waiting for a change
        that is not coming: those pods were neither parked nor backed off."""
        self.changed.clear()
        snapshot = self.snapshot()
        now = self._clock()
        eligible = self._with_gang_peers(
            [e for e in self._pods.values() if self._eligible(e, now) and e.uid not in exclude],
            now,
        )
        backlog = 0
        gang = sum(1 for e in eligible if _in_gang(e))
        if max_tasks and len(eligible) > max_tasks + gang:
            # Only the first max_tasks + gang entries in priority order can be taken (gang
            # members are always taken, plain pods while the session has room): select them
            # instead of sorting every pending pod, then add the gang members further back.
            head = heapq.nsmallest(max_tasks + gang, eligible, key=_priority_order)
            taken = {e.uid for e in head}
            rest = sorted(
                (e for e in eligible if _in_gang(e) and e.uid not in taken),
                key=_priority_order,
            )
            backlog = len(eligible) - len(head) - len(rest)
            eligible = head + rest
        else:
            eligible.sort(key=_priority_order)
        running: dict[str, int] = {}
        for e in self._pods.values():
            if (
                e.kallot
                and e.task is not None
                and e.task.job
                and e.state
                in (
                    PodState.ASSUMED,
                    PodState.BOUND,
                )
            ):
                running[e.task.job] = running.get(e.task.job, 0) + 1
        tasks: list[Task] = []
        jobs: dict[str, Job] = {}
        waiting: dict[str, Diagnosis] = {}
        for e in eligible:
            assert e.task is not None
            e.task, derived = self.owners.resolve(e.uid, e.task, waited_s=now - e.first_seen)
            task = e.task
            if derived.wait:
                waiting[e.uid] = Diagnosis.of("Owner", derived.wait)
                continue
            if task.k8s is not None and task.k8s.claims:
                task = dataclasses.replace(
                    task,
                    k8s=dataclasses.replace(
                        task.k8s, volumes=self.volumes.resolve(e.namespace, task.k8s.claims)
                    ),
                )
            if task.job:
                job = self._groups.get(task.job) or derived.job
                if job is None:
                    err = self._group_errors.get(task.job)
                    ns, _, group = task.job.partition("/")
                    msg = (
                        f"PodGroup {task.job} is invalid: {err}"
                        if err
                        else f"waiting for PodGroup {group} in namespace {ns}"
                    )
                    waiting[e.uid] = Diagnosis.of("PodGroup", msg)
                    continue
                if task.job not in jobs:
                    # Members already placed count towards the gang's minimum.
                    need = max(1, job.min_available - running.get(task.job, 0))
                    jobs[task.job] = dataclasses.replace(job, min_available=need)
            elif max_tasks and len(tasks) >= max_tasks:
                backlog += 1
                continue
            tasks.append(task)
        if any(j.exclusive for j in jobs.values()):  # JobSet/LWS exclusive placement
            held = ((e.task.job, e.node) for e in self._pods.values() if e.task and e.node)
            jobs = self.owners.hold_exclusive(jobs, held)
        self.backlog = backlog
        if backlog:
            self.changed.set()
        return SessionInput(
            snapshot=snapshot,
            tasks=tuple(tasks),
            jobs=jobs,
            waiting=waiting,
            capacity_generation=self.capacity_generation,
        )

    def _with_gang_peers(self, eligible: list[PodEntry], now: float) -> list[PodEntry]:
        """``eligible`` plus every other pending member of their gangs, parked or not: a gang
        is decided with all its members together, so a member that arrives (or wakes) brings
        the parked rest along, whatever order the members and the PodGroup came in."""
        jobs = {e.task.job for e in eligible if e.task is not None and e.task.job}
        if not jobs:
            return eligible
        have = {e.uid for e in eligible}
        out = list(eligible)
        for e in self._pods.values():
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

    def snapshot(self) -> Snapshot:
        """The current state as an immutable Snapshot (node rows rebuilt only if nodes changed)."""
        if self._nodes_dirty or self._static is None:
            self._rebuild_nodes()
        static = self._static
        assert static is not None
        u = self._usage
        self._generation += 1
        return u.snapshot(
            static,
            generation=self._generation,
            running=tuple(e.allocation for e in self._pods.values() if e.allocation is not None),
            placed=tuple(
                k8s.PlacedPod(e.uid, e.charge.row, e.info)
                for e in self._pods.values()
                if e.charge is not None and e.info is not None
            ),
            nominated=tuple(
                (self._rows[e.task.k8s.nominated_node], e.task)
                for e in self._pods.values()
                if e.state is PodState.PENDING
                and e.task is not None
                and e.task.k8s is not None
                and e.task.k8s.nominated_node in self._rows
            ),
        )

    def _rebuild_nodes(self) -> None:
        names = sorted(self._nodes)
        builder = SnapshotBuilder()
        specs: list[NodeSpec] = []
        for name in names:
            specs.append(self._nodes[name].spec)
        builder.extend(specs)
        profiles = sorted({m.profile for n in names for m in self._nodes[n].mig})
        rows = {name: i for i, name in enumerate(names)}
        mig_node: list[int] = []
        mig_slot: list[int] = []
        mig_prof: list[int] = []
        mig_start: list[int] = []
        self._mig_index = {}
        for name in names:
            for m in self._nodes[name].mig:
                self._mig_index[(rows[name], m.slot, m.profile, m.start)] = len(mig_node)
                mig_node.append(rows[name])
                mig_slot.append(m.slot)
                mig_prof.append(profiles.index(m.profile))
                mig_start.append(m.start)
        builder.mig(
            MigLayout(
                profiles=tuple(profiles),
                node=np.array(mig_node, np.int32),
                slot=np.array(mig_slot, np.int32),
                profile=np.array(mig_prof, np.int32),
                start=np.array(mig_start, np.int32),
                used=np.zeros(len(mig_node), np.bool_),
            )
        )
        static = builder.build()
        self._static = static
        self._rows = rows
        self._uuid_slots = [{u: j for j, u in enumerate(uu)} for uu in static.gpu_uuid]
        self._usage = usage.Usage.zeros(static.n_nodes, static.max_gpus, len(mig_node))
        self._nodes_dirty = False
        for e in self._pods.values():
            e.charge = None
            e.allocation = None
        for e in self._pods.values():
            if e.state in (PodState.ASSUMED, PodState.BOUND):
                self._hold(e)

    # -- charging -------------------------------------------------------------------------------

    def _hold(self, entry: PodEntry) -> None:
        """Charge what ``entry`` holds to its node's row (nothing if the node is unknown)."""
        if entry.charge is not None or self._nodes_dirty:
            return  # a rebuild recharges everything
        row = self._rows.get(entry.node)
        if row is None:
            return
        u = self._usage
        slots = self._uuid_slots[row]
        gpus: list[tuple[int, int, int]] = []
        mig_rows: list[int] = []
        devices: list[DeviceAssignment] = []
        missing: list[str] = []
        for d in entry.devices:
            slot = slots.get(d.uuid)
            if slot is None:
                missing.append(d.uuid)  # a GPU the node does not have: charged below
                continue
            gpus.append((slot, d.milli, d.mem_mib))
            devices.append(dataclasses.replace(d, slot=slot) if slot != d.slot else d)
            if d.mig is not None:
                idx = self._mig_index.get((row, slot, d.mig.profile, d.mig.start))
                if idx is not None:
                    mig_rows.append(idx)
        if entry.foreign_gpus and not entry.devices:
            # Another scheduler's pod: charge whole GPUs on the lowest idle slots.
            assert self._static is not None
            idle = np.flatnonzero(
                self._static.gpu_valid[row] & (u.gpu_clients[row] == 0) & (u.gpu_milli[row] == 0)
            )
            for slot in idle[: entry.foreign_gpus]:
                s = int(slot)
                gpus.append(
                    (
                        s,
                        int(self._static.gpu_cap_milli[row, s]),
                        int(self._static.gpu_cap_mem[row, s]),
                    )
                )
        entry.missing_devices = tuple(missing)
        if missing:
            self._charge_missing(row, len(missing), gpus)
        shape = -1
        if entry.task is not None and entry.devices:
            shape = shape_column(entry.task, self._usage.shapes.shape[1] - 1)
        elif entry.foreign_gpus:
            shape = min(entry.foreign_gpus, self._usage.shapes.shape[1] - 1)
        charge = usage.Charge(row, entry.cpu_milli, entry.mem_mib, gpus, mig_rows, shape)
        self._apply(charge, +1)
        entry.charge = charge
        if entry.kallot and devices:
            task = entry.task or Task(
                id=entry.uid, cpu_milli=entry.cpu_milli, mem_mib=entry.mem_mib
            )
            entry.allocation = Allocation(
                task=task, node_row=row, devices=tuple(devices), started=entry.started
            )

    def _charge_missing(self, row: int, count: int, gpus: list[tuple[int, int, int]]) -> None:
        """A device record names ``count`` GPUs the node does not have (a stale or hand-edited
        record, a GPU gone from the inventory): charge conservatively, one whole idle GPU of
        the node each (lowest slots not charged to this pod already), as for a pod without a
        record. The controller reports it on the pod (``PodEntry.missing_devices``)."""
        assert self._static is not None
        u = self._usage
        taken = {slot for slot, _, _ in gpus}
        idle = np.flatnonzero(
            self._static.gpu_valid[row] & (u.gpu_clients[row] == 0) & (u.gpu_milli[row] == 0)
        )
        for slot in [int(x) for x in idle if int(x) not in taken][:count]:
            gpus.append(
                (
                    slot,
                    int(self._static.gpu_cap_milli[row, slot]),
                    int(self._static.gpu_cap_mem[row, slot]),
                )
            )

    def _release(self, entry: PodEntry) -> None:
        if entry.charge is not None:
            self._apply(entry.charge, -1)
        entry.charge = None
        entry.allocation = None

    def _apply(self, c: usage.Charge, sign: int) -> None:
        self._usage.apply(c, sign)

    # -- views for metrics and explain -----------------------------------------------------------

    def gpu_allocation(self) -> dict[tuple[str, str, str], int]:
        """milli-GPU held per (node, model, queue) by pods with devices."""
        out: dict[tuple[str, str, str], int] = {}
        static = self._static
        if static is None:
            return out
        for e in self._pods.values():
            c = e.charge
            if c is None or not c.gpus:
                continue
            node = static.node_names[c.row]
            queue = e.task.queue if e.task is not None else ""
            for slot, milli, _ in c.gpus:
                code = int(static.gpu_model[c.row, slot])
                model = static.models[code] if code >= 0 else ""
                key = (node, model, queue)
                out[key] = out.get(key, 0) + milli
        return out

    def pending_by_reason(self) -> dict[str, int]:
        out: dict[str, int] = {}
        now = self._clock()
        for e in self._pods.values():
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

    def check_invariants(self) -> None:
        """Recompute usage from scratch and compare (tests and debugging)."""
        if self._static is None or self._nodes_dirty:
            return
        fresh = usage.Usage.zeros(
            self._static.n_nodes, self._static.max_gpus, self._usage.mig_holders.size
        )
        saved = self._usage
        self._usage = fresh
        try:
            for e in self._pods.values():
                if e.charge is not None:
                    self._apply(e.charge, +1)
        finally:
            self._usage = saved
        for name in (
            "cpu",
            "mem",
            "pods",
            "gpu_milli",
            "gpu_mem",
            "gpu_clients",
            "mig_holders",
            "shapes",
        ):
            if not np.array_equal(getattr(fresh, name), getattr(saved, name)):
                raise InvariantViolation(f"cache usage {name} drifted from its pods")
            if (getattr(saved, name) < 0).any():
                raise InvariantViolation(f"cache usage {name} went negative")
        for e in self._pods.values():
            if e.charge is not None and e.state not in (PodState.ASSUMED, PodState.BOUND):
                raise InvariantViolation(f"pod {e.key} is {e.state.value} and holds devices")


def _version(obj: Mapping[str, Any] | PodEntry) -> int | None:
    """A pod's resourceVersion as an integer (etcd's revision), or None when it is not one:
    versions are compared only to order the events of one pod (and against a list)."""
    raw = obj.resource_version if isinstance(obj, PodEntry) else obj.get("resourceVersion")
    try:
        return int(str(raw))
    except ValueError:
        return None


def _pod_info(obj: Mapping[str, Any]) -> k8s.PodInfo | None:
    """Another scheduler's pod (or one kallot cannot translate) as inter-pod rules see it."""
    try:
        return k8s_fields.pod_info(obj, translate.pod_resources(obj).amounts)
    except ConfigError:
        meta = obj.get("metadata") or {}
        return k8s.PodInfo(
            namespace=str(meta.get("namespace", "")),
            labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
        )


def record_for(placement: Placement) -> device_record.DeviceRecord:
    return device_record.DeviceRecord.of(placement)
