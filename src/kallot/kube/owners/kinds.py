"""The owner kinds as a table: one ``OwnerKind`` entry per kind kallot reads.

Where it sits: the heart of ``kube.owners``. The controller watches every entry's ``path``
(``OWNER_PATHS``); ``OwnerIndex`` walks ``KINDS`` in order to find a pod's gang (the first
entry whose ``claims`` holds decides, through its ``gang``), the owner object whose labels may
name its queue (``owner``) and the objects a Kueue Workload may be owned by (``kueue_owner``);
the chart's ClusterRole carries each entry's ``rbac`` (tools/gen_owner_rbac.py writes the block
in charts/kallot/templates/rbac.yaml, tests/kube/test_owners_table.py checks it, the rendered
deploy/kallot.yaml and ``kallot doctor``'s list against the table). docs/workloads.md is the
table in prose.

A new kind (CONTRIBUTING.md, "add an owner kind"): its names in ``labels``, its size in
``sizes`` when its spec says it, one entry here (a gang rule from ``gangs`` or a new one), a
test in tests/kube/test_owners*.py; then ``python tools/gen_owner_rbac.py`` and
``bash deploy/render.sh``, and its row in docs/workloads.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kallot.kube.owners import gangs
from kallot.kube.owners.facts import Derived, Lookup, PodFacts, controller_of
from kallot.kube.owners.labels import (
    JAXJOB,
    JOB,
    JOBSET,
    K8S_PODGROUP,
    KUEUE_WORKLOAD,
    LABEL_JOB_NAME,
    LABEL_JOBSET_NAME,
    LABEL_KUEUE_POD_GROUP,
    LABEL_LWS_NAME,
    LABEL_RAY_CLUSTER,
    LABEL_TRAINING_JOB_NAME,
    LOCALQUEUE,
    LWS,
    MPIJOB,
    NAMESPACE,
    PYTORCHJOB,
    RAYCLUSTER,
    RESOURCEFLAVOR,
    TFJOB,
    TRAINJOB,
)
from kallot.kube.owners.sizes import raycluster_members, training_members

#: What the scheduler may do with every owner object it reads (list + watch, and a get).
READ = ("get", "list", "watch")

Owner = tuple[str, Mapping[str, Any]]  # ("Kind ns/name", the object)


@dataclass(frozen=True, slots=True)
class OwnerKind:
    """One owner kind: where its objects are served, how a pod's gang, queue owner and Kueue
    Workload owner are found through it, and (``why``) what kallot reads it for."""

    kind: str
    why: str
    #: the API collection the controller lists and watches ("": no object is read, the pods'
    #: own labels and annotations say everything, as for LeaderWorkerSet and Kueue pod groups)
    path: str = ""
    #: the pod label that names the owner object (kallot explain reads the object by it)
    name_label: str = ""
    #: whether this entry derives the pod's gang (the first entry that claims a pod decides)
    claims: Callable[[PodFacts], bool] | None = None
    gang: Callable[[Lookup, PodFacts], Derived] | None = None
    #: the owner object whose labels may name the pod's queue (kallot's, then Kueue's)
    owner: Callable[[Lookup, PodFacts], Owner | None] | None = None
    #: (kind, name) of the objects a Kueue Workload for this pod may be owned by
    kueue_owner: Callable[[Lookup, PodFacts], list[tuple[str, str]]] | None = None
    #: a pod's controller of this kind: kallot knows it (a pod without its labels gets a note
    #: "left no labels", not "not a workload")
    controller: bool = False

    @property
    def rbac(self) -> tuple[str, str, tuple[str, ...]] | None:
        """(apiGroup, resource, verbs) the scheduler's ClusterRole needs; None without a path."""
        if not self.path:
            return None
        parts = self.path.strip("/").split("/")
        group = "" if parts[0] == "api" else parts[1]
        return group, parts[-1], READ


def training_kind(facts: PodFacts) -> str:
    """The training-operator kind of a pod: its controller's (PyTorchJob, TFJob, MPIJob,
    JAXJob); a pod with the label and another controller counts as a PyTorchJob's."""
    kind = facts.controller[1]
    return kind if kind in TRAINING_KINDS else PYTORCHJOB


def _labelled(label: str) -> Callable[[PodFacts], bool]:
    return lambda facts: bool(facts.labels.get(label))


