"""Gangs and queues of workloads as users submit them: derived from a pod's owner chain.

Sits beside ``translate`` in the live scheduler's flow: the cache keeps the owner objects the
controller's reflectors deliver (``OWNER_PATHS``: batch Jobs and Namespaces always; JobSets,
Kubeflow training jobs and TrainJobs, RayClusters, Kueue Workloads/LocalQueues/ResourceFlavors
and the upstream scheduling.k8s.io PodGroups where they are served) in an ``OwnerIndex``, and ``OwnerIndex.resolve`` turns a pod's Task
(from ``translate.pod_to_task``) into one whose ``job`` and ``queue`` name the gang and queue
its owner implies, with the core ``Job`` for that gang: the same Job a hand-written PodGroup
gives (``min_available``, ``topology``, ``queue``). A pod's Kueue Workload adds to that: held
until admitted, then its ClusterQueue as the queue and its ResourceFlavor's node labels. The owners' controllers put labels,
annotations and ownerReferences on the pods; the sizes come from the pods themselves where
their controller writes them (LeaderWorkerSet, Kueue pod groups) and from the owner object's
spec otherwise (Job ``parallelism``, JobSet ``replicatedJobs``, RayCluster ``minReplicas``).

Explicit kallot settings win: a ``kallot.io/pod-group`` label keeps its PodGroup, a
``kallot.io/queue`` label keeps its queue. A pod whose owner is unknown or malformed schedules
as a single pod and ``Derived.note`` says why (the controller writes it as an Event). The
table of owner -> gang/queue source is docs/workloads.md.

Long module: one owner index serves every owner kind (Job, JobSet, LeaderWorkerSet, the
Kubeflow jobs, TrainJob, RayCluster, Kueue Workloads, the upstream PodGroup) because a pod's
gang, queue and topology come from walking one owner chain across kinds; per-kind modules
would each need the index and the walk.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kallot.core.workload import NO_TOPOLOGY, Job, Task, TopologyConstraint, TopologyMode
from kallot.kube.state import translate

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
# LWS subgroups (spec.leaderWorkerTemplate.subGroupPolicy): its pod webhook labels each pod
# with its subgroup; the size and the subgroup's exclusive key are annotations.
LABEL_LWS_SUBGROUP_INDEX = "leaderworkerset.sigs.k8s.io/subgroup-index"
ANN_LWS_SUBGROUP_SIZE = "leaderworkerset.sigs.k8s.io/subgroup-size"
ANN_LWS_SUBGROUP_EXCLUSIVE = "leaderworkerset.sigs.k8s.io/subgroup-exclusive-topology"
ANN_LWS_SUBGROUP_POLICY = "leaderworkerset.sigs.k8s.io/subgroup-policy-type"
LWS_LEADER_EXCLUDED = "LeaderExcluded"
# Kubeflow training-operator (kubeflow.org/v1 PyTorchJob, TFJob, MPIJob): on every pod, with
# a controller ownerReference to the job object.
LABEL_TRAINING_JOB_NAME = "training.kubeflow.org/job-name"
LABEL_TRAINING_REPLICA_TYPE = "training.kubeflow.org/replica-type"
# KubeRay (ray.io/v1 RayCluster).
LABEL_RAY_CLUSTER = "ray.io/cluster"
# Kueue: plain pod groups, and the LocalQueue a workload is submitted to.
LABEL_KUEUE_POD_GROUP = "kueue.x-k8s.io/pod-group-name"
ANN_KUEUE_POD_GROUP_TOTAL = "kueue.x-k8s.io/pod-group-total-count"
LABEL_KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
# Kueue's namespace default: a LocalQueue of this name takes the workloads with no queue label.
KUEUE_DEFAULT_LOCAL_QUEUE = "default"
KUEUE_ADMITTED = "Admitted"
# The upstream Workload API (scheduling.k8s.io/v1alpha2, Kubernetes 1.36, feature gate
# GenericWorkload): a pod names its PodGroup in spec.schedulingGroup.podGroupName.

# Owner kinds the index keeps, and where the controller lists and watches them.
JOB = "Job"
JOBSET = "JobSet"
PYTORCHJOB = "PyTorchJob"
TFJOB = "TFJob"
MPIJOB = "MPIJob"
TRAINJOB = "TrainJob"
RAYCLUSTER = "RayCluster"
KUEUE_WORKLOAD = "Workload"
LOCALQUEUE = "LocalQueue"
RESOURCEFLAVOR = "ResourceFlavor"
K8S_PODGROUP = "PodGroup.scheduling.k8s.io"
NAMESPACE = "Namespace"
OWNER_PATHS: Mapping[str, str] = {
    JOB: "/apis/batch/v1/jobs",
    JOBSET: "/apis/jobset.x-k8s.io/v1alpha2/jobsets",
    PYTORCHJOB: "/apis/kubeflow.org/v1/pytorchjobs",
    TFJOB: "/apis/kubeflow.org/v1/tfjobs",
    MPIJOB: "/apis/kubeflow.org/v1/mpijobs",
    TRAINJOB: "/apis/trainer.kubeflow.org/v1alpha1/trainjobs",
    RAYCLUSTER: "/apis/ray.io/v1/rayclusters",
    KUEUE_WORKLOAD: "/apis/kueue.x-k8s.io/v1beta2/workloads",
    LOCALQUEUE: "/apis/kueue.x-k8s.io/v1beta2/localqueues",
    RESOURCEFLAVOR: "/apis/kueue.x-k8s.io/v1beta2/resourceflavors",
    K8S_PODGROUP: "/apis/scheduling.k8s.io/v1alpha2/podgroups",
    NAMESPACE: "/api/v1/namespaces",  # the namespace's default queue (its kallot.io/queue label)
}
# The Kubeflow training-operator's kinds: the pod's controller ownerReference says which.
TRAINING_KINDS = frozenset({PYTORCHJOB, TFJOB, MPIJOB})
# Controllers whose pods are not gangs: no gang and nothing to say.
NOT_GANGS = frozenset({"ReplicaSet", "StatefulSet", "DaemonSet", "Node", "ReplicationController"})
# Kinds kallot derives a gang for through another path (the pod's own labels or its Job).
VIA_LABELS = frozenset({JOB, "LeaderWorkerSet", RAYCLUSTER, *TRAINING_KINDS})

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
    #: the wait does not time out (a Kueue Workload not admitted yet)
    hold: bool = False
    #: node labels the pod must land on (the admitted Kueue Workload's ResourceFlavor)
    node_selector: Mapping[str, str] = field(default_factory=dict)


NOTHING = Derived()


@dataclass(frozen=True, slots=True)
class PodFacts:
    """The part of a pod the derivation reads, kept per pod by the index."""

    namespace: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    controller: tuple[str, str, str, str]  # (apiVersion, kind, name, uid) or empty strings
    name: str = ""
    scheduling_group: str = ""  # spec.schedulingGroup.podGroupName (the upstream Workload API)
    node_selector: Mapping[str, str] = field(default_factory=dict)  # the pod's own nodeSelector

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
            name=str(meta.get("name", "")),
            scheduling_group=str(
                ((pod.get("spec") or {}).get("schedulingGroup") or {}).get("podGroupName") or ""
            ),
            node_selector={
                str(k): str(v)
                for k, v in ((pod.get("spec") or {}).get("nodeSelector") or {}).items()
            },
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


def jobset_stage(jobset: Mapping[str, Any], replicated_job: str) -> str:
    """The start stage of a replicated job: "" for those that start at once, otherwise
    ``after-<the replicated jobs it dependsOn>`` (the JobSet controller creates its Jobs only
    once those are ready or complete, as Kubeflow Trainer's initializers -> trainer nodes)."""
    for rj in (jobset.get("spec") or {}).get("replicatedJobs") or []:
        if rj.get("name") == replicated_job:
            deps = sorted(str(d.get("name", "")) for d in rj.get("dependsOn") or [])
            return f"after-{'-'.join(deps)}" if deps else ""
    return ""


def jobset_members(jobset: Mapping[str, Any], stage: str = "") -> int | str:
    """Pods of a JobSet that start together: sum over the replicatedJobs of one start stage
    (``jobset_stage``; all of them without dependsOn) of replicas x the Job template's
    members."""
    meta = jobset.get("metadata") or {}
    where = f"JobSet {meta.get('namespace', '')}/{meta.get('name', '')}: spec.replicatedJobs"
    total = 0
    for i, rj in enumerate((jobset.get("spec") or {}).get("replicatedJobs") or []):
        if jobset_stage(jobset, str(rj.get("name", ""))) != stage:
            continue
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


def podgroup_members(obj: Mapping[str, Any]) -> int | str:
    """Pods of an upstream PodGroup (scheduling.k8s.io/v1alpha2) that start together: the gang
    policy's ``minCount``; 0 for the basic policy (each pod alone)."""
    meta = obj.get("metadata") or {}
    where = f"PodGroup {meta.get('namespace', '')}/{meta.get('name', '')}: spec.schedulingPolicy"
    policy = (obj.get("spec") or {}).get("schedulingPolicy") or {}
    if "gang" not in policy:
        return 0
    count = _int((policy.get("gang") or {}).get("minCount"))
    if count is None or count < 1:
        return f"{where}.gang.minCount is {policy['gang']!r}, expected an integer >= 1"
    return count


def _condition(obj: Mapping[str, Any], kind: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


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
        candidates = []
        if labels.get(LABEL_JOBSET_NAME):
            js = self.get(JOBSET, ns, labels[LABEL_JOBSET_NAME])
            ctrl = _controller_of(js) if js is not None else None
            if ctrl is not None:
                candidates.append(ctrl)
            candidates.append((JOBSET, labels[LABEL_JOBSET_NAME]))
        if labels.get(LABEL_RAY_CLUSTER):
            candidates.append((RAYCLUSTER, labels[LABEL_RAY_CLUSTER]))
        if labels.get(LABEL_LWS_NAME):
            candidates.append(("LeaderWorkerSet", labels[LABEL_LWS_NAME]))
        if labels.get(LABEL_JOB_NAME):
            candidates.append((JOB, labels[LABEL_JOB_NAME]))
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
        if not _condition(wl, KUEUE_ADMITTED) or not admission:
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
        ns, labels = facts.namespace, facts.labels
        jobset = labels.get(LABEL_JOBSET_NAME)
        js = self.get(JOBSET, ns, jobset) if jobset else None
        trainjob = _controller_of(js) if js is not None else None
        if trainjob is not None and trainjob[0] == TRAINJOB:  # Kubeflow Trainer's JobSet
            obj = self.get(TRAINJOB, ns, trainjob[1])
            if obj is not None:
                return f"{TRAINJOB} {ns}/{trainjob[1]}", obj
        for kind, key in (
            (JOBSET, LABEL_JOBSET_NAME),
            (_training_kind(facts), LABEL_TRAINING_JOB_NAME),
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
        if facts.scheduling_group:
            return self._k8s_podgroup(ns, facts.scheduling_group)
        if labels.get(LABEL_KUEUE_POD_GROUP):
            return _kueue_group(ns, labels[LABEL_KUEUE_POD_GROUP], ann)
        if labels.get(LABEL_LWS_NAME):
            return _lws_group(ns, labels, ann)
        if labels.get(LABEL_JOBSET_NAME):
            return self._jobset(facts)
        if labels.get(LABEL_TRAINING_JOB_NAME):
            kind = _training_kind(facts)
            return self._from_object(
                kind, ns, labels[LABEL_TRAINING_JOB_NAME], training_members, kind.lower()
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
        if kind in VIA_LABELS or kind in (JOBSET, TRAINJOB):
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
        gang_id, what = f"{ns}/jobset/{name}", f"JobSet {ns}/{name}"
        if jobset is not None:
            stage = jobset_stage(jobset, labels.get(LABEL_JOBSET_REPLICATED_JOB, ""))
            members: int | str = jobset_members(jobset, stage)
            how = "spec.replicatedJobs: replicas x parallelism"
            if stage:
                gang_id += f"/{stage}"
                how += f" of the replicated jobs that start {stage.replace('-', ' ', 1)}"
            ctrl = _controller_of(jobset)
            if ctrl is not None and ctrl[0] == TRAINJOB:  # Kubeflow Trainer runs as a JobSet
                gang_id = gang_id.replace("/jobset/", "/trainjob/", 1)
                what = f"TrainJob {ns}/{ctrl[1]} via {what}"
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
            job=Job(id=gang_id, min_available=max(1, members)),
            gang_source=f"{what} ({how}: {members} pods)",
        )

    def _k8s_podgroup(self, ns: str, name: str) -> Derived:
        obj = self.get(K8S_PODGROUP, ns, name)
        if obj is None:
            return Derived(wait=f"waiting for PodGroup {ns}/{name} (scheduling.k8s.io)")
        members = podgroup_members(obj)
        if isinstance(members, str):
            return Derived(note=f"{members}; scheduled as a single pod")
        if members == 0:
            return NOTHING  # the basic policy: each pod on its own
        spec = obj.get("spec") or {}
        keys = [
            str(t.get("key", ""))
            for t in (spec.get("schedulingConstraints") or {}).get("topology") or []
            if t.get("key")
        ]
        topology = (
            TopologyConstraint(mode=TopologyMode.REQUIRED, level=keys[0]) if keys else NO_TOPOLOGY
        )
        source = f"PodGroup {ns}/{name} (scheduling.k8s.io, gang minCount: {members})"
        ref = (spec.get("podGroupTemplateRef") or {}).get("workload") or {}
        if ref.get("workloadName"):
            source += f" of Workload {ns}/{ref['workloadName']}"
        if keys:
            source += f", all in one {keys[0]} domain"
        return Derived(
            job=Job(id=f"{ns}/podgroup/{name}", min_available=members, topology=topology),
            gang_source=source,
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
    if ann.get(ANN_LWS_SUBGROUP_SIZE) is not None:
        return _lws_subgroup(ns, name, index=index, size=size, labels=labels, ann=ann)
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


def _lws_subgroup(
    ns: str, name: str, *, index: str, size: int, labels: Mapping[str, str], ann: Mapping[str, str]
) -> Derived:
    """One gang per LWS subgroup (placed as a unit; with the subgroup exclusive annotation, in
    its own domain of that key). Sizes as the LWS pod webhook numbers them: workers in
    subgroups of ``subgroup-size``; the leader joins subgroup 0 as an extra pod when
    ``(size - 1)`` divides evenly, is one of its members otherwise, and is in none with
    the LeaderExcluded policy."""
    sub_size = _int(ann.get(ANN_LWS_SUBGROUP_SIZE))
    sub = _int(labels.get(LABEL_LWS_SUBGROUP_INDEX))
    excluded = ann.get(ANN_LWS_SUBGROUP_POLICY) == LWS_LEADER_EXCLUDED
    if sub_size is None or sub_size < 1 or sub is None:
        if excluded and sub is None and sub_size:  # the leader of a LeaderExcluded set
            return Derived(
                gang_source=f"LeaderWorkerSet {ns}/{name} group {index}: the leader, "
                f"outside every subgroup ({ANN_LWS_SUBGROUP_POLICY}: {LWS_LEADER_EXCLUDED})"
            )
        return Derived(
            note=f"LeaderWorkerSet {ns}/{name}: label {LABEL_LWS_SUBGROUP_INDEX}="
            f"{labels.get(LABEL_LWS_SUBGROUP_INDEX)!r} and annotation {ANN_LWS_SUBGROUP_SIZE}="
            f"{ann.get(ANN_LWS_SUBGROUP_SIZE)!r}, expected integers; scheduled as a single pod"
        )
    workers = size - 1
    if excluded:
        members = min(sub_size, workers - sub * sub_size)
    elif workers % sub_size == 0:
        members = min(sub_size, workers - sub * sub_size) + (1 if sub == 0 else 0)
    else:
        members = min(sub_size, size - sub * sub_size)
    members = max(1, members)
    exclusive = (ann.get(ANN_LWS_SUBGROUP_EXCLUSIVE) or "").strip()
    source = (
        f"LeaderWorkerSet {ns}/{name} group {index} subgroup {sub} "
        f"({ANN_LWS_SUBGROUP_SIZE}: {sub_size}, {members} pods)"
    )
    if exclusive:
        source += f", exclusive per {exclusive} ({ANN_LWS_SUBGROUP_EXCLUSIVE})"
    return Derived(
        job=Job(
            id=f"{ns}/lws/{name}-{index}-sub{sub}",
            min_available=members,
            topology=_exclusive(exclusive) if exclusive else NO_TOPOLOGY,
            exclusive=bool(exclusive),
        ),
        gang_source=source,
    )


def _controller_of(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """(kind, name) of the object's controller ownerReference, if any."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("kind", "")), str(ref.get("name", ""))
    return None


def _training_kind(facts: PodFacts) -> str:
    """The training-operator kind of a pod: its controller's (PyTorchJob, TFJob, MPIJob)."""
    kind = facts.controller[1]
    return kind if kind in TRAINING_KINDS else PYTORCHJOB


def more_owner_names(facts: PodFacts) -> dict[str, str]:
    """kind -> name of the owner objects beyond Job/JobSet/PyTorchJob/RayCluster that a pod
    names (for ``kallot explain``, which reads them one by one)."""
    out: dict[str, str] = {}
    name = facts.labels.get(LABEL_TRAINING_JOB_NAME)
    if name and _training_kind(facts) != PYTORCHJOB:
        out[_training_kind(facts)] = name
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
