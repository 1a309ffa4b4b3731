"""Plain Kubernetes objects (dicts) for tests of kallot's Kubernetes semantics, and an
in-process kallot decision over them.

``node_obj`` / ``pod_obj`` build Node and Pod bodies as the API server stores them (and as the
conformance suite creates them on a real control plane); ``kallot_decide`` runs them through
the live scheduler's own path (``kube.state.cache.Cache`` -> ``session_input`` -> the core's
Framework) without a binder, and says where each pending pod would go.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from kallot.config import presets
from kallot.core import policies
from kallot.core.decision import Placement
from kallot.core.framework.runner import Framework
from kallot.core.session.session import Session
from kallot.core.status import Diagnosis
from kallot.kube.state.cache import Cache
from kallot.kube.translate import SCHEDULER_NAME


def node_obj(
    name: str,
    *,
    cpu: str = "4",
    memory: str = "8Gi",
    pods: int = 110,
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, str]] = (),
    unschedulable: bool = False,
    extra: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    alloc = {"cpu": cpu, "memory": memory, "pods": str(pods), **(extra or {})}
    spec: dict[str, Any] = {}
    if taints:
        spec["taints"] = [dict(t) for t in taints]
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, **(labels or {})},
        },
        "spec": spec,
        "status": {
            "capacity": dict(alloc),
            "allocatable": dict(alloc),
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    }


def pod_obj(
    name: str,
    *,
    namespace: str = "default",
    cpu: str = "100m",
    memory: str = "64Mi",
    labels: Mapping[str, str] | None = None,
    scheduler: str = SCHEDULER_NAME,
    node: str = "",
    tolerations: Sequence[Mapping[str, Any]] = (),
    affinity: Mapping[str, Any] | None = None,
    node_selector: Mapping[str, str] | None = None,
    spread: Sequence[Mapping[str, Any]] = (),
    host_ports: Sequence[Mapping[str, Any]] = (),
    claims: Sequence[str] = (),
    uid: str = "",
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": "registry.k8s.io/pause:3.10",
        "resources": {"requests": {"cpu": cpu, "memory": memory}},
    }
    if host_ports:
        container["ports"] = [{"containerPort": int(p["hostPort"]), **dict(p)} for p in host_ports]
    spec: dict[str, Any] = {"schedulerName": scheduler, "containers": [container]}
    if node:
        spec["nodeName"] = node
    if tolerations:
        spec["tolerations"] = [dict(t) for t in tolerations]
    if affinity:
        spec["affinity"] = dict(affinity)
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if spread:
        spec["topologySpreadConstraints"] = [dict(c) for c in spread]
    if claims:
        spec["volumes"] = [
            {"name": f"v{i}", "persistentVolumeClaim": {"claimName": c}}
            for i, c in enumerate(claims)
        ]
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels or {})}
    if uid:
        meta["uid"] = uid
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def kallot_decide(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    *,
    claims: Iterable[Mapping[str, Any]] = (),
    volumes: Iterable[Mapping[str, Any]] = (),
    classes: Iterable[Mapping[str, Any]] = (),
    namespaces: Iterable[Mapping[str, Any]] = (),
    policy: str = "kallot",
    seed: int = 0,
) -> dict[str, str | Diagnosis]:
    """Where one kallot session puts each pending kallot pod (pod name -> node name, or the
    Diagnosis when it fits nowhere); bound pods (``spec.nodeName``) of any scheduler count."""
    cache = Cache()
    cache.replace_nodes(nodes)
    cache.replace_claims(claims)
    cache.replace_volumes(volumes)
    cache.replace_storage_classes(classes)
    cache.replace_namespaces(namespaces)
    objs = list(pods)
    for i, p in enumerate(objs):
        meta = p.setdefault("metadata", {})  # type: ignore[attr-defined]
        meta.setdefault("uid", f"uid-{i}-{meta.get('name', '')}")
    cache.replace_pods(objs)
    inp = cache.session_input()
    fw = Framework(presets.profile(policy), policies.builtin_registry())
    session = Session(fw, inp.snapshot, now=0.0, rng=np.random.default_rng(seed), jobs={})
    out: dict[str, str | Diagnosis] = {}
    for task in inp.tasks:
        entry = cache.pod(task.id)
        assert entry is not None
        result = session.place(task)
        out[entry.name] = result.node if isinstance(result, Placement) else result
    for entry in cache.pods():
        if entry.kallot and entry.error is not None:
            out[entry.name] = Diagnosis.of("Invalid", str(entry.error))
    return out
