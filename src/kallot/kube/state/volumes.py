"""PersistentVolumeClaims, PersistentVolumes and StorageClasses -> where a pod's volumes let it
run (``core.k8s.VolumeConstraint``), after kube-scheduler's VolumeBinding and VolumeZone.

The cache feeds ``VolumeIndex`` from three reflectors and resolves each pending pod's claims
at every session (claims bind and PVs appear while pods wait):

- a claim that does not exist, or is being deleted: the pod fits nowhere;
- a bound claim (``spec.volumeName`` and ``pv.kubernetes.io/bind-completed``): the PV's
  ``spec.nodeAffinity.required`` and its zone/region labels (VolumeZone: a node with none of
  those labels passes);
- an unbound claim of a ``WaitForFirstConsumer`` StorageClass: a node where an available PV of
  the class fits the claim (capacity, access modes, volume mode, selector, node affinity), or,
  when the class provisions dynamically, a node in its ``allowedTopologies``; the binder then
  writes ``volume.kubernetes.io/selected-node`` on the claim (or the PV's ``claimRef`` for a
  static PV) before binding the pod, as kube-scheduler's VolumeBinding PreBind does
  (``kube.bind.volumes``);
- any other unbound claim (Immediate binding): the pod fits nowhere until it binds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from kallot.core import k8s
from kallot.core.errors import ConfigError
from kallot.kube.api.k8s_fields import label_selector, node_selector
from kallot.kube.translate import parse_quantity

ANN_SELECTED_NODE = "volume.kubernetes.io/selected-node"
ANN_BIND_COMPLETED = "pv.kubernetes.io/bind-completed"
NO_PROVISIONER = "kubernetes.io/no-provisioner"
WAIT_FOR_FIRST_CONSUMER = "WaitForFirstConsumer"
# VolumeZone's keys (GA and the deprecated beta names a PV may still carry).
ZONE_LABELS = (
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
)
_GA = {
    "failure-domain.beta.kubernetes.io/zone": "topology.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region": "topology.kubernetes.io/region",
}


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


def _storage(obj: Mapping[str, Any], path: tuple[str, ...]) -> Decimal:
    cur: Any = obj
    for p in path:
        cur = (cur or {}).get(p)
    if cur is None:
        return Decimal(0)
    try:
        return parse_quantity(cur, ".".join(path))
    except ConfigError:
        return Decimal(0)


def _pv_selector(pv: Mapping[str, Any]) -> k8s.NodeSelector | None:
    required = ((pv.get("spec") or {}).get("nodeAffinity") or {}).get("required")
    try:
        return node_selector(required, f"PersistentVolume {_name(pv)}: spec.nodeAffinity.required")
    except ConfigError:
        return k8s.NodeSelector(())  # an affinity kallot cannot read: no node qualifies


def _zone_selectors(pv: Mapping[str, Any]) -> list[k8s.NodeSelector]:
    labels = (pv.get("metadata") or {}).get("labels") or {}
    out = []
    none = k8s.NodeSelectorTerm(
        expressions=tuple(k8s.Requirement(k, "DoesNotExist") for k in ZONE_LABELS)
    )
    for key in ZONE_LABELS:
        if key in labels:
            values = tuple(str(labels[key]).split("__"))
            terms = [k8s.NodeSelectorTerm(expressions=(k8s.Requirement(key, "In", values),))]
            if key in _GA:
                terms.append(
                    k8s.NodeSelectorTerm(
                        expressions=(
                            k8s.Requirement(key, "DoesNotExist"),
                            k8s.Requirement(_GA[key], "In", values),
                        )
                    )
                )
            out.append(k8s.NodeSelector((*terms, none)))
    return out


def _allowed_topologies(sc: Mapping[str, Any]) -> k8s.NodeSelector | None:
    terms = []
    for t in sc.get("allowedTopologies") or []:
        exprs = tuple(
            k8s.Requirement(
                str(e.get("key", "")), "In", tuple(str(v) for v in e.get("values") or [])
            )
            for e in t.get("matchLabelExpressions") or []
        )
        terms.append(k8s.NodeSelectorTerm(expressions=exprs))
    return k8s.NodeSelector(tuple(terms)) if terms else None


@dataclass(frozen=True, slots=True)
class StaticMatch:
    """An available PV that can serve a WaitForFirstConsumer claim, and where."""

    pv: str
    nodes: k8s.NodeSelector | None  # None: any node


class VolumeIndex:
    """The cluster's claims, volumes and classes, as the reflectors last saw them."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], Mapping[str, Any]] = {}
        self.volumes: dict[str, Mapping[str, Any]] = {}
        self.classes: dict[str, Mapping[str, Any]] = {}
        #: increases on every change (pending pods with claims are retried)
        self.generation = 0

    # -- reflector callbacks --------------------------------------------------------------

    def apply_claim(self, event: str, obj: Mapping[str, Any]) -> None:
        self._apply(self.claims, _key(obj), event, obj)

    def apply_volume(self, event: str, obj: Mapping[str, Any]) -> None:
        self._apply(self.volumes, _name(obj), event, obj)

    def apply_class(self, event: str, obj: Mapping[str, Any]) -> None:
        self._apply(self.classes, _name(obj), event, obj)

    def replace_claims(self, items: Iterable[Mapping[str, Any]]) -> None:
        self.claims = {_key(o): o for o in items}
        self.generation += 1

    def replace_volumes(self, items: Iterable[Mapping[str, Any]]) -> None:
        self.volumes = {_name(o): o for o in items}
        self.generation += 1

    def replace_classes(self, items: Iterable[Mapping[str, Any]]) -> None:
        self.classes = {_name(o): o for o in items}
        self.generation += 1

    def _apply(self, store: dict[Any, Any], key: Any, event: str, obj: Mapping[str, Any]) -> None:
        if event == "DELETED":
            store.pop(key, None)
        else:
            store[key] = obj
        self.generation += 1

    # -- resolution -----------------------------------------------------------------------

    def static_matches(self, claim: Mapping[str, Any]) -> list[StaticMatch]:
        """Available PVs of the claim's class that fit it (kube's findMatchingVolume rules)."""
        ns, name = _key(claim)
        spec = claim.get("spec") or {}
        cls = str(spec.get("storageClassName") or "")
        want = _storage(claim, ("spec", "resources", "requests", "storage"))
        modes = set(spec.get("accessModes") or [])
        mode = spec.get("volumeMode") or "Filesystem"
        try:
            selector = label_selector(spec.get("selector"), "spec.selector")
        except ConfigError:
            return []
        out = []
        for pv_name, pv in sorted(self.volumes.items()):
            pv_spec = pv.get("spec") or {}
            ref = pv_spec.get("claimRef")
            if ref and (ref.get("namespace"), ref.get("name")) != (ns, name):
                continue
            if (pv.get("metadata") or {}).get("deletionTimestamp"):
                continue
            if str(pv_spec.get("storageClassName") or "") != cls:
                continue
            if (pv.get("status") or {}).get("phase") not in (None, "Available", "Pending"):
                continue
            if _storage(pv, ("spec", "capacity", "storage")) < want:
                continue
            if not modes <= set(pv_spec.get("accessModes") or []):
                continue
            if (pv_spec.get("volumeMode") or "Filesystem") != mode:
                continue
            labels = (pv.get("metadata") or {}).get("labels") or {}
            if spec.get("selector") is not None and not k8s.selector_matches(selector, labels):
                continue
            out.append(StaticMatch(pv=pv_name, nodes=_pv_selector(pv)))
        return out

    def resolve(self, namespace: str, claims: Iterable[str]) -> k8s.VolumeConstraint:
        nodes: list[k8s.NodeSelector] = []
        provision: list[tuple[str, k8s.NodeSelector | None]] = []
        for claim_name in claims:
            claim = self.claims.get((namespace, claim_name))
            if claim is None:
                return k8s.VolumeConstraint(error=f'persistentvolumeclaim "{claim_name}" not found')
            if (claim.get("metadata") or {}).get("deletionTimestamp"):
                return k8s.VolumeConstraint(
                    error=f'persistentvolumeclaim "{claim_name}" is being deleted'
                )
            spec = claim.get("spec") or {}
            ann = (claim.get("metadata") or {}).get("annotations") or {}
            volume = str(spec.get("volumeName") or "")
            if volume and ANN_BIND_COMPLETED in ann:
                pv = self.volumes.get(volume)
                if pv is None:
                    return k8s.VolumeConstraint(
                        error=f'persistentvolumeclaim "{claim_name}" bound to non-existent '
                        f'persistentvolume "{volume}"'
                    )
                selector = _pv_selector(pv)
                if selector is not None:
                    nodes.append(selector)
                nodes.extend(_zone_selectors(pv))
                continue
            cls = self.classes.get(str(spec.get("storageClassName") or ""))
            wffc = cls is not None and cls.get("volumeBindingMode") == WAIT_FOR_FIRST_CONSUMER
            if volume or not wffc:
                return k8s.VolumeConstraint(
                    error="pod has unbound immediate PersistentVolumeClaims"
                )
            assert cls is not None
            options: list[k8s.NodeSelectorTerm] = []
            anywhere = False
            for m in self.static_matches(claim):
                if m.nodes is None:
                    anywhere = True
                else:
                    options.extend(m.nodes.terms)
            if str(cls.get("provisioner") or "") != NO_PROVISIONER:
                allowed = _allowed_topologies(cls)
                if allowed is None:
                    anywhere = True
                else:
                    options.extend(allowed.terms)
            where = None if anywhere else k8s.NodeSelector(tuple(options))
            if where is not None:
                nodes.append(where)
            provision.append((claim_name, where))
        return k8s.VolumeConstraint(nodes=tuple(nodes), provision=tuple(provision))

    def claim(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.claims.get((namespace, name))
