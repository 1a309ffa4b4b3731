"""Gangs and queues of workloads as users submit them: derived from a pod's owner chain.

Sits beside ``translate`` in the live scheduler's flow: the cache keeps the owner objects the
controller's reflectors deliver (batch Jobs always; JobSets, PyTorchJobs and RayClusters where
their CRDs are served) in an ``OwnerIndex``, and ``OwnerIndex.resolve`` turns a pod's Task
(from ``translate.pod_to_task``) into one whose ``job`` and ``queue`` name the gang and queue
its owner implies, with the core ``Job`` for that gang: the same Job a hand-written PodGroup
gives (``min_available``, ``topology``, ``queue``). The owners' controllers put labels,
annotations and ownerReferences on the pods; the sizes come from the pods themselves where
their controller writes them (LeaderWorkerSet, Kueue pod groups) and from the owner object's
spec otherwise (Job ``parallelism``, JobSet ``replicatedJobs``, RayCluster ``minReplicas``).

Explicit kallot settings win: a ``kallot.io/pod-group`` label keeps its PodGroup, a
``kallot.io/queue`` label keeps its queue. A pod whose owner is unknown or malformed schedules
as a single pod and ``Derived.note`` says why (the controller writes it as an Event). The
table of owner -> gang/queue source is docs/workloads.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from kallot.core.workload import NO_TOPOLOGY, Job, Task, TopologyConstraint, TopologyMode
from kallot.kube import translate

# -- what the owners' controllers put on pods ---------------------------------------------------

# kube-controller-manager's Job controller (batch/v1).
LABEL_JOB_NAME = "batch.kubernetes.io/job-name"
LABEL_JOB_CONTROLLER_UID = "batch.kubernetes.io/controller-uid"
LABEL_JOB_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
# JobSet (jobset.x-k8s.io): on its Jobs and their pods.
LABEL_JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
LABEL_JOBSET_REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
LABEL_JOBSET_JOB_KEY = "jobset.sigs.k8s.io/job-key"
LABEL_JOBSET_REPLICAS = "jobset.sigs.k8s.io/replicatedjob-replicas"
ANN_JOBSET_EXCLUSIVE = "alpha.jobset.sigs.k8s.io/exclusive-topology"
# LeaderWorkerSet (leaderworkerset.x-k8s.io): one group = a leader and size-1 workers.
LABEL_LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
LABEL_LWS_GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
ANN_LWS_SIZE = "leaderworkerset.sigs.k8s.io/size"
ANN_LWS_EXCLUSIVE = "leaderworkerset.sigs.k8s.io/exclusive-topology"
# Kubeflow training-operator (kubeflow.org/v1 PyTorchJob and friends).
LABEL_TRAINING_JOB_NAME = "training.kubeflow.org/job-name"
# KubeRay (ray.io/v1 RayCluster).
LABEL_RAY_CLUSTER = "ray.io/cluster"
# Kueue: plain pod groups, and the LocalQueue a workload is submitted to.
LABEL_KUEUE_POD_GROUP = "kueue.x-k8s.io/pod-group-name"
ANN_KUEUE_POD_GROUP_TOTAL = "kueue.x-k8s.io/pod-group-total-count"
LABEL_KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"

# Owner kinds the index keeps, and where the controller lists and watches them.
JOB = "Job"
JOBSET = "JobSet"
PYTORCHJOB = "PyTorchJob"
RAYCLUSTER = "RayCluster"
OWNER_PATHS: Mapping[str, str] = {
    JOB: "/apis/batch/v1/jobs",
    JOBSET: "/apis/jobset.x-k8s.io/v1alpha2/jobsets",
    PYTORCHJOB: "/apis/kubeflow.org/v1/pytorchjobs",
    RAYCLUSTER: "/apis/ray.io/v1/rayclusters",
}
# Controllers whose pods are not gangs: no gang and nothing to say.
NOT_GANGS = frozenset({"ReplicaSet", "StatefulSet", "DaemonSet", "Node", "ReplicationController"})
# Kinds kallot derives a gang for through another path (the pod's own labels or its Job).
VIA_LABELS = frozenset({JOB, "LeaderWorkerSet", PYTORCHJOB, RAYCLUSTER})

# A pod whose owner object is not (yet) in the cache waits this long for it, then runs alone.
OWNER_GRACE_S = 30.0


@dataclass(frozen=True, slots=True)
class Derived:
    """What a pod's owner chain says: the gang (None = a single pod), the queue, and where
    each came from (for ``kallot explain``). ``note`` says why no gang was derived for a pod
    whose owner is unknown or malformed; ``wait`` says which owner object a pod waits for."""

    job: Job | None = None
    gang_source: str = ""
    queue: str = ""
    queue_source: str = ""
    note: str = ""
    wait: str = ""


NOTHING = Derived()


@dataclass(frozen=True, slots=True)
class PodFacts:
    """The part of a pod the derivation reads, kept per pod by the index."""

    namespace: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    controller: tuple[str, str, str, str]  # (apiVersion, kind, name, uid) or empty strings

    @staticmethod
    def of(pod: Mapping[str, Any]) -> PodFacts:
        meta = pod.get("metadata") or {}
        ctrl = ("", "", "", "")
        for ref in meta.get("ownerReferences") or []:
            if ref.get("controller"):
                ctrl = (
                    str(ref.get("apiVersion", "")),
                    str(ref.get("kind", "")),
                    str(ref.get("name", "")),
                    str(ref.get("uid", "")),
                )
                break
        return PodFacts(
            namespace=str(meta.get("namespace", "")),
            labels=dict(meta.get("labels") or {}),
            annotations=dict(meta.get("annotations") or {}),
            controller=ctrl,
        )


def _int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def _exclusive(key: str) -> TopologyConstraint:
    return TopologyConstraint(mode=TopologyMode.REQUIRED, level=key.strip())


def job_members(job: Mapping[str, Any]) -> int | str:
    """Pods of a batch Job that must start together: ``min(parallelism, completions left)``;
    or a one-line reason the spec cannot say."""
    meta = job.get("metadata") or {}
    spec = job.get("spec") or {}
    where = f"Job {meta.get('namespace', '')}/{meta.get('name', '')}: spec"
    parallelism = _int(spec.get("parallelism", 1))
    if parallelism is None or parallelism < 0:
        return f"{where}.parallelism is {spec.get('parallelism')!r}, expected an integer >= 0"
    completions_raw = spec.get("completions")
    if completions_raw is None:
        return parallelism
    completions = _int(completions_raw)
    if completions is None or completions < 0:
        return f"{where}.completions is {completions_raw!r}, expected an integer >= 0"
    succeeded = _int((job.get("status") or {}).get("succeeded", 0)) or 0
    return max(0, min(parallelism, completions - succeeded))


def jobset_members(jobset: Mapping[str, Any]) -> int | str:
    """Pods of a JobSet: sum over replicatedJobs of replicas x the Job template's members."""
    meta = jobset.get("metadata") or {}
    where = f"JobSet {meta.get('namespace', '')}/{meta.get('name', '')}: spec.replicatedJobs"
    total = 0
    for i, rj in enumerate((jobset.get("spec") or {}).get("replicatedJobs") or []):
        replicas = _int(rj.get("replicas", 1))
        if replicas is None or replicas < 0:
            return f"{where}[{i}].replicas is {rj.get('replicas')!r}, expected an integer >= 0"
        members = job_members(
            {"metadata": meta, "spec": (rj.get("template") or {}).get("spec") or {}}
        )
        if isinstance(members, str):
            return f"{where}[{i}].template: {members}"
        total += replicas * members
    return total


