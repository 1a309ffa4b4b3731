"""The gang rules of the owner kinds: a pod's facts and the owner objects -> its ``Derived``.

Where it sits: each rule is the ``gang`` of one or more entries in ``kinds.KINDS`` (the table
the index walks, first claim wins); the rules read owner objects through ``facts.Lookup`` (the
``OwnerIndex``) and sizes from ``sizes``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kallot.core.workload import NO_TOPOLOGY, Job, TopologyConstraint, TopologyMode
from kallot.kube.owners.facts import (
    NOTHING,
    Derived,
    Lookup,
    PodFacts,
    controller_of,
    exclusive_in,
    to_int,
)
from kallot.kube.owners.labels import (
    ANN_JOBSET_EXCLUSIVE,
    ANN_KUEUE_POD_GROUP_TOTAL,
    ANN_LWS_EXCLUSIVE,
    ANN_LWS_SIZE,
    ANN_LWS_SUBGROUP_EXCLUSIVE,
    ANN_LWS_SUBGROUP_POLICY,
    ANN_LWS_SUBGROUP_SIZE,
    JOB,
    JOBSET,
    K8S_PODGROUP,
    LABEL_JOB_CONTROLLER_UID,
    LABEL_JOB_NAME,
    LABEL_JOBSET_NAME,
    LABEL_JOBSET_REPLICAS,
    LABEL_JOBSET_REPLICATED_JOB,
    LABEL_LWS_GROUP_INDEX,
    LABEL_LWS_NAME,
    LABEL_LWS_SUBGROUP_INDEX,
    LWS_LEADER_EXCLUDED,
    TRAINJOB,
)
from kallot.kube.owners.sizes import job_members, jobset_members, jobset_stage, podgroup_members


def batch_job(index: Lookup, facts: PodFacts) -> Derived:
    ns = facts.namespace
    _, kind, ref_name, ref_uid = facts.controller
    name = facts.labels.get(LABEL_JOB_NAME) or ref_name
    if kind == JOB and ref_name and ref_name != name:
        return Derived(
            note=f"label {LABEL_JOB_NAME}={name} names another Job than the pod's owner "
            f"{ref_name}; scheduled as a single pod"
        )
    job = index.get(JOB, ns, name)
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
    topology = exclusive_in(exclusive) if exclusive else NO_TOPOLOGY
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


def jobset(index: Lookup, facts: PodFacts) -> Derived:
    ns, labels = facts.namespace, facts.labels
    name = labels[LABEL_JOBSET_NAME]
    if (facts.annotations.get(ANN_JOBSET_EXCLUSIVE) or "").strip():
        # Exclusive placement: each child Job is its own gang inside one domain.
        return batch_job(index, facts)
    jobset = index.get(JOBSET, ns, name)
    gang_id, what = f"{ns}/jobset/{name}", f"JobSet {ns}/{name}"
    if jobset is not None:
        stage = jobset_stage(jobset, labels.get(LABEL_JOBSET_REPLICATED_JOB, ""))
        members: int | str = jobset_members(jobset, stage)
        how = "spec.replicatedJobs: replicas x parallelism"
        if stage:
            gang_id += f"/{stage}"
            how += f" of the replicated jobs that start {stage.replace('-', ' ', 1)}"
        ctrl = controller_of(jobset)
        if ctrl is not None and ctrl[0] == TRAINJOB:  # Kubeflow Trainer runs as a JobSet
            gang_id = gang_id.replace("/jobset/", "/trainjob/", 1)
            what = f"TrainJob {ns}/{ctrl[1]} via {what}"
    else:
        # No JobSet object (CRD not watched): its child Jobs, all created at once.
        children = index.jobset_jobs(ns, name)
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
            replicas = to_int(labels.get(LABEL_JOBSET_REPLICAS))
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


def k8s_podgroup(index: Lookup, ns: str, name: str) -> Derived:
    obj = index.get(K8S_PODGROUP, ns, name)
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


def from_object(
    index: Lookup,
    kind: str,
    ns: str,
    name: str,
    *,
    count: Callable[[Mapping[str, Any]], int | str],
    prefix: str,
) -> Derived:
    """The gang of an owner object whose spec gives its size (``count``): ``<ns>/<prefix>/<name>``."""
    obj = index.get(kind, ns, name)
    if obj is None:
        return Derived(wait=f"waiting for owner {kind} {ns}/{name}")
    members = count(obj)
    if isinstance(members, str):
        return Derived(note=f"{members}; scheduled as a single pod")
    return Derived(
        job=Job(id=f"{ns}/{prefix}/{name}", min_available=max(1, members)),
        gang_source=f"{kind} {ns}/{name} ({members} pods)",
    )


def kueue_group(ns: str, group: str, ann: Mapping[str, str]) -> Derived:
    raw = ann.get(ANN_KUEUE_POD_GROUP_TOTAL)
    total = to_int(raw)
    if total is None or total < 1:
        return Derived(
            note=f"metadata.annotations[{ANN_KUEUE_POD_GROUP_TOTAL}] is {raw!r}, expected an "
            f"integer >= 1 for Kueue pod group {group}; scheduled as a single pod"
        )
    return Derived(
        job=Job(id=f"{ns}/kueue/{group}", min_available=total),
        gang_source=f"Kueue pod group {group} ({ANN_KUEUE_POD_GROUP_TOTAL}: {total})",
    )


def lws_group(ns: str, labels: Mapping[str, str], ann: Mapping[str, str]) -> Derived:
    name = labels[LABEL_LWS_NAME]
    index = labels.get(LABEL_LWS_GROUP_INDEX, "")
    size = to_int(ann.get(ANN_LWS_SIZE))
    if size is None or size < 1 or to_int(index) is None:
        return Derived(
            note=f"LeaderWorkerSet {ns}/{name}: label {LABEL_LWS_GROUP_INDEX}={index!r} and "
            f"annotation {ANN_LWS_SIZE}={ann.get(ANN_LWS_SIZE)!r}, expected integers; scheduled "
            "as a single pod"
        )
    if ann.get(ANN_LWS_SUBGROUP_SIZE) is not None:
        return lws_subgroup(ns, name, index=index, size=size, labels=labels, ann=ann)
    exclusive = (ann.get(ANN_LWS_EXCLUSIVE) or "").strip()
    source = f"LeaderWorkerSet {ns}/{name} group {index} ({ANN_LWS_SIZE}: {size})"
    if exclusive:
        source += f", exclusive per {exclusive}"
    return Derived(
        job=Job(
            id=f"{ns}/lws/{name}-{index}",
            min_available=size,
            topology=exclusive_in(exclusive) if exclusive else NO_TOPOLOGY,
            exclusive=bool(exclusive),
        ),
        gang_source=source,
    )


def lws_subgroup(
    ns: str, name: str, *, index: str, size: int, labels: Mapping[str, str], ann: Mapping[str, str]
) -> Derived:
    """One gang per LWS subgroup (placed as a unit; with the subgroup exclusive annotation, in
    its own domain of that key). Sizes as the LWS pod webhook numbers them: workers in
    subgroups of ``subgroup-size``; the leader joins subgroup 0 as an extra pod when
    ``(size - 1)`` divides evenly, is one of its members otherwise, and is in none with
    the LeaderExcluded policy."""
    sub_size = to_int(ann.get(ANN_LWS_SUBGROUP_SIZE))
    sub = to_int(labels.get(LABEL_LWS_SUBGROUP_INDEX))
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
            topology=exclusive_in(exclusive) if exclusive else NO_TOPOLOGY,
            exclusive=bool(exclusive),
        ),
        gang_source=source,
    )
