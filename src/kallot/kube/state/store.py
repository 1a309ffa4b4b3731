"""The live scheduler's store: pods, nodes, PodGroups, Queues, volumes and namespaces from the
watch, and the pod state machine.

Flow: reflectors (kube.watch.reflector) feed ``apply_*`` / ``replace_*`` with watch events and lists;
each object is translated once per version (kube.translate) and kept. Every pod has a state
(``PodState``) that moves only along ``VALID_TRANSITIONS`` (kube-scheduler's cache diagram:
Initial -> Assumed -> Added -> Deleted); as it moves, what it holds is charged to or released
from the usage ledger (kube.state.usage). The cache (kube.state.cache) builds on the store: sessions,
assume / forget, and the scheduling queue (kube.state.queue).

Long module: the pod state machine and the objects it reads (nodes, PodGroups, Queues, volumes,
namespaces) change together on every watch event; the pending-pod index lives beside it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kallot.config import record_trust
from kallot.core import k8s
from kallot.core.decision import DeviceAssignment
from kallot.core.errors import ConfigError, InvariantViolation
from kallot.core.snapshot import Allocation
from kallot.core.workload import Job, Task
from kallot.kube import owners, translate
from kallot.kube.api import k8s_fields
from kallot.kube.state import steer, usage, volumes
from kallot.kube.state.queue import QueueState, SchedulingQueue

logger = logging.getLogger(__name__)


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
    """One pod as the cache knows it, in three parts, each with one writer: what the watch
    shows and where the pod is in the state machine (the store and the cache's assume /
    forget), its place in the scheduling queue (``queue``: ``kube.state.queue``), and what it
    holds on its node (``held``: ``kube.state.usage``)."""

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
    record_error: ConfigError | None = None
    started: float = 0.0  # unix time it began holding its devices (minimum runtime counts from it)
    warnings: tuple[str, ...] = ()  # unknown kallot.io/ keys (translate.unknown_key_warnings)
    info: k8s.PodInfo | None = None  # labels, anti-affinity, ports (inter-pod rules), any pod
    queue: QueueState = field(default_factory=QueueState)
    held: usage.Holding = field(default_factory=usage.Holding)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def pending(self) -> bool:
        return self.state is PodState.PENDING

    # Read views of the other two parts, under the names the store's readers (metrics, status,
    # explain, the tests) use; only ``queue`` and ``usage`` write them.

    @property
    def reason(self) -> str:
        return self.queue.reason

    @property
    def reason_kind(self) -> str:
        return self.queue.reason_kind

    @property
    def first_seen(self) -> float:
        return self.queue.first_seen

    @property
    def attempts(self) -> int:
        return self.queue.attempts

    @property
    def faults(self) -> int:
        return self.queue.faults

    @property
    def parked_at(self) -> float:
        return self.queue.parked_at

    @property
    def backoff_until(self) -> float:
        return self.queue.backoff_until

    @backoff_until.setter
    def backoff_until(self, value: float) -> None:
        # Tests reset a pod's queue state through this and ``parked_generation``.
        self.queue.backoff_until = value

    @property
    def parked_generation(self) -> int:
        return self.queue.parked_generation

    @parked_generation.setter
    def parked_generation(self, value: int) -> None:
        self.queue.parked_generation = value

    @property
    def charge(self) -> usage.Charge | None:
        return self.held.charge

    @property
    def allocation(self) -> Allocation | None:
        return self.held.allocation

    @property
    def missing_devices(self) -> tuple[str, ...]:
        return self.held.missing_devices


class Store:
    """Pods, nodes, pod groups and queues of one cluster, as the scheduler sees them, and what
    each pod holds (``usage``).

    Not thread-safe: every method runs on the event loop.
    """

    def __init__(
        self,
        *,
        scheduler_name: str = translate.SCHEDULER_NAME,
        tolerated_taints: frozenset[str] = translate.DEFAULT_TOLERATED_TAINTS,
        clock: Any = time.monotonic,
        wall_clock: Any = time.time,
    ) -> None:
        self.scheduler_name = scheduler_name
        self.tolerated_taints = tolerated_taints
        self._clock = clock
        self._wall_clock = wall_clock
        self._pods: dict[str, PodEntry] = {}
        # Pods that may be pending (``pending_pods``): every pod enters PENDING here, at its
        # creation or by ``Cache.forget``, so sessions, wake-ups and reports go over the
        # pending pods only, not over every pod the cluster runs.
        self._pending: dict[str, PodEntry] = {}
        self._nodes: dict[str, translate.NodeInfo] = {}
        self._groups: dict[str, Job] = {}
        self._group_errors: dict[str, ConfigError] = {}
        #: owner objects (Jobs, JobSets, ...) the gangs and queues of pods are derived from
        self.owners = owners.OwnerIndex(on_change=self._bump_capacity)
        self.queues: dict[str, translate.QueueSpec] = {}
        #: increases whenever the set of Queues (or one of them) changes
        self.queues_generation = 0
        self.queue_errors: dict[str, ConfigError] = {}
        #: node rows and what every assumed and bound pod holds on them
        self.usage = usage.UsageLedger()
        #: increases whenever capacity may have been freed or added (retry unschedulable pods)
        self.capacity_generation = 0
        #: set whenever there may be work for a session
        self.changed = asyncio.Event()
        #: node name -> inventory error, reported once (kube.schedule.problems)
        self.node_errors: dict[str, ConfigError] = {}
        # Watch events may come again or late (a watch resumed from an older version, a read
        # answered after the watch moved on): uids of deleted pods (a uid is never reused), with
        # the version of their deletion, and the newest version the last full list covered (a
        # pod unknown to the cache with an older version was gone before that list).
        self._tombstones: dict[str, int] = {}
        self._listed_rv = -1
        #: PVCs, PVs and StorageClasses (pods' volume topology, kube.state.volumes)
        self.volumes = volumes.VolumeIndex()
        #: namespace -> its labels (namespaceSelector of pod affinity terms)
        self._namespace_labels: dict[str, dict[str, str]] = {}
        #: replacements of pods consolidation evicted, nominated where its move planned them
        self.steering = steer.Steering(clock=clock)

    # -- reading ---------------------------------------------------------------------------

    def pod(self, uid: str) -> PodEntry | None:
        return self._pods.get(uid)

    def pods(self) -> Iterable[PodEntry]:
        return self._pods.values()

    def pending_pods(self) -> list[PodEntry]:
        """Every pod in state PENDING (any scheduler's), in O(pending pods): the index drops
        what has moved on since (assumed, bound, deleted)."""
        out: list[PodEntry] = []
        gone: list[str] = []
        pods = self._pods
        for uid, e in self._pending.items():
            if e.state is PodState.PENDING and pods.get(uid) is e:
                out.append(e)
            else:
                gone.append(uid)
        for uid in gone:
            del self._pending[uid]
        return out

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
        self.usage.stale = True
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
                queue=QueueState(first_seen=self._clock()),
            )
            self._pods[uid] = entry
            self._pending[uid] = entry
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
        self.usage.recharge(self._pods.values(), holds)  # from every assumed and bound pod

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
                if translate.pod_node(obj):
                    self.steering.forget(entry.uid)
                else:
                    entry.task = self.steering.apply(entry.uid, entry.namespace, obj, entry.task)
                entry.error = None
            except ConfigError as exc:
                entry.task = None
                entry.error = exc
            except Exception as exc:  # a bug on an unusual pod: this pod waits, the rest go on
                logger.exception("pod not readable pod=%s/%s", entry.namespace, entry.name)
                entry.task = None
                entry.error = ConfigError(
                    "pod",
                    f"{entry.namespace}/{entry.name}",
                    f"a pod kallot can read (it raised {type(exc).__name__}: {exc}; please "
                    "report this)",
                )
            if entry.state is PodState.PENDING and (previous is not None and entry.error is None):
                SchedulingQueue.readable_again(entry)
        self.usage.retask(entry)  # its running allocation follows the pod's annotations
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
            if record is not None and (
                refused := record_trust.record_refusal(obj, record, self.scheduler_name)
            ):
                # Not a record the scheduler wrote for this pod (docs/security.md): it holds
                # nothing, as the agent serves nothing for it.
                record = None
                entry.record_error = ConfigError(translate.ANN_DEVICES, "(a record)", refused)
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
                self.usage.release(entry)
                entry.node = node
                self.usage.hold(entry)
                self._bump_capacity()  # it may hold less now (resized, record changed)
            return
        was = entry.state
        if was is PodState.ASSUMED:
            self.usage.release(entry)
        transition(entry, PodState.BOUND)
        entry.node = node
        self.usage.hold(entry)
        if was is PodState.ASSUMED:
            logger.debug("confirmed pod=%s node=%s", entry.key, node)

    def _delete(self, entry: PodEntry) -> None:
        self.owners.forget_pod(entry.uid)
        self.steering.forget(entry.uid)
        self.usage.release(entry)
        transition(entry, PodState.DELETED)
        self._pods.pop(entry.uid, None)
        self._bump_capacity()


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


def holds(entry: PodEntry) -> bool:
    """Whether the pod holds devices on its node (assumed or bound)."""
    return entry.state in (PodState.ASSUMED, PodState.BOUND)