def training_members(obj: Mapping[str, Any]) -> int | str:
    """Pods of a Kubeflow training job (PyTorchJob, TFJob, ...): every replica of every
    replica type (``spec.<kind>ReplicaSpecs[*].replicas``, default 1)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    where = f"{obj.get('kind', 'training job')} {meta.get('namespace', '')}/{meta.get('name', '')}"
    specs = next((v for k, v in spec.items() if k.endswith("ReplicaSpecs")), None)
    if not isinstance(specs, Mapping) or not specs:
        return f"{where}: spec has no <kind>ReplicaSpecs"
    total = 0
    for rtype, body in specs.items():
        replicas = _int((body or {}).get("replicas", 1))
        if replicas is None or replicas < 0:
            return f"{where}: spec.*ReplicaSpecs[{rtype}].replicas, expected an integer >= 0"
        total += replicas
    return total


def raycluster_members(obj: Mapping[str, Any]) -> int | str:
    """Pods of a RayCluster that must start together: the head and the minimum workers of
    each group (``minReplicas`` x ``numOfHosts``)."""
    meta = obj.get("metadata") or {}
    where = f"RayCluster {meta.get('namespace', '')}/{meta.get('name', '')}: spec.workerGroupSpecs"
    total = 1
    for i, group in enumerate((obj.get("spec") or {}).get("workerGroupSpecs") or []):
        low = _int(group.get("minReplicas", 0))
        hosts = _int(group.get("numOfHosts", 1))
        if low is None or low < 0 or hosts is None or hosts < 1:
            return f"{where}[{i}]: minReplicas/numOfHosts, expected integers (>= 0, >= 1)"
        total += low * hosts
    return total


class OwnerIndex:
    """Owner objects by (kind, namespace, name), and the facts of each kallot pod."""

    def __init__(self, on_change: Callable[[], None] = lambda: None) -> None:
        self._objects: dict[tuple[str, str, str], Mapping[str, Any]] = {}
        # (namespace, JobSet name) -> its Jobs' keys, for JobSets whose object is not watched
        self._jobset_jobs: dict[tuple[str, str], set[tuple[str, str, str]]] = {}
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
        if event != "DELETED":
            self._objects[key] = obj
            self._index_jobset(key, obj, add=True)
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

    def replace(self, kind: str, items: Iterable[Mapping[str, Any]]) -> None:
        for key in [k for k in self._objects if k[0] == kind]:
            self._index_jobset(key, self._objects.pop(key), add=False)
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
        if d.wait and waited_s >= OWNER_GRACE_S:
            d = replace(d, wait="", note=f"{d.wait} after {OWNER_GRACE_S:.0f}s; scheduling alone")
        if d.note:
            self.notes[uid] = d.note
        else:
            self.notes.pop(uid, None)
        explicit_job = bool(facts.labels.get(translate.LABEL_POD_GROUP))
        job = task.job if explicit_job else (d.job.id if d.job is not None and not d.wait else "")
        queue = d.queue
        out = (
            task if (job, queue) == (task.job, task.queue) else replace(task, job=job, queue=queue)
        )
        if not d.wait:
            self._memo[uid] = (self._generation, task, out, d)
        return out, d

    def derive(self, facts: PodFacts, priority: int = 0) -> Derived:
        """The gang and queue the pod's owner chain implies (explicit kallot labels win)."""
        queue, queue_source = self._queue(facts)
        if facts.labels.get(translate.LABEL_POD_GROUP):
            return Derived(
                gang_source=f"label {translate.LABEL_POD_GROUP} (PodGroup)",
                queue=queue,
                queue_source=queue_source,
            )
        gang = self._gang(facts)
        if gang.job is not None:
            job = replace(gang.job, queue=queue, priority=priority)
            gang = replace(gang, job=job)
            if job.exclusive:
                self.exclusive.add(job.id)
        return replace(gang, queue=queue, queue_source=queue_source)

    # -- queue ------------------------------------------------------------------------------

    def _queue(self, facts: PodFacts) -> tuple[str, str]:
        if facts.labels.get(translate.LABEL_QUEUE):
            return facts.labels[translate.LABEL_QUEUE], f"label {translate.LABEL_QUEUE} on the pod"
        q = facts.labels.get(LABEL_KUEUE_QUEUE, "")
        if q:
            return q, f"Kueue LocalQueue label {LABEL_KUEUE_QUEUE} on the pod"
        owner = self._owner_object(facts)
        if owner is not None:
            labels = (owner[1].get("metadata") or {}).get("labels") or {}
            for key, what in (
                (translate.LABEL_QUEUE, "label"),
                (LABEL_KUEUE_QUEUE, "Kueue LocalQueue label"),
            ):
                if labels.get(key):
                    return str(labels[key]), f"{what} {key} on {owner[0]}"
        return "", ""

    def _owner_object(self, facts: PodFacts) -> tuple[str, Mapping[str, Any]] | None:
        ns, labels = facts.namespace, facts.labels
        for kind, key in (
            (JOBSET, LABEL_JOBSET_NAME),
            (PYTORCHJOB, LABEL_TRAINING_JOB_NAME),
            (RAYCLUSTER, LABEL_RAY_CLUSTER),
            (JOB, LABEL_JOB_NAME),
        ):
            name = labels.get(key)
            obj = self.get(kind, ns, name) if name else None
            if obj is not None:
                return f"{kind} {ns}/{name}", obj
        return None

    # -- gang -------------------------------------------------------------------------------

    def _gang(self, facts: PodFacts) -> Derived:
        ns, labels, ann = facts.namespace, facts.labels, facts.annotations
        if labels.get(LABEL_KUEUE_POD_GROUP):
            return _kueue_group(ns, labels[LABEL_KUEUE_POD_GROUP], ann)
        if labels.get(LABEL_LWS_NAME):
            return _lws_group(ns, labels, ann)
        if labels.get(LABEL_JOBSET_NAME):
            return self._jobset(facts)
        if labels.get(LABEL_TRAINING_JOB_NAME):
            return self._from_object(
                PYTORCHJOB, ns, labels[LABEL_TRAINING_JOB_NAME], training_members, "training"
            )
        if labels.get(LABEL_RAY_CLUSTER):
            return self._from_object(
                RAYCLUSTER, ns, labels[LABEL_RAY_CLUSTER], raycluster_members, "raycluster"
            )
        api, kind, name, _ = facts.controller
        if labels.get(LABEL_JOB_NAME) or (kind == JOB and api.startswith("batch/")):
            return self._batch_job(facts)
        if not kind or kind in NOT_GANGS:
            return NOTHING
        if kind in VIA_LABELS or kind == JOBSET:
            return Derived(
                note=f"owner {kind} {ns}/{name} left no labels kallot derives a gang from "
                "(created by hand?); scheduled as a single pod"
            )
        return Derived(
            note=f"owner {api} {kind} {ns}/{name} is not a workload kallot derives a gang from "
            "(see docs/workloads.md); scheduled as a single pod"
        )

    def _batch_job(self, facts: PodFacts) -> Derived:
        ns = facts.namespace
        _, kind, ref_name, ref_uid = facts.controller
        name = facts.labels.get(LABEL_JOB_NAME) or ref_name
        if kind == JOB and ref_name and ref_name != name:
            return Derived(
                note=f"label {LABEL_JOB_NAME}={name} names another Job than the pod's owner "
                f"{ref_name}; scheduled as a single pod"
            )
        job = self.get(JOB, ns, name)
        if job is None:
            return Derived(wait=f"waiting for owner Job {ns}/{name}")
        uid = str((job.get("metadata") or {}).get("uid", ""))
        want = facts.labels.get(LABEL_JOB_CONTROLLER_UID) or ref_uid
        if want and uid and want != uid:
            return Derived(
                note=f"owner Job {ns}/{name} has uid {uid}, the pod names {want} (a deleted "
                "Job's pod); scheduled as a single pod"
            )
        members = job_members(job)
        if isinstance(members, str):
            return Derived(note=f"{members}; scheduled as a single pod")
        exclusive = (facts.annotations.get(ANN_JOBSET_EXCLUSIVE) or "").strip()
        topology = _exclusive(exclusive) if exclusive else NO_TOPOLOGY
        if members <= 1 and not exclusive:
            return NOTHING
        source = f"Job {ns}/{name} (spec.parallelism/completions: {members} pods)"
        if exclusive:
            source += f", exclusive per {exclusive} ({ANN_JOBSET_EXCLUSIVE})"
        return Derived(
            job=Job(
                id=f"{ns}/job/{name}",
                min_available=max(1, members),
                topology=topology,
                exclusive=bool(exclusive),
            ),
            gang_source=source,
        )

    def _jobset(self, facts: PodFacts) -> Derived:
        ns, labels = facts.namespace, facts.labels
        name = labels[LABEL_JOBSET_NAME]
        if (facts.annotations.get(ANN_JOBSET_EXCLUSIVE) or "").strip():
            # Exclusive placement: each child Job is its own gang inside one domain.
            return self._batch_job(facts)
        jobset = self.get(JOBSET, ns, name)
        if jobset is not None:
            members: int | str = jobset_members(jobset)
            how = "spec.replicatedJobs: replicas x parallelism"
        else:
            # No JobSet object (CRD not watched): its child Jobs, all created at once.
            children = [self._objects[k] for k in sorted(self._jobset_jobs.get((ns, name), ()))]
            if not children:
                return Derived(wait=f"waiting for JobSet {ns}/{name} or its Jobs")
            # Its controller creates the Jobs one by one: wait until each replicated job has
            # as many as its replicas label says.
            per_rjob: dict[str, int] = {}
            want: dict[str, int] = {}
            for child in children:
                labels = (child.get("metadata") or {}).get("labels") or {}
                rjob = str(labels.get(LABEL_JOBSET_REPLICATED_JOB, ""))
                per_rjob[rjob] = per_rjob.get(rjob, 0) + 1
                replicas = _int(labels.get(LABEL_JOBSET_REPLICAS))
                if replicas is not None:
                    want[rjob] = replicas
            short = sorted(r for r, n in want.items() if per_rjob.get(r, 0) < n)
            if short:
                return Derived(
                    wait=f"waiting for the Jobs of JobSet {ns}/{name} (replicated job "
                    f"{short[0]}: {per_rjob.get(short[0], 0)} of {want[short[0]]})"
                )
            total = 0
            for child in children:
                m = job_members(child)
                if isinstance(m, str):
                    return Derived(note=f"{m}; scheduled as a single pod")
                total += m
            members = total
            how = f"parallelism of its {len(children)} Jobs"
        if isinstance(members, str):
            return Derived(note=f"{members}; scheduled as a single pod")
        return Derived(
            job=Job(id=f"{ns}/jobset/{name}", min_available=max(1, members)),
            gang_source=f"JobSet {ns}/{name} ({how}: {members} pods)",
        )

    def _from_object(
        self,
        kind: str,
        ns: str,
        name: str,
        count: Callable[[Mapping[str, Any]], int | str],
        prefix: str,
    ) -> Derived:
        obj = self.get(kind, ns, name)
        if obj is None:
            return Derived(wait=f"waiting for owner {kind} {ns}/{name}")
        members = count(obj)
        if isinstance(members, str):
            return Derived(note=f"{members}; scheduled as a single pod")
        return Derived(
            job=Job(id=f"{ns}/{prefix}/{name}", min_available=max(1, members)),
            gang_source=f"{kind} {ns}/{name} ({members} pods)",
        )