def _by_label(kind: str, label: str) -> Callable[[Lookup, PodFacts], Owner | None]:
    def owner(index: Lookup, facts: PodFacts) -> Owner | None:
        name = facts.labels.get(label)
        obj = index.get(kind, facts.namespace, name) if name else None
        return (f"{kind} {facts.namespace}/{name}", obj) if obj is not None else None

    return owner


def _kueue_by_label(kind: str, label: str) -> Callable[[Lookup, PodFacts], list[tuple[str, str]]]:
    return lambda _index, facts: [(kind, facts.labels[label])] if facts.labels.get(label) else []


def _training(kind: str) -> OwnerKind:
    """A Kubeflow training-operator kind (kubeflow.org/v1): every pod has the job-name label
    and a controller ownerReference to the job; the size is Σ spec.<kind>ReplicaSpecs[*]."""

    def claims(facts: PodFacts) -> bool:
        return bool(facts.labels.get(LABEL_TRAINING_JOB_NAME)) and training_kind(facts) == kind

    def gang(index: Lookup, facts: PodFacts) -> Derived:
        name = facts.labels[LABEL_TRAINING_JOB_NAME]
        return gangs.from_object(
            index, kind, facts.namespace, name, count=training_members, prefix=kind.lower()
        )

    by_label = _by_label(kind, LABEL_TRAINING_JOB_NAME)

    def owner(index: Lookup, facts: PodFacts) -> Owner | None:
        return by_label(index, facts) if training_kind(facts) == kind else None

    return OwnerKind(
        kind=kind,
        why=f"Kubeflow {kind}s: Σ replicas of the replica specs start together",
        path=f"/apis/kubeflow.org/v1/{kind.lower()}s",
        name_label=LABEL_TRAINING_JOB_NAME,
        claims=claims,
        gang=gang,
        owner=owner,
        controller=True,
    )


def _trainjob_owner(index: Lookup, facts: PodFacts) -> Owner | None:
    """Kubeflow Trainer's TrainJob: the controller of the pod's JobSet."""
    ns, jobset = facts.namespace, facts.labels.get(LABEL_JOBSET_NAME)
    js = index.get(JOBSET, ns, jobset) if jobset else None
    ctrl = controller_of(js) if js is not None else None
    if ctrl is None or ctrl[0] != TRAINJOB:
        return None
    obj = index.get(TRAINJOB, ns, ctrl[1])
    return (f"{TRAINJOB} {ns}/{ctrl[1]}", obj) if obj is not None else None


def _jobset_kueue(index: Lookup, facts: PodFacts) -> list[tuple[str, str]]:
    """A JobSet's Workload is owned by the JobSet, or by its controller (a TrainJob)."""
    name = facts.labels.get(LABEL_JOBSET_NAME)
    if not name:
        return []
    js = index.get(JOBSET, facts.namespace, name)
    ctrl = controller_of(js) if js is not None else None
    return [*([ctrl] if ctrl is not None else []), (JOBSET, name)]


def _claims_job(facts: PodFacts) -> bool:
    api, kind, _, _ = facts.controller
    return bool(facts.labels.get(LABEL_JOB_NAME)) or (kind == JOB and api.startswith("batch/"))


