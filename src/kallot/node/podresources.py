"""What the kubelet actually assigned, from its pod-resources API, checked against the records.

The kubelet's ``PodResourcesLister.List`` (``--pod-resources-socket``) tells which device IDs
each container of each running pod got. ``drift`` compares them, per pod and resource, with
the pod's device record read the same way Allocate reads it (its footprint): a difference means
the kubelet's accounting and the scheduler's choice disagree (a pod admitted while the agent
was away, a record edited by hand), and the agent reports it as a metric and a Warning Event.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from grpc import aio

from kallot.config.inventory import NodeInventory
from kallot.node.allocate import PodRecord, physical, pod_footprint, request_footprint
from kallot.node.proto import podresources_v1_pb2 as pb
from kallot.node.proto import podresources_v1_pb2_grpc as pb_grpc

# (namespace, pod) -> resource -> device IDs over all containers
Assignments = dict[tuple[str, str], dict[str, list[str]]]


# device UUID (a GPU's or a MIG instance's) -> the (namespace, pod, container)s it was assigned to
Holders = dict[str, list[tuple[str, str, str]]]


async def list_pod_resources(
    socket: Path, *, timeout_s: float = 5.0
) -> pb.ListPodResourcesResponse:
    """The kubelet's ``List``: every running container's devices."""
    async with aio.insecure_channel(f"unix://{socket}") as channel:
        stub = pb_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
        resp: pb.ListPodResourcesResponse = await stub.List(
            pb.ListPodResourcesRequest(), timeout=timeout_s
        )
    return resp


def holders_of(resp: pb.ListPodResourcesResponse) -> Holders:
    """Which containers hold each device (the ID's physical UUID: ``GPU-x::7`` -> ``GPU-x``), as
    dcgm-exporter reads the same API to label its series with pod, namespace and container."""
    out: Holders = {}
    for pod in resp.pod_resources:
        for c in pod.containers:
            for d in c.devices:
                for i in d.device_ids:
                    who = (pod.namespace, pod.name, c.name)
                    held = out.setdefault(physical(i), [])
                    if who not in held:
                        held.append(who)
    return out


async def list_assignments(socket: Path, *, timeout_s: float = 5.0) -> Assignments:
    """The device IDs the kubelet assigned, per pod and resource (all containers together)."""
    return assignments_of(await list_pod_resources(socket, timeout_s=timeout_s))


def assignments_of(resp: pb.ListPodResourcesResponse) -> Assignments:
    out: Assignments = {}
    for pod in resp.pod_resources:
        per = out.setdefault((pod.namespace, pod.name), {})
        for c in pod.containers:
            for d in c.devices:
                per.setdefault(d.resource_name, []).extend(d.device_ids)
    return out


@dataclass(frozen=True, slots=True)
class Drift:
    """The kubelet gave ``pod`` other devices of ``resource`` than its record names."""

    namespace: str
    pod: str
    resource: str
    recorded: Mapping[str, int]
    assigned: Mapping[str, int]

    def message(self) -> str:
        def fmt(fp: Mapping[str, int]) -> str:
            return (
                "{" + ", ".join(f"{k}: {v}" for k, v in sorted(fp.items())) + "}"
                if fp
                else "nothing"
            )

        return (
            f"pod {self.namespace}/{self.pod}: the kubelet assigned {fmt(self.assigned)} of "
            f"{self.resource}, its device record names {fmt(self.recorded)}"
        )


def drift(
    assigned: Assignments,
    pods: Sequence[PodRecord],
    inv: NodeInventory,
    resources: Collection[str],
) -> list[Drift]:
    """Pods (with a record, or with devices of ``resources``) whose assignment and record differ."""
    by_key = {(p.namespace, p.name): p for p in pods}
    out = []
    for key in sorted(set(assigned) | {k for k, p in by_key.items() if p.record is not None}):
        if key not in assigned:
            continue  # not running yet (or not on this kubelet): nothing assigned to compare
        pod = by_key.get(key)
        for resource in sorted(resources):
            got: Counter[str] = request_footprint(assigned[key].get(resource, []))
            want: Counter[str] = pod_footprint(resource, pod, inv) if pod else Counter()
            if got != want:
                out.append(Drift(key[0], key[1], resource, dict(want), dict(got)))
    return out
