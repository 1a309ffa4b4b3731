"""``OwnerIndex``: the owner objects the controller's reflectors deliver, and each pod's gang,
queue and Kueue admission derived from them.

Where it sits: beside ``translate`` in the live scheduler's flow. The cache keeps the owner
objects (every kind's ``path`` in ``kinds.KINDS``: batch Jobs and Namespaces always, the
CRD-based kinds where they are served) here, and ``OwnerIndex.resolve`` turns a pod's Task
(from ``translate.pod_to_task``) into one whose ``job`` and ``queue`` name the gang and queue
its owner implies, with the core ``Job`` for that gang: the same Job a hand-written PodGroup
gives. The kinds' rules live in the table (``kinds``); this module is what is the same for
every kind: explicit kallot labels win, the queue's order of sources, Kueue admission (held
until admitted, then its ClusterQueue and its ResourceFlavor's node labels), the owner grace
period and the memo. A pod whose owner is unknown or malformed schedules as a single pod and
``Derived.note`` says why (the controller writes it as an Event). docs/workloads.md is the
table of owner -> gang/queue source.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from kallot.core.workload import Job, Task
from kallot.kube import translate
from kallot.kube.owners.facts import NOTHING, Derived, PodFacts, condition
from kallot.kube.owners.kinds import GANG_KINDS, KINDS, OWNER_PATHS, training_kind
from kallot.kube.owners.labels import (
    JOB,
    K8S_PODGROUP,
    KUEUE_ADMITTED,
    KUEUE_DEFAULT_LOCAL_QUEUE,
    KUEUE_WORKLOAD,
    LABEL_JOBSET_NAME,
    LABEL_JOBSET_REPLICATED_JOB,
    LABEL_KUEUE_POD_GROUP,
    LABEL_KUEUE_QUEUE,
    LABEL_TRAINING_JOB_NAME,
    LABEL_TRAINING_REPLICA_TYPE,
    LOCALQUEUE,
    NAMESPACE,
    NOT_GANGS,
    OWNER_GRACE_S,
    PYTORCHJOB,
    RESOURCEFLAVOR,
)


class OwnerIndex:
    """Owner objects by (kind, namespace, name), and the facts of each kallot pod."""

    def __init__(self, on_change: Callable[[], None] = lambda: None) -> None:
        self._objects: dict[tuple[str, str, str], Mapping[str, Any]] = {}
        # (namespace, JobSet name) -> its Jobs' keys, for JobSets whose object is not watched
        self._jobset_jobs: dict[tuple[str, str], set[tuple[str, str, str]]] = {}
        # (namespace, owner kind, owner name) -> the name of its Kueue Workload
        self._workload_of: dict[tuple[str, str, str], str] = {}
        self._pods: dict[str, PodFacts] = {}
        #: pod uid -> why no gang was derived for it (the controller writes it as an Event)
        self.notes: dict[str, str] = {}
        #: ids of the exclusive gangs derived so far (JobSet / LeaderWorkerSet exclusive placement)
        self.exclusive: set[str] = set()
        self._on_change = on_change
        # uid -> (generation, task in, task out, derivation): owner objects change rarely,
        # sessions ask for every pending pod each time
        self._generation = 0
        self._memo: dict[str, tuple[int, Task, Task, Derived]] = {}

    # -- owner objects (reflector callbacks) ---------------------------------------------

    def apply(self, kind: str, event: str, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        key = (kind, str(meta.get("namespace", "")), str(meta.get("name", "")))
        old = self._objects.pop(key, None)
        if old is not None:
            self._index_jobset(key, old, add=False)
            self._index_workload(key, old, add=False)
        if event != "DELETED":
            self._objects[key] = obj
            self._index_jobset(key, obj, add=True)
            self._index_workload(key, obj, add=True)
        self._generation += 1
        self._on_change()

    def _index_jobset(
        self, key: tuple[str, str, str], obj: Mapping[str, Any], *, add: bool
    ) -> None:
        if key[0] != JOB:
            return
        jobset = ((obj.get("metadata") or {}).get("labels") or {}).get(LABEL_JOBSET_NAME)
        if not jobset:
            return
        members = self._jobset_jobs.setdefault((key[1], str(jobset)), set())
        if add:
            members.add(key)
        else:
            members.discard(key)
            if not members:
                del self._jobset_jobs[(key[1], str(jobset))]

    def _index_workload(
        self, key: tuple[str, str, str], obj: Mapping[str, Any], *, add: bool
    ) -> None:
        """Kueue Workloads by the objects that own them (a Job, JobSet, ... or the pods of a
        plain pod or pod group): (namespace, owner kind, owner name) -> Workload name."""
        if key[0] != KUEUE_WORKLOAD:
            return
        for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
            owner = (key[1], str(ref.get("kind", "")), str(ref.get("name", "")))
            if add:
                self._workload_of[owner] = key[2]
            elif self._workload_of.get(owner) == key[2]:
                del self._workload_of[owner]

    def replace(self, kind: str, items: Iterable[Mapping[str, Any]]) -> None:
        for key in [k for k in self._objects if k[0] == kind]:
            old = self._objects.pop(key)
            self._index_jobset(key, old, add=False)
            self._index_workload(key, old, add=False)
        for obj in items:
            self.apply(kind, "ADDED", obj)

    def handlers(
        self, kind: str
    ) -> tuple[Callable[[Iterable[Mapping[str, Any]]], None], Callable[[str, Any], None]]:
        """(on_replace, on_event) for the reflector of one owner kind."""
        return (lambda items: self.replace(kind, items)), (
            lambda event, obj: self.apply(kind, event, obj)
        )

    def get(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self._objects.get((kind, namespace, name))

    def jobset_jobs(self, namespace: str, jobset: str) -> list[Mapping[str, Any]]:
        """The Jobs of a JobSet (by their jobset-name label), in key order."""
        return [self._objects[k] for k in sorted(self._jobset_jobs.get((namespace, jobset), ()))]

    def hold_exclusive(
        self, jobs: Mapping[str, Job], held: Iterable[tuple[str, str]]
    ) -> dict[str, Job]:
        """``jobs`` with each exclusive gang's ``avoid_nodes``: the nodes of ``held`` (gang id,
        node of an assumed or bound pod) that other exclusive gangs run on."""
        taken = [(gid, node) for gid, node in held if gid in self.exclusive]
        return {
            gid: replace(job, avoid_nodes=frozenset(n for g, n in taken if g != gid))
            if job.exclusive
            else job
            for gid, job in jobs.items()
        }

    # -- pods ---------------------------------------------------------------------------

    def observe_pod(self, uid: str, pod: Mapping[str, Any], task: Task) -> Task:
        """Remember the pod's owner facts; returns its task with the derived gang/queue."""
        self._pods[uid] = PodFacts.of(pod)
        self._memo.pop(uid, None)
        return self.resolve(uid, task)[0]

    def forget_pod(self, uid: str) -> None:
        self._pods.pop(uid, None)
        self.notes.pop(uid, None)
        self._memo.pop(uid, None)

    def resolve(self, uid: str, task: Task, *, waited_s: float = 0.0) -> tuple[Task, Derived]:
        """The task with its derived gang and queue, and the derivation. A pod waiting for its
        owner object past ``OWNER_GRACE_S`` runs alone (with a note). Idempotent: a task that
        already carries a derived gang resolves to the same task."""
        facts = self._pods.get(uid)
        if facts is None:
            return task, NOTHING
        memo = self._memo.get(uid)
        if memo is not None and memo[0] == self._generation and task in (memo[1], memo[2]):
            return memo[2], memo[3]
        d = self.derive(facts, task.priority)
        if d.wait and not d.hold and waited_s >= OWNER_GRACE_S:
            d = replace(d, wait="", note=f"{d.wait} after {OWNER_GRACE_S:.0f}s; scheduling alone")
        if d.note:
            self.notes[uid] = d.note
        else:
            self.notes.pop(uid, None)
        explicit_job = bool(facts.labels.get(translate.LABEL_POD_GROUP))
        # A pod held by Kueue keeps its gang id, so that the member that wakes first after the
        # admission brings its parked peers along (Cache: a gang is decided whole).
        job = task.job if explicit_job else (d.job.id if d.job is not None else "")
        queue = d.queue
        # The pod's own nodeSelector plus its admitted Kueue flavor's node labels (recomputed
        # from the pod's, so that an eviction or a new flavor replaces the old labels).
        selector = {**d.node_selector, **facts.node_selector}
        if (job, queue) == (task.job, task.queue) and selector == task.node_selector:
            out = task
        elif selector == task.node_selector:
            out = replace(task, job=job, queue=queue)
        else:
            out = replace(task, job=job, queue=queue, node_selector=selector)
        if not d.wait:
            self._memo[uid] = (self._generation, task, out, d)
        return out, d

    def derive(self, facts: PodFacts, priority: int = 0) -> Derived:
        """The gang and queue the pod's owner chain implies (explicit kallot labels win), and
        what its Kueue Workload's admission says (held until admitted; its ClusterQueue and
        ResourceFlavor once it is)."""
        admission = self._kueue_admission(facts)
        queue, queue_source = self._queue(facts, admission)
        if facts.labels.get(translate.LABEL_POD_GROUP):
            gang = Derived(gang_source=f"label {translate.LABEL_POD_GROUP} (PodGroup)")
        else:
            gang = self._gang(facts)
        if admission.wait or admission.node_selector:
            gang = replace(
                gang,
                wait=admission.wait or gang.wait,
                hold=admission.hold,
                node_selector=admission.node_selector,
            )
        if facts.labels.get(translate.LABEL_POD_GROUP):
            return replace(gang, queue=queue, queue_source=queue_source)
        if gang.job is not None:
            job = replace(gang.job, queue=queue, priority=priority)
            gang = replace(gang, job=job)
            if job.exclusive:
                self.exclusive.add(job.id)
        return replace(gang, queue=queue, queue_source=queue_source)

    # -- queue ------------------------------------------------------------------------------

    def _queue(self, facts: PodFacts, admission: Derived) -> tuple[str, str]:
        """First match: kallot's Queue label (pod, then owner object); the admitted Kueue
        Workload's ClusterQueue; Kueue's LocalQueue label (pod, then owner object); the
        namespace's kallot.io/queue label; the namespace's Kueue LocalQueue ``default``.
        A LocalQueue kallot has read means its ClusterQueue; one it has not, its own name."""
        ns = facts.namespace
        owner = self._owner_object(facts)
        places = [("the pod", facts.labels)]
        if owner is not None:
            places.append((owner[0], (owner[1].get("metadata") or {}).get("labels") or {}))
        for where, labels in places:
            if labels.get(translate.LABEL_QUEUE):
                return str(
                    labels[translate.LABEL_QUEUE]
                ), f"label {translate.LABEL_QUEUE} on {where}"
        if admission.queue:
            return admission.queue, admission.queue_source
        for where, labels in places:
            if labels.get(LABEL_KUEUE_QUEUE):
                return self._local_queue(
                    ns,
                    str(labels[LABEL_KUEUE_QUEUE]),
                    f"Kueue LocalQueue label {LABEL_KUEUE_QUEUE} on {where}",
                )
        ns_obj = self.get(NAMESPACE, "", ns)
        ns_labels = ((ns_obj or {}).get("metadata") or {}).get("labels") or {}
        if ns_labels.get(translate.LABEL_QUEUE):
            return (
                str(ns_labels[translate.LABEL_QUEUE]),
                f"label {translate.LABEL_QUEUE} on namespace {ns} (its default queue)",
            )
        if self.get(LOCALQUEUE, ns, KUEUE_DEFAULT_LOCAL_QUEUE) is not None:
            return self._local_queue(
                ns, KUEUE_DEFAULT_LOCAL_QUEUE, f"namespace {ns}'s default Kueue LocalQueue"
            )
        return "", ""

    def _local_queue(self, ns: str, name: str, where: str) -> tuple[str, str]:
        lq = self.get(LOCALQUEUE, ns, name)
        cq = str(((lq or {}).get("spec") or {}).get("clusterQueue") or "")
        if cq:
            return cq, f"Kueue LocalQueue {ns}/{name} -> ClusterQueue {cq}, from {where}"
        return name, where

    # -- Kueue admission ------------------------------------------------------------------

    def _kueue_workload(self, facts: PodFacts) -> Mapping[str, Any] | None:
        """The Kueue Workload of the pod: its pod group's, its top-level owner's (JobSet,
        training job, RayCluster, Job: whoever Kueue made the Workload for), or its own."""
        ns, labels = facts.namespace, facts.labels
        if not self._workload_of and not labels.get(LABEL_KUEUE_POD_GROUP):
            return None  # no Kueue Workloads owned by anything (no Kueue): nothing to look up
        if labels.get(LABEL_KUEUE_POD_GROUP):
            wl = self.get(KUEUE_WORKLOAD, ns, labels[LABEL_KUEUE_POD_GROUP])
            if wl is not None:
                return wl
        # The kinds' candidates in table order, then the pod's controller and the pod itself.
        candidates = [
            c for k in KINDS if k.kueue_owner is not None for c in k.kueue_owner(self, facts)
        ]
        if facts.controller[1]:
            candidates.append((facts.controller[1], facts.controller[2]))
        if facts.name:
            candidates.append(("Pod", facts.name))
        for kind, name in candidates:
            wl_name = self._workload_of.get((ns, kind, name))
            if wl_name is not None:
                return self.get(KUEUE_WORKLOAD, ns, wl_name)
        return None

    def _kueue_admission(self, facts: PodFacts) -> Derived:
        """What the pod's Kueue Workload says: nothing (no Workload); held (not admitted);
        its ClusterQueue and the node labels of its ResourceFlavors (admitted)."""
        wl = self._kueue_workload(facts)
        if wl is None:
            return NOTHING
        ns = facts.namespace
        name = f"{ns}/{(wl.get('metadata') or {}).get('name', '')}"
        admission = (wl.get("status") or {}).get("admission") or {}
        if not condition(wl, KUEUE_ADMITTED) or not admission:
            queue = (wl.get("spec") or {}).get("queueName") or "?"
            return Derived(
                wait=f"Kueue Workload {name} is not admitted (LocalQueue {queue}); held until "
                "Kueue admits it",
                hold=True,
            )
        cq = str(admission.get("clusterQueue") or "")
        assignments = admission.get("podSetAssignments") or []
        wanted = {
            str(facts.labels.get(k, "")).lower()
            for k in (LABEL_JOBSET_REPLICATED_JOB, LABEL_TRAINING_REPLICA_TYPE)
        } - {""}
        chosen = next(
            (a for a in assignments if str(a.get("name", "")).lower() in wanted),
            assignments[0] if assignments else {},
        )
        selector: dict[str, str] = {}
        flavors = sorted(set((chosen.get("flavors") or {}).values()))
        for flavor in flavors:
            rf = self.get(RESOURCEFLAVOR, "", str(flavor))
            if rf is None:
                return Derived(wait=f"waiting for Kueue ResourceFlavor {flavor} ({name})")
            selector.update((rf.get("spec") or {}).get("nodeLabels") or {})
        source = f"Kueue Workload {name} admitted to ClusterQueue {cq}"
        if flavors:
            source += f", flavor {', '.join(map(str, flavors))}"
        return Derived(queue=cq, queue_source=source, node_selector=selector)

    def _owner_object(self, facts: PodFacts) -> tuple[str, Mapping[str, Any]] | None:
        """The pod's owner object whose labels may name its queue: the first kind's in
        ``KINDS`` that has one."""
        for k in KINDS:
            found = k.owner(self, facts) if k.owner is not None else None
            if found is not None:
                return found
        return None

    # -- gang -------------------------------------------------------------------------------

    def _gang(self, facts: PodFacts) -> Derived:
        for k in KINDS:
            if k.claims is not None and k.gang is not None and k.claims(facts):
                return k.gang(self, facts)
        api, kind, name, _ = facts.controller
        ns = facts.namespace
        if not kind or kind in NOT_GANGS:
            return NOTHING
        if kind in GANG_KINDS:
            return Derived(
                note=f"owner {kind} {ns}/{name} left no labels kallot derives a gang from "
                "(created by hand?); scheduled as a single pod"
            )
        return Derived(
            note=f"owner {api} {kind} {ns}/{name} is not a workload kallot derives a gang from "
            "(see docs/workloads.md); scheduled as a single pod"
        )