def _kueue_group(ns: str, group: str, ann: Mapping[str, str]) -> Derived:
    raw = ann.get(ANN_KUEUE_POD_GROUP_TOTAL)
    total = _int(raw)
    if total is None or total < 1:
        return Derived(
            note=f"metadata.annotations[{ANN_KUEUE_POD_GROUP_TOTAL}] is {raw!r}, expected an "
            f"integer >= 1 for Kueue pod group {group}; scheduled as a single pod"
        )
    return Derived(
        job=Job(id=f"{ns}/kueue/{group}", min_available=total),
        gang_source=f"Kueue pod group {group} ({ANN_KUEUE_POD_GROUP_TOTAL}: {total})",
    )


def _lws_group(ns: str, labels: Mapping[str, str], ann: Mapping[str, str]) -> Derived:
    name = labels[LABEL_LWS_NAME]
    index = labels.get(LABEL_LWS_GROUP_INDEX, "")
    size = _int(ann.get(ANN_LWS_SIZE))
    if size is None or size < 1 or _int(index) is None:
        return Derived(
            note=f"LeaderWorkerSet {ns}/{name}: label {LABEL_LWS_GROUP_INDEX}={index!r} and "
            f"annotation {ANN_LWS_SIZE}={ann.get(ANN_LWS_SIZE)!r}, expected integers; scheduled "
            "as a single pod"
        )
    exclusive = (ann.get(ANN_LWS_EXCLUSIVE) or "").strip()
    source = f"LeaderWorkerSet {ns}/{name} group {index} ({ANN_LWS_SIZE}: {size})"
    if exclusive:
        source += f", exclusive per {exclusive}"
    return Derived(
        job=Job(
            id=f"{ns}/lws/{name}-{index}",
            min_available=size,
            topology=_exclusive(exclusive) if exclusive else NO_TOPOLOGY,
            exclusive=bool(exclusive),
        ),
        gang_source=source,
    )
