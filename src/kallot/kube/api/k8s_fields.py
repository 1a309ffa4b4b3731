"""Pod and node fields kube-scheduler reads beyond resources -> ``core.k8s`` types.

Called by ``translate.pod_to_task`` / ``translate.node_info`` (and by the cache for pods of
other schedulers, whose labels, anti-affinity and host ports constrain kallot's pods): pod
tolerations, node affinity (required and preferred), inter-pod affinity and anti-affinity,
topology spread constraints, host ports, PVC names and the nominated node; node taints,
``spec.unschedulable`` and allocatable of resources the core does not otherwise model.
The API server has validated these objects; a malformed one (a hand-made object, an operator
this version does not know) raises ``ConfigError`` naming the field, so the pod gets an Event
and stays pending instead of being placed on rules kallot did not understand.
Documented in docs/pod-api.md ("Kubernetes constraints").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from kallot.config import wire
from kallot.core import k8s
from kallot.core.dra.pod import PodClaimRef
from kallot.core.errors import ConfigError

# Set by the API server on every namespace (1.21+): lets a namespaceSelector be evaluated even
# when the scheduler does not know a namespace's other labels.
LABEL_NAMESPACE_NAME = "kubernetes.io/metadata.name"

_NODE_OPS = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})
_LABEL_OPS = frozenset({"In", "NotIn", "Exists", "DoesNotExist"})

# Resources handled elsewhere (NodeResourcesFit, DeviceFit, MigFit) or not at all by
# kube-scheduler's fit check (hugepages are, and are kept here as scalars).
_MODELLED = ("cpu", "memory", "pods")
_GPU_PREFIXES = (wire.RESOURCE_GPU, wire.RESOURCE_MIG_PREFIX, wire.KALLOT_PREFIX)


def _requirement(expr: Mapping[str, Any], where: str, ops: frozenset[str]) -> k8s.Requirement:
    op = str(expr.get("operator", ""))
    if op not in ops:
        raise ConfigError(f"{where}.operator", op, f"one of {', '.join(sorted(ops))}")
    values = tuple(str(v) for v in (expr.get("values") or []))
    return k8s.Requirement(key=str(expr.get("key", "")), operator=op, values=values)


def label_selector(obj: Mapping[str, Any] | None, where: str) -> k8s.LabelSelector | None:
    """A metav1.LabelSelector; None when absent (matches nothing), empty matches everything."""
    if obj is None:
        return None
    reqs = [
        k8s.Requirement(key=str(k), operator="In", values=(str(v),))
        for k, v in sorted((obj.get("matchLabels") or {}).items())
    ]
    for j, expr in enumerate(obj.get("matchExpressions") or []):
        reqs.append(_requirement(expr, f"{where}.matchExpressions[{j}]", _LABEL_OPS))
    return k8s.LabelSelector(tuple(reqs))


def _term(obj: Mapping[str, Any], where: str) -> k8s.NodeSelectorTerm:
    exprs = tuple(
        _requirement(e, f"{where}.matchExpressions[{j}]", _NODE_OPS)
        for j, e in enumerate(obj.get("matchExpressions") or [])
    )
    fields = []
    for j, e in enumerate(obj.get("matchFields") or []):
        if e.get("key") != k8s.FIELD_NODE_NAME:
            raise ConfigError(f"{where}.matchFields[{j}].key", e.get("key"), "metadata.name")
        fields.append(_requirement(e, f"{where}.matchFields[{j}]", frozenset({"In", "NotIn"})))
    return k8s.NodeSelectorTerm(expressions=exprs, fields=tuple(fields))


def node_selector(obj: Mapping[str, Any] | None, where: str) -> k8s.NodeSelector | None:
    """A v1.NodeSelector (nodeSelectorTerms ORed), or None when absent."""
    if obj is None:
        return None
    terms = obj.get("nodeSelectorTerms") or []
    return k8s.NodeSelector(
        tuple(_term(t or {}, f"{where}.nodeSelectorTerms[{i}]") for i, t in enumerate(terms))
    )


def _merge_label_keys(
    selector: k8s.LabelSelector | None,
    labels: Mapping[str, str],
    match_keys: Sequence[str],
    mismatch_keys: Sequence[str] = (),
) -> k8s.LabelSelector | None:
    """matchLabelKeys / mismatchLabelKeys: the pod's own values ANDed into the selector (keys
    the pod lacks are ignored, as in kube-scheduler)."""
    extra = [
        k8s.Requirement(key=k, operator="In", values=(labels[k],))
        for k in match_keys
        if k in labels
    ]
    extra += [
        k8s.Requirement(key=k, operator="NotIn", values=(labels[k],))
        for k in mismatch_keys
        if k in labels
    ]
    if not extra or selector is None:
        return selector
    return k8s.LabelSelector((*selector.requirements, *extra))


def _pod_term(obj: Mapping[str, Any], where: str, labels: Mapping[str, str]) -> k8s.PodAffinityTerm:
    key = str(obj.get("topologyKey") or "")
    if not key:
        raise ConfigError(
            f"{where}.topologyKey", key, "a node label key such as kubernetes.io/hostname"
        )
    selector = label_selector(obj.get("labelSelector"), f"{where}.labelSelector")
    selector = _merge_label_keys(
        selector,
        labels,
        [str(k) for k in obj.get("matchLabelKeys") or []],
        [str(k) for k in obj.get("mismatchLabelKeys") or []],
    )
    ns_sel = obj.get("namespaceSelector")
    return k8s.PodAffinityTerm(
        selector=selector,
        topology_key=key,
        namespaces=frozenset(str(n) for n in obj.get("namespaces") or []),
        namespace_selector=label_selector(ns_sel, f"{where}.namespaceSelector")
        if ns_sel is not None
        else None,
    )


def _pod_terms(
    block: Mapping[str, Any], where: str, labels: Mapping[str, str]
) -> tuple[tuple[k8s.PodAffinityTerm, ...], tuple[k8s.WeightedPodTerm, ...]]:
    req_key = "requiredDuringSchedulingIgnoredDuringExecution"
    pref_key = "preferredDuringSchedulingIgnoredDuringExecution"
    required = tuple(
        _pod_term(t or {}, f"{where}.{req_key}[{i}]", labels)
        for i, t in enumerate(block.get(req_key) or [])
    )
    preferred = []
    for i, w in enumerate(block.get(pref_key) or []):
        at = f"{where}.{pref_key}[{i}]"
        weight = w.get("weight", 0)
        if not isinstance(weight, int) or not 1 <= weight <= 100:
            raise ConfigError(f"{at}.weight", weight, "an integer 1..100")
        preferred.append(
            k8s.WeightedPodTerm(
                weight, _pod_term(w.get("podAffinityTerm") or {}, f"{at}.podAffinityTerm", labels)
            )
        )
    return required, tuple(preferred)


def _tolerations(spec: Mapping[str, Any]) -> tuple[k8s.Toleration, ...]:
    out = []
    for i, t in enumerate(spec.get("tolerations") or []):
        op = str(t.get("operator") or "Equal")
        if op not in ("Equal", "Exists"):
            raise ConfigError(f"spec.tolerations[{i}].operator", op, "Equal or Exists")
        out.append(
            k8s.Toleration(
                key=str(t.get("key") or ""),
                operator=op,
                value=str(t.get("value") or ""),
                effect=str(t.get("effect") or ""),
            )
        )
    return tuple(out)


def _spread(spec: Mapping[str, Any], labels: Mapping[str, str]) -> tuple[k8s.SpreadConstraint, ...]:
    out = []
    for i, c in enumerate(spec.get("topologySpreadConstraints") or []):
        where = f"spec.topologySpreadConstraints[{i}]"
        skew = c.get("maxSkew")
        if not isinstance(skew, int) or skew < 1:
            raise ConfigError(f"{where}.maxSkew", skew, "an integer >= 1")
        when = str(c.get("whenUnsatisfiable") or "")
        if when not in (k8s.Unsatisfiable.DO_NOT_SCHEDULE, k8s.Unsatisfiable.SCHEDULE_ANYWAY):
            raise ConfigError(f"{where}.whenUnsatisfiable", when, "DoNotSchedule or ScheduleAnyway")
        min_domains = c.get("minDomains")
        if min_domains is not None and (not isinstance(min_domains, int) or min_domains < 1):
            raise ConfigError(f"{where}.minDomains", min_domains, "an integer >= 1")
        policies = {}
        for name, default in (("nodeAffinityPolicy", "Honor"), ("nodeTaintsPolicy", "Ignore")):
            value = str(c.get(name) or default)
            if value not in ("Honor", "Ignore"):
                raise ConfigError(f"{where}.{name}", value, "Honor or Ignore")
            policies[name] = value == "Honor"
        key = str(c.get("topologyKey") or "")
        if not key:
            raise ConfigError(f"{where}.topologyKey", key, "a node label key")
        selector = label_selector(c.get("labelSelector"), f"{where}.labelSelector")
        selector = _merge_label_keys(
            selector, labels, [str(k) for k in c.get("matchLabelKeys") or []]
        )
        out.append(
            k8s.SpreadConstraint(
                max_skew=skew,
                topology_key=key,
                when_unsatisfiable=when,
                selector=selector,
                # minDomains only applies to DoNotSchedule (the API refuses it otherwise).
                min_domains=min_domains or 1,
                honor_node_affinity=policies["nodeAffinityPolicy"],
                honor_node_taints=policies["nodeTaintsPolicy"],
            )
        )
    return tuple(out)


def _host_ports(spec: Mapping[str, Any]) -> tuple[k8s.HostPort, ...]:
    out = []
    for kind in ("initContainers", "containers"):
        for c in spec.get(kind) or []:
            if kind == "initContainers" and c.get("restartPolicy") != "Always":
                continue  # kube-scheduler counts ports of containers and sidecars
            for p in c.get("ports") or []:
                port = p.get("hostPort") or 0
                if isinstance(port, int) and port > 0:
                    out.append(
                        k8s.HostPort(
                            port=port,
                            protocol=str(p.get("protocol") or "TCP"),
                            host_ip=str(p.get("hostIP") or "0.0.0.0"),
                        )
                    )
    return tuple(out)


def _claims(spec: Mapping[str, Any], pod_name: str) -> tuple[str, ...]:
    out = []
    for v in spec.get("volumes") or []:
        pvc = v.get("persistentVolumeClaim")
        if pvc and pvc.get("claimName"):
            out.append(str(pvc["claimName"]))
        elif v.get("ephemeral"):
            out.append(f"{pod_name}-{v.get('name', '')}")  # the generic ephemeral volume's PVC
    return tuple(out)


def resource_claims(pod: Mapping[str, Any]) -> tuple[PodClaimRef, ...]:
    """``spec.resourceClaims`` with the names of claims generated from templates
    (``status.resourceClaimStatuses``, written by the resourceclaim controller)."""
    spec = pod.get("spec") or {}
    entries = spec.get("resourceClaims") or []
    if not entries:
        return ()
    generated = {
        str(s.get("name", "")): str(s.get("resourceClaimName") or "")
        for s in ((pod.get("status") or {}).get("resourceClaimStatuses") or [])
    }
    out = []
    for i, entry in enumerate(entries):
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"spec.resourceClaims[{i}].name", name, "a non-empty string")
        direct = entry.get("resourceClaimName")
        template = entry.get("resourceClaimTemplateName")
        if bool(direct) == bool(template):
            raise ConfigError(
                f"spec.resourceClaims[{i}]",
                entry,
                "exactly one of resourceClaimName, resourceClaimTemplateName",
            )
        if direct:
            out.append(PodClaimRef(name, str(direct)))
        else:
            out.append(PodClaimRef(name, generated.get(name, ""), str(template)))
    return tuple(out)


def scalar_amounts(amounts: Mapping[str, Decimal]) -> dict[str, int]:
    """Requests of resources not modelled elsewhere (ephemeral-storage, hugepages, extended
    resources other than GPUs), rounded up to integers (bytes or counts)."""
    return {
        name: math.ceil(amount)
        for name, amount in amounts.items()
        if name not in _MODELLED and not name.startswith(_GPU_PREFIXES) and amount > 0
    }


def pod_info(
    pod: Mapping[str, Any],
    amounts: Mapping[str, Decimal] | None = None,
    namespace_labels: Mapping[str, str] | None = None,
    *,
    container_requests: tuple[tuple[str, Mapping[str, int]], ...] = (),
) -> k8s.PodInfo:
    """The core's PodInfo for a pod; ConfigError names the first field kallot cannot honour.
    ``amounts`` are the pod's summed requests (translate.pod_resources), for the scalars."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    namespace = str(meta.get("namespace", ""))
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    ns_labels = dict(namespace_labels or {})
    ns_labels.setdefault(LABEL_NAMESPACE_NAME, namespace)
    affinity = spec.get("affinity") or {}
    node_aff = affinity.get("nodeAffinity") or {}
    where = "spec.affinity.nodeAffinity"
    required = node_selector(
        node_aff.get("requiredDuringSchedulingIgnoredDuringExecution"),
        f"{where}.requiredDuringSchedulingIgnoredDuringExecution",
    )
    preferred = []
    for i, p in enumerate(node_aff.get("preferredDuringSchedulingIgnoredDuringExecution") or []):
        at = f"{where}.preferredDuringSchedulingIgnoredDuringExecution[{i}]"
        weight = p.get("weight", 0)
        if not isinstance(weight, int) or not 1 <= weight <= 100:
            raise ConfigError(f"{at}.weight", weight, "an integer 1..100")
        preferred.append(
            k8s.PreferredTerm(weight, _term(p.get("preference") or {}, f"{at}.preference"))
        )
    aff, pref_aff = _pod_terms(
        affinity.get("podAffinity") or {}, "spec.affinity.podAffinity", labels
    )
    anti, pref_anti = _pod_terms(
        affinity.get("podAntiAffinity") or {}, "spec.affinity.podAntiAffinity", labels
    )
    return k8s.PodInfo(
        namespace=namespace,
        labels=labels,
        namespace_labels=ns_labels,
        tolerations=_tolerations(spec),
        required_nodes=required,
        preferred_nodes=tuple(preferred),
        affinity=aff,
        anti_affinity=anti,
        preferred_affinity=pref_aff,
        preferred_anti_affinity=pref_anti,
        spread=_spread(spec, labels),
        host_ports=_host_ports(spec),
        claims=_claims(spec, str(meta.get("name", ""))),
        resource_claims=resource_claims(pod),
        nominated_node=str(status.get("nominatedNodeName") or ""),
        scalars=scalar_amounts(amounts or {}),
        terminating=bool(meta.get("deletionTimestamp")),
        container_requests=container_requests,
    )


def node_taints(node: Mapping[str, Any]) -> tuple[k8s.Taint, ...]:
    return tuple(
        k8s.Taint(
            key=str(t.get("key", "")),
            value=str(t.get("value") or ""),
            effect=str(t.get("effect") or ""),
        )
        for t in (node.get("spec") or {}).get("taints") or []
    )


def node_scalars(alloc: Mapping[str, Any], parse: Any) -> dict[str, int]:
    """Allocatable of resources not modelled elsewhere (``parse`` is translate.parse_quantity)."""
    out = {}
    for name, raw in alloc.items():
        if name in _MODELLED or name.startswith(_GPU_PREFIXES):
            continue
        try:
            out[str(name)] = math.floor(parse(raw, f"status.allocatable[{name}]"))
        except ConfigError:
            out[str(name)] = 0
    return out