#: Every owner kind, in the order a pod's gang is looked for (first claim wins) and its queue
#: owner and Kueue Workload owners are tried. Explicit kallot labels (kallot.io/pod-group,
#: kallot.io/queue) win over all of them (OwnerIndex.derive).
KINDS: tuple[OwnerKind, ...] = (
    OwnerKind(
        kind=K8S_PODGROUP,
        why="PodGroups (scheduling.k8s.io): the upstream Workload API's, a pod's schedulingGroup",
        path="/apis/scheduling.k8s.io/v1alpha2/podgroups",
        claims=lambda facts: bool(facts.scheduling_group),
        gang=lambda index, facts: gangs.k8s_podgroup(
            index, facts.namespace, facts.scheduling_group
        ),
    ),
    OwnerKind(
        kind="Kueue pod group",
        why="Kueue plain pod groups: the size is the pods' pod-group-total-count annotation",
        name_label=LABEL_KUEUE_POD_GROUP,
        claims=_labelled(LABEL_KUEUE_POD_GROUP),
        gang=lambda _index, facts: gangs.kueue_group(
            facts.namespace, facts.labels[LABEL_KUEUE_POD_GROUP], facts.annotations
        ),
    ),
    OwnerKind(
        kind=LWS,
        why="LeaderWorkerSet groups (and subgroups): sizes from the pods' annotations",
        name_label=LABEL_LWS_NAME,
        claims=_labelled(LABEL_LWS_NAME),
        gang=lambda _index, facts: gangs.lws_group(
            facts.namespace, facts.labels, facts.annotations
        ),
        kueue_owner=_kueue_by_label(LWS, LABEL_LWS_NAME),
        controller=True,
    ),
    OwnerKind(
        kind=TRAINJOB,
        why="Kubeflow Trainer TrainJobs: each runs as a JobSet, whose gang it names",
        path="/apis/trainer.kubeflow.org/v1alpha1/trainjobs",
        owner=_trainjob_owner,
        controller=True,
    ),
    OwnerKind(
        kind=JOBSET,
        why="JobSets: Σ replicas x parallelism per start stage (or their Jobs without the CRD)",
        path="/apis/jobset.x-k8s.io/v1alpha2/jobsets",
        name_label=LABEL_JOBSET_NAME,
        claims=_labelled(LABEL_JOBSET_NAME),
        gang=gangs.jobset,
        owner=_by_label(JOBSET, LABEL_JOBSET_NAME),
        kueue_owner=_jobset_kueue,
        controller=True,
    ),
    _training(TFJOB),
    _training(MPIJOB),
    _training(JAXJOB),
    _training(PYTORCHJOB),
    OwnerKind(
        kind=RAYCLUSTER,
        why="KubeRay RayClusters: the head and each group's minReplicas x numOfHosts",
        path="/apis/ray.io/v1/rayclusters",
        name_label=LABEL_RAY_CLUSTER,
        claims=_labelled(LABEL_RAY_CLUSTER),
        gang=lambda index, facts: gangs.from_object(
            index,
            RAYCLUSTER,
            facts.namespace,
            facts.labels[LABEL_RAY_CLUSTER],
            count=raycluster_members,
            prefix="raycluster",
        ),
        owner=_by_label(RAYCLUSTER, LABEL_RAY_CLUSTER),
        kueue_owner=_kueue_by_label(RAYCLUSTER, LABEL_RAY_CLUSTER),
        controller=True,
    ),
    OwnerKind(
        kind=JOB,
        why="batch Jobs: min(parallelism, completions left); a JobSet's child Jobs",
        path="/apis/batch/v1/jobs",
        name_label=LABEL_JOB_NAME,
        claims=_claims_job,
        gang=gangs.batch_job,
        owner=_by_label(JOB, LABEL_JOB_NAME),
        kueue_owner=_kueue_by_label(JOB, LABEL_JOB_NAME),
        controller=True,
    ),
    OwnerKind(
        kind=KUEUE_WORKLOAD,
        why="Kueue Workloads: held until admitted, then their ClusterQueue and flavors",
        path="/apis/kueue.x-k8s.io/v1beta2/workloads",
    ),
    OwnerKind(
        kind=LOCALQUEUE,
        why="Kueue LocalQueues: the ClusterQueue a queue-name label means",
        path="/apis/kueue.x-k8s.io/v1beta2/localqueues",
    ),
    OwnerKind(
        kind=RESOURCEFLAVOR,
        why="Kueue ResourceFlavors: the node labels of an admitted Workload's flavor",
        path="/apis/kueue.x-k8s.io/v1beta2/resourceflavors",
    ),
    OwnerKind(
        kind=NAMESPACE,
        why="Namespaces: the default queue (label kallot.io/queue); pod affinity's namespaceSelector",
        path="/api/v1/namespaces",
    ),
)

#: kind -> the API path the controller lists and watches (the kinds with objects to read).
OWNER_PATHS: Mapping[str, str] = {k.kind: k.path for k in KINDS if k.path}
#: The Kubeflow training-operator's kinds: the pod's controller ownerReference says which.
TRAINING_KINDS = frozenset(k.kind for k in KINDS if k.name_label == LABEL_TRAINING_JOB_NAME)
#: Controllers kallot derives gangs through (a pod of one without its labels gets a note).
GANG_KINDS = frozenset(k.kind for k in KINDS if k.controller)
#: (apiGroup, resource, verb) of every owner kind: the scheduler's ClusterRole grants each
#: (tests/kube/test_owners_table.py), ``kallot doctor`` checks each.
ACCESS: tuple[tuple[str, str, str], ...] = tuple(
    (rule[0], rule[1], verb) for k in KINDS if (rule := k.rbac) is not None for verb in rule[2]
)
