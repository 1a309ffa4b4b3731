"""``kallot explain POD``: why a pod is pending, or what it got, in plain words.

Reads what the scheduler wrote on the API objects (the ``PodScheduled`` condition, Events, the
device record), and restates the pod's GPU request as the scheduler understands it, including a
malformed request's error. Nothing here schedules; ``describe`` is pure (dicts in, lines out)
and ``fetch`` is the one API read, so the CLI and tests share both.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kallot.core.errors import ConfigError
from kallot.core.resources import MILLI
from kallot.core.workload import Task, TopologyMode
from kallot.kube import owners, translate
from kallot.kube.api.client import ApiError, KubeClient
from kallot.kube.bind import claims as dra_bind
from kallot.kube.dra import explain as dra_explain

SCHEDULER_REASONS = ("FailedScheduling", "InvalidRequest", "Scheduled", "NoGangDerived")


@dataclass(frozen=True, slots=True)
class Explanation:
    """What ``kallot explain`` prints: a headline, the request, and details."""

    pod: str
    status: str  # bound | pending | invalid | not-kallot | finished
    headline: str
    request: str
    details: tuple[str, ...] = ()
    events: tuple[str, ...] = field(default_factory=tuple)
    workload: tuple[str, ...] = ()  # the gang and queue derived from the owner, and from where

    def lines(self) -> list[str]:
        out = [f"Pod {self.pod}: {self.headline}", f"Request: {self.request}"]
        out += self.workload
        out += self.details
        if self.events:
            out.append("Events (newest last):")
            out += [f"  {e}" for e in self.events]
        return out


def _gib(mib: int) -> str:
    return f"{mib / 1024:.1f}".rstrip("0").rstrip(".") + " GiB"


def describe_request(task: Task) -> str:
    """The GPU (and host) request of a task in words."""
    host = f"{task.cpu_milli}m CPU, {task.mem_mib} MiB memory"
    req = task.gpu
    if req is None or req.count == 0:
        return f"no GPU; {host}"
    if req.mig_profile:
        what = f"one MIG instance {req.mig_profile}"
    elif req.whole:
        what = f"{req.count} whole GPU{'s' if req.count != 1 else ''}"
    else:
        share = f"{req.milli} milli-GPU ({req.milli * 100 // MILLI}% of one GPU)"
        mem = _gib(req.mem_mib) if req.mem_mib else "memory in proportion"
        what = f"a share of one GPU: {share}, {mem}"
    extra = []
    if req.models:
        extra.append(f"models {', '.join(sorted(req.models))}")
    if not req.whole and not req.mig_profile:
        extra.append(f"sharing {', '.join(sorted(m.label for m in req.modes))}")
    if req.isolation.name != "NONE":
        extra.append(f"isolation {req.isolation.name.lower()}")
    if req.topology.mode is not TopologyMode.NONE:
        extra.append(f"topology {req.topology.mode.name.lower()}:{req.topology.level}")
    if task.job:
        extra.append(f"gang {task.job}")
    if task.queue:
        extra.append(f"queue {task.queue}")
    tail = f" ({'; '.join(extra)})" if extra else ""
    return f"{what}{tail}; {host}"


def _condition(pod: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            found: Mapping[str, Any] = c
            return found
    return None


def _event_line(e: Mapping[str, Any]) -> str:
    when = e.get("lastTimestamp") or e.get("eventTime") or e.get("firstTimestamp") or ""
    count = e.get("count") or 1
    times = f" (x{count})" if count and int(count) > 1 else ""
    return f"{when} {e.get('type', '')} {e.get('reason', '')}: {e.get('message', '')}{times}"


def describe_workload(
    pod: Mapping[str, Any], owner_objects: Mapping[str, Sequence[Mapping[str, Any]]]
) -> tuple[str, ...]:
    """The gang and queue the scheduler derives for the pod (kube.owners), with their source.
    ``owner_objects``: kind -> the owner objects read for it (Job, JobSet, ...)."""
    index = owners.OwnerIndex()
    for kind, objs in owner_objects.items():
        index.replace(kind, objs)
    d = index.derive(owners.PodFacts.of(pod))
    lines = []
    if d.job is not None:
        topo = ""
        if d.job.topology.mode is not TopologyMode.NONE:
            topo = f", all in one {d.job.topology.level} domain"
        lines.append(
            f"Gang: {d.job.id}, {d.job.min_available} pods start together{topo} "
            f"(from {d.gang_source})"
        )
    elif d.gang_source:
        lines.append(f"Gang: from {d.gang_source}")
    elif d.wait:
        lines.append(f"Gang: {d.wait}")
    elif d.note:
        lines.append(f"Gang: none, {d.note}")
    if d.queue:
        lines.append(f"Queue: {d.queue} (from {d.queue_source})")
    return tuple(lines)


def describe(
    pod: Mapping[str, Any],
    events: Sequence[Mapping[str, Any]] = (),
    *,
    scheduler_name: str = translate.SCHEDULER_NAME,
    owner_objects: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    claims: Sequence[Mapping[str, Any]] = (),
) -> Explanation:
    workload = describe_workload(pod, owner_objects or {})
    workload = (*workload, *dra_explain.claim_lines(pod, claims))  # DRA (kube.dra.explain)
    return dataclasses.replace(
        _describe(pod, events, scheduler_name=scheduler_name), workload=workload
    )


def _describe(
    pod: Mapping[str, Any],
    events: Sequence[Mapping[str, Any]] = (),
    *,
    scheduler_name: str = translate.SCHEDULER_NAME,
) -> Explanation:
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    key = translate.pod_key(pod)
    ours = [
        e
        for e in sorted(
            events, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or "")
        )
        if e.get("reason") in SCHEDULER_REASONS
    ]
    event_lines = tuple(_event_line(e) for e in ours[-5:])
    try:
        task = translate.pod_to_task(pod)
        request = describe_request(task)
        error: ConfigError | None = None
    except ConfigError as exc:
        request = f"invalid: {exc}"
        error = exc
    node = translate.pod_node(pod)
    if translate.pod_finished(pod):
        phase = (pod.get("status") or {}).get("phase")
        return Explanation(
            key, "finished", f"{phase} on {node or 'no node'}", request, (), event_lines
        )
    if spec.get("schedulerName") != scheduler_name and not node:
        return Explanation(
            key,
            "not-kallot",
            f"not scheduled by {scheduler_name} (spec.schedulerName is "
            f"{spec.get('schedulerName') or 'default-scheduler'})",
            request,
            (),
            event_lines,
        )
    if node:
        details: list[str] = []
        try:
            record = translate.pod_record(pod)
        except ConfigError as exc:
            record = None
            details.append(f"Device record is malformed: {exc}")
        ann = meta.get("annotations") or {}
        if record is not None:
            details.append(
                f"Devices (record for node {record.node}, phase "
                f"{ann.get(translate.ANN_BIND_PHASE, '?')}):"
            )
            for d in record.devices:
                mig = f", MIG {d.mig.profile}@{d.mig.start}" if d.mig else ""
                details.append(
                    f"  GPU {d.index} {d.uuid}: {d.milli} milli-GPU, {_gib(d.mem_mib)}, {d.mode}{mig}"
                )
        elif error is None and task.gpu is not None:
            details.append("No device record (bound by another scheduler?)")
        return Explanation(
            key, "bound", f"bound to node {node}", request, tuple(details), event_lines
        )
    if error is not None:
        return Explanation(
            key,
            "invalid",
            f"pending: the request is invalid and will not be scheduled until it is fixed: {error}",
            request,
            (),
            event_lines,
        )
    cond = _condition(pod, "PodScheduled")
    if cond is not None and cond.get("status") == "False":
        since = cond.get("lastTransitionTime") or ""
        return Explanation(
            key,
            "pending",
            f"pending ({cond.get('reason', 'Unschedulable')} since {since})",
            request,
            (f"Why: {cond.get('message', '')}",),
            event_lines,
        )
    gates = spec.get("schedulingGates") or []
    if gates:
        names = ", ".join(str(g.get("name")) for g in gates)
        return Explanation(
            key, "pending", f"pending: held by scheduling gates {names}", request, (), event_lines
        )
    return Explanation(
        key,
        "pending",
        "pending: waiting for the scheduler (no decision recorded yet)",
        request,
        (),
        event_lines,
    )


async def fetch(
    client: KubeClient, namespace: str, name: str, *, scheduler_name: str = translate.SCHEDULER_NAME
) -> Explanation:
    """Read the pod and its Events and describe them."""
    pod = await client.get_pod(namespace, name)
    uid = str((pod.get("metadata") or {}).get("uid", ""))
    events = await client.list_events_for(namespace, name, uid)
    # The owner objects the gang's size comes from (absent or unreadable: explained without).
    labels = (pod.get("metadata") or {}).get("labels") or {}
    found: dict[str, list[dict[str, Any]]] = {}
    facts = owners.PodFacts.of(pod)
    wanted = {
        owners.JOB: labels.get(owners.LABEL_JOB_NAME),
        owners.JOBSET: labels.get(owners.LABEL_JOBSET_NAME),
        owners.PYTORCHJOB: labels.get(owners.LABEL_TRAINING_JOB_NAME),
        owners.RAYCLUSTER: labels.get(owners.LABEL_RAY_CLUSTER),
        **owners.more_owner_names(facts),
    }
    for kind, owner in wanted.items():
        if not owner:
            continue
        base = owners.OWNER_PATHS[kind].rpartition("/")
        try:
            found[kind] = [await client.get(f"{base[0]}/namespaces/{namespace}/{base[2]}/{owner}")]
        except ApiError:
            continue
    # Kueue's objects and the namespace: the pod's Workload, LocalQueues, flavors, its queue.
    for kind, path in owners.explain_lists(namespace).items():
        try:
            answer = await client.get(path)
            found[kind] = [answer] if kind == owners.NAMESPACE else list(answer.get("items") or [])
        except ApiError:
            continue
    for js in found.get(owners.JOBSET, []):  # Kubeflow Trainer's JobSet: its TrainJob
        for ref in (js.get("metadata") or {}).get("ownerReferences") or []:
            if ref.get("controller") and ref.get("kind") == owners.TRAINJOB:
                base = owners.OWNER_PATHS[owners.TRAINJOB].rpartition("/")
                with contextlib.suppress(ApiError):
                    found[owners.TRAINJOB] = [
                        await client.get(
                            f"{base[0]}/namespaces/{namespace}/{base[2]}/{ref['name']}"
                        )
                    ]
    if labels.get(owners.LABEL_JOBSET_NAME) and owners.JOBSET not in found:
        try:
            answer = await client.request(
                "GET",
                f"/apis/batch/v1/namespaces/{namespace}/jobs",
                query=[
                    (
                        "labelSelector",
                        f"{owners.LABEL_JOBSET_NAME}={labels[owners.LABEL_JOBSET_NAME]}",
                    )
                ],
            )
            found[owners.JOB] = list(answer.get("items") or [])
        except ApiError:
            pass
    claims = []
    for claim in dra_explain.claim_names(pod):
        try:
            claims.append(await client.get(f"{dra_bind.claim_path(namespace, claim)}"))
        except ApiError:
            continue
    return describe(pod, events, scheduler_name=scheduler_name, owner_objects=found, claims=claims)
