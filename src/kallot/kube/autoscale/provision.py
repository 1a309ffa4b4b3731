"""Asking for the capacity a scale-up plan needs: ProvisioningRequests for gangs, placeholder pods
for Karpenter (``autoscale.provisioner`` in the scheduler configuration, docs/autoscaling.md).

Where it sits: the kube shell, after a session. The pods a session left unschedulable go to
the core's planner (``core.provision.plan``); this module turns its ``Plan`` into API objects:

- ``provisioningRequest``: per gang, one ``autoscaling.x-k8s.io/v1`` ``ProvisioningRequest``
  of class ``best-effort-atomic-scale-up.autoscaling.x-k8s.io`` (all or nothing, what
  cluster-autoscaler and Kueue implement) with one ``podSet`` per planned node: a
  ``PodTemplate`` whose requests are a whole node of the planned shape (its GPUs as
  ``nvidia.com/gpu``, which the autoscaler's simulation of kube-scheduler understands) pinned by
  the shape's labels. The autoscaler then adds exactly the nodes kallot planned, whatever
  kallot's shares look like to it. ``state`` reads the documented conditions (``Provisioned``,
  ``Failed``, ``CapacityRevoked``, ``BookingExpired``); ``consume_annotations`` are what the
  gang's pods carry so the autoscaler counts them against the request.
- ``karpenter``: one placeholder pod per planned node (lowest priority, so any real pod preempts
  it; scheduled by kube-scheduler, which Karpenter simulates) asking for the whole node of the
  shape; Karpenter provisions for it, kallot's pods then bind to the new node (its sessions see
  it like any node), and the placeholder is deleted once it is bound there.

The loop that decides when to ask, and cleans up after, is ``kube.autoscale.scaleup``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from kallot.config import wire
from kallot.core.provision.plan import Plan, PlannedNode
from kallot.core.provision.shapes import NodeShape
from kallot.kube.api.client import KubeClient

GROUP = "autoscaling.x-k8s.io"
VERSION = "v1"
PLURAL = "provisioningrequests"
ATOMIC = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
CONSUME = f"{GROUP}/consume-provisioning-request"
CLASS = f"{GROUP}/provisioning-class-name"
GPU = "nvidia.com/gpu"
PLACEHOLDER_LABEL = "kallot.io/capacity-for"
PLACEHOLDER_PRIORITY_CLASS = "kallot-capacity-placeholder"
PLACEHOLDER_PODS = "kallot.io/capacity-pods"  # the uids of the pods a placeholder asks for
PLACEHOLDER_SHAPE = "kallot.io/capacity-shape"
PAUSE = "registry.k8s.io/pause:3.10"
CONDITIONS = ("Provisioned", "Failed", "CapacityRevoked", "BookingExpired")


def _name(prefix: str, key: str) -> str:
    return f"{prefix}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def label_value(text: str) -> str:
    """``text`` as a label value (at most 63 of ``[A-Za-z0-9._-]``, alphanumeric at both ends):
    a gang's id is ``namespace/name``, which a label may not hold as it is."""
    out = re.sub(r"[^A-Za-z0-9._-]", ".", text)[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", out)


def node_pod_spec(shape: NodeShape) -> dict[str, Any]:
    """A pod spec that takes one whole node of ``shape`` (its GPUs as ``nvidia.com/gpu``, most
    of its CPU and memory) and lands only on such a node (the shape's labels as selector, its
    taints tolerated)."""
    requests: dict[str, str] = {
        "cpu": f"{max(1, shape.cpu_milli * 9 // 10)}m",
        "memory": f"{max(1, shape.mem_mib * 9 // 10)}Mi",
    }
    # An extended resource needs requests == limits; a PodTemplate gets no defaulting, so both.
    limits = {GPU: str(shape.gpus)} if shape.gpus else {}
    requests.update(limits)
    return {
        "nodeSelector": dict(shape.labels),
        "tolerations": [
            {"key": t.key, "operator": "Equal", "value": t.value, "effect": t.effect}
            for t in shape.taints
        ],
        "containers": [
            {
                "name": "capacity",
                "image": PAUSE,
                "resources": {"requests": requests, "limits": limits},
            }
        ],
        "terminationGracePeriodSeconds": 0,
    }


def provisioning_request(
    namespace: str, gang: str, nodes: Sequence[PlannedNode], shapes: Mapping[str, NodeShape]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The PodTemplates and the ProvisioningRequest that ask, all or nothing, for the planned
    ``nodes`` of gang ``gang`` (one podSet per shape, ``count`` its nodes)."""
    by_shape: dict[str, int] = {}
    for n in nodes:
        by_shape[n.shape] = by_shape.get(n.shape, 0) + 1
    pr_name = _name("kallot", f"{namespace}/{gang}")
    templates = []
    pod_sets = []
    for shape_name, count in sorted(by_shape.items()):
        tname = _name(f"{pr_name}-{shape_name}"[:40], shape_name)
        templates.append(
            {
                "apiVersion": "v1",
                "kind": "PodTemplate",
                "metadata": {
                    "name": tname,
                    "namespace": namespace,
                    "labels": {PLACEHOLDER_LABEL: label_value(gang)},
                },
                "template": {"spec": node_pod_spec(shapes[shape_name])},
            }
        )
        pod_sets.append({"podTemplateRef": {"name": tname}, "count": count})
    pr = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ProvisioningRequest",
        "metadata": {
            "name": pr_name,
            "namespace": namespace,
            "labels": {PLACEHOLDER_LABEL: label_value(gang)},
            "annotations": {PLACEHOLDER_PODS: ",".join(t for n in nodes for t in n.tasks)},
        },
        "spec": {"provisioningClassName": ATOMIC, "podSets": pod_sets},
    }
    return templates, pr


def consume_annotations(pr: Mapping[str, Any]) -> dict[str, str]:
    """What each pod of the gang carries so the autoscaler counts it against ``pr``."""
    return {CONSUME: str(pr["metadata"]["name"]), CLASS: str(pr["spec"]["provisioningClassName"])}


def state(pr: Mapping[str, Any]) -> str:
    """The request's state from its status conditions: the last true one of ``CONDITIONS``
    in the documented order of severity (``Failed``, ``CapacityRevoked``, ``BookingExpired``
    win over ``Provisioned``), ``Accepted``, else ``Pending``."""
    conds = {
        c.get("type"): c.get("status") for c in ((pr.get("status") or {}).get("conditions") or [])
    }
    for t in ("Failed", "CapacityRevoked", "BookingExpired", "Provisioned", "Accepted"):
        if conds.get(t) == "True":
            return t
    return "Pending"


def placeholder(namespace: str, node: PlannedNode, shape: NodeShape) -> dict[str, Any]:
    """The Karpenter placeholder pod for one planned node (module docstring). It requires
    ``kallot.io/capacity-taken`` absent: the scale-up loop sets that label on the nodes that hold
    kallot's pods or were handed to an ask, which the placeholder may not land on (kube-scheduler
    counts only ``nvidia.com/gpu``, so a node full of kallot's shares looks free to it). A label,
    not ``kubernetes.io/hostname NotIn``: Karpenter ignores pods whose node affinity names the
    hostname ("might interfere with the internal provisioning logic"), and it treats a
    ``DoesNotExist`` on a label its NodePool does not define as met by a new node. Its
    ``kallot.io/capacity-pods`` annotation names the pods it asks for (a restarted scheduler
    adopts it from there)."""
    spec: dict[str, Any] = {**node_pod_spec(shape), "priorityClassName": PLACEHOLDER_PRIORITY_CLASS}
    term = {"key": wire.LABEL_CAPACITY_TAKEN, "operator": "DoesNotExist"}
    spec["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [term]}]
            }
        }
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": _name("kallot-capacity", f"{namespace}/{node.name}/{','.join(node.tasks)}"),
            "namespace": namespace,
            "labels": {PLACEHOLDER_LABEL: label_value(node.name)},
            "annotations": {PLACEHOLDER_PODS: ",".join(node.tasks), PLACEHOLDER_SHAPE: shape.name},
        },
        "spec": spec,
    }


async def ask(
    client: KubeClient,
    namespace: str,
    plan: Plan,
    shapes: Mapping[str, NodeShape],
    gangs: Mapping[str, Sequence[str]],
    *,
    provisioner: str,
) -> list[dict[str, Any]]:
    """Create what ``provisioner`` needs for ``plan`` (``gangs``: gang -> its task ids; its
    nodes go in one ProvisioningRequest under ``provisioningRequest``); returns the objects."""
    made: list[dict[str, Any]] = []
    gang_of = {t: g for g, ids in gangs.items() for t in ids}
    rest: list[PlannedNode] = []
    by_gang: dict[str, list[PlannedNode]] = {}
    for n in plan.nodes:
        g = next((gang_of[t] for t in n.tasks if t in gang_of), "")
        if provisioner == "provisioningRequest" and g:
            by_gang.setdefault(g, []).append(n)
        else:
            rest.append(n)
    for g, nodes in sorted(by_gang.items()):
        templates, pr = provisioning_request(namespace, g, nodes, shapes)
        for t in templates:
            made.append(await client.create(f"/api/v1/namespaces/{namespace}/podtemplates", t))
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}"
        made.append(await client.create(path, pr))
    for n in rest:
        body = placeholder(namespace, n, shapes[n.shape])
        made.append(await client.create(f"/api/v1/namespaces/{namespace}/pods", body))
    return made