def more_owner_names(facts: PodFacts) -> dict[str, str]:
    """kind -> name of the owner objects beyond Job/JobSet/PyTorchJob/RayCluster that a pod
    names (for ``kallot explain``, which reads them one by one)."""
    out: dict[str, str] = {}
    name = facts.labels.get(LABEL_TRAINING_JOB_NAME)
    if name and training_kind(facts) != PYTORCHJOB:
        out[training_kind(facts)] = name
    if facts.scheduling_group:
        out[K8S_PODGROUP] = facts.scheduling_group
    return out


def explain_lists(namespace: str) -> dict[str, str]:
    """kind -> the API path listing what ``kallot explain`` reads for a pod's Kueue admission
    and default queue: the namespace's Workloads and LocalQueues, the ResourceFlavors, and
    the Namespace itself (for ``NAMESPACE`` the path reads the one object, not a list)."""
    out = {}
    for kind in (KUEUE_WORKLOAD, LOCALQUEUE):
        base, _, plural = OWNER_PATHS[kind].rpartition("/")
        out[kind] = f"{base}/namespaces/{namespace}/{plural}"
    out[RESOURCEFLAVOR] = OWNER_PATHS[RESOURCEFLAVOR]
    out[NAMESPACE] = f"{OWNER_PATHS[NAMESPACE]}/{namespace}"
    return out
