"""The sizes of gangs as the owner objects' specs say them (Job, JobSet, training jobs, ...).

Where it sits: read by the gang rules (``gangs``) and named as each kind's ``size`` in
``kinds.KINDS``; a size is an int or a one-line reason the spec cannot say.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kallot.kube.owners.facts import to_int as _int


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
