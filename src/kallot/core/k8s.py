"""Kubernetes pod and node semantics the core honours beyond resources: taints and tolerations,
node affinity, inter-pod affinity, topology spread, host ports and volume topology.

The kube shell (``kube/api/k8s_fields.py``, ``kube/state/volumes.py``) translates pod and node objects
into these frozen types once, at the edge; the ``core/plugins/k8s_*`` filter and score plugins
read them. A Task without ``k8s`` (every simulator task) has none of these fields, and every
plugin passes it through, so simulations decide exactly as before.

Matching rules are kube-scheduler's (k8s.io/component-helpers and the scheduler's framework
types), written out once here: ``Toleration.tolerates`` is ``ToleratesTaint``,
``Requirement.matches`` is a ``labels.Selector`` requirement (``NotIn`` and ``DoesNotExist``
match a missing key), ``NodeSelector`` ORs its terms and an empty term matches nothing,
``LabelSelector`` None matches nothing while an empty one matches everything.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from kallot.core.dra.pod import PodClaimRef, PodClaims

BOOL = NDArray[np.bool_]

# Node conditions kube-scheduler turns into taints, and the taint of a cordoned node.
TAINT_UNSCHEDULABLE = "node.kubernetes.io/unschedulable"
FIELD_NODE_NAME = "metadata.name"


class Effect(enum.StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: str = Effect.NO_SCHEDULE


@dataclass(frozen=True, slots=True)
class Toleration:
    """``operator`` Exists or Equal (empty = Equal); empty ``key`` (with Exists) matches every
    key; empty ``effect`` matches every effect."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        if self.operator in ("", "Equal"):
            return self.value == taint.value
        return False


def tolerated(taint: Taint, tolerations: tuple[Toleration, ...]) -> bool:
    return any(t.tolerates(taint) for t in tolerations)


def untolerated(
    taints: tuple[Taint, ...], tolerations: tuple[Toleration, ...], effects: frozenset[str]
) -> Taint | None:
    """The first taint with one of ``effects`` that no toleration tolerates, or None."""
    for taint in taints:
        if taint.effect in effects and not tolerated(taint, tolerations):
            return taint
    return None


_INTEGER = re.compile(r"[+-]?[0-9]+")

HARD_EFFECTS = frozenset({Effect.NO_SCHEDULE.value, Effect.NO_EXECUTE.value})


@dataclass(frozen=True, slots=True)
class Requirement:
    """``key operator values``: In, NotIn, Exists, DoesNotExist (labels), Gt and Lt (node
    labels holding integers)."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches_value(self, value: str | None) -> bool:
        op = self.operator
        if op == "In":
            return value is not None and value in self.values
        if op == "NotIn":
            return value is None or value not in self.values
        if op == "Exists":
            return value is not None
        if op == "DoesNotExist":
            return value is None
        if op in ("Gt", "Lt"):
            if value is None or len(self.values) != 1:
                return False
            if not (_INTEGER.fullmatch(value) and _INTEGER.fullmatch(self.values[0])):
                return False  # Go's strconv.ParseInt: no spaces, no underscores
            have, bound = int(value), int(self.values[0])
            return have > bound if op == "Gt" else have < bound
        return False

    def matches(self, labels: Mapping[str, str]) -> bool:
        return self.matches_value(labels.get(self.key))


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A ``metav1.LabelSelector``: every requirement holds (matchLabels are In with one value).
    An empty selector matches everything; "no selector" is ``None`` and matches nothing."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)


def selector_matches(selector: LabelSelector | None, labels: Mapping[str, str]) -> bool:
    return selector is not None and selector.matches(labels)


@dataclass(frozen=True, slots=True)
class NodeSelectorTerm:
    """Requirements on node labels and on fields (only ``metadata.name``), ANDed. A term with
    none matches no node."""

    expressions: tuple[Requirement, ...] = ()
    fields: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str], name: str) -> bool:
        if not self.expressions and not self.fields:
            return False
        return all(r.matches(labels) for r in self.expressions) and all(
            r.matches_value(name if r.key == FIELD_NODE_NAME else None) for r in self.fields
        )


@dataclass(frozen=True, slots=True)
class NodeSelector:
    """Terms ORed (required node affinity, a PersistentVolume's node affinity)."""

    terms: tuple[NodeSelectorTerm, ...]

    def matches(self, labels: Mapping[str, str], name: str) -> bool:
        return any(t.matches(labels, name) for t in self.terms)


@dataclass(frozen=True, slots=True)
class PreferredTerm:
    weight: int
    term: NodeSelectorTerm


@dataclass(frozen=True, slots=True)
class PodAffinityTerm:
    """Pods matched by ``selector`` in the term's namespaces, within ``topology_key`` domains.

    The namespaces are ``namespaces`` plus every namespace ``namespace_selector`` matches (None:
    none; empty: all); with neither, the namespace of the pod that carries the term.
    matchLabelKeys / mismatchLabelKeys are already merged into ``selector`` by the shell.
    """

    selector: LabelSelector | None
    topology_key: str
    namespaces: frozenset[str] = frozenset()
    namespace_selector: LabelSelector | None = None

    def matches(self, owner_namespace: str, pod: PodInfo) -> bool:
        if not self.namespaces and self.namespace_selector is None:
            in_ns = pod.namespace == owner_namespace
        else:
            in_ns = pod.namespace in self.namespaces or selector_matches(
                self.namespace_selector, pod.namespace_labels
            )
        return in_ns and selector_matches(self.selector, pod.labels)


@dataclass(frozen=True, slots=True)
class WeightedPodTerm:
    weight: int
    term: PodAffinityTerm


class Unsatisfiable(enum.StrEnum):
    DO_NOT_SCHEDULE = "DoNotSchedule"
    SCHEDULE_ANYWAY = "ScheduleAnyway"


@dataclass(frozen=True, slots=True)
class SpreadConstraint:
    """A topologySpreadConstraint (matchLabelKeys merged into ``selector``)."""

    max_skew: int
    topology_key: str
    when_unsatisfiable: str
    selector: LabelSelector | None
    min_domains: int = 1
    honor_node_affinity: bool = True  # nodeAffinityPolicy: Honor (default) / Ignore
    honor_node_taints: bool = False  # nodeTaintsPolicy: Ignore (default) / Honor

    @property
    def hard(self) -> bool:
        return self.when_unsatisfiable == Unsatisfiable.DO_NOT_SCHEDULE


@dataclass(frozen=True, slots=True)
class HostPort:
    """A container's hostPort: ``host_ip`` "0.0.0.0" means every address."""

    port: int
    protocol: str = "TCP"
    host_ip: str = "0.0.0.0"

    def conflicts(self, other: HostPort) -> bool:
        if self.port != other.port or self.protocol != other.protocol:
            return False
        return "0.0.0.0" in (self.host_ip, other.host_ip) or self.host_ip == other.host_ip


@dataclass(frozen=True, slots=True)
class VolumeConstraint:
    """Where a pod's volumes let it run, resolved by the shell from its PVCs, PVs and
    StorageClasses: every selector in ``nodes`` must match the node; ``error`` (a missing or
    unbound immediate claim) rules out every node."""

    nodes: tuple[NodeSelector, ...] = ()
    error: str = ""
    # A WaitForFirstConsumer claim needing a node: claim name -> the StorageClass's allowed
    # topologies (None: anywhere); the binder writes the chosen node on the claim.
    provision: tuple[tuple[str, NodeSelector | None], ...] = ()


NO_VOLUMES = VolumeConstraint()


@dataclass(frozen=True, slots=True, kw_only=True)
class PodInfo:
    """What kube-scheduler reads from a pod beyond its resource requests."""

    namespace: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    namespace_labels: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    required_nodes: NodeSelector | None = None
    preferred_nodes: tuple[PreferredTerm, ...] = ()
    affinity: tuple[PodAffinityTerm, ...] = ()
    anti_affinity: tuple[PodAffinityTerm, ...] = ()
    preferred_affinity: tuple[WeightedPodTerm, ...] = ()
    preferred_anti_affinity: tuple[WeightedPodTerm, ...] = ()
    spread: tuple[SpreadConstraint, ...] = ()
    host_ports: tuple[HostPort, ...] = ()
    claims: tuple[str, ...] = ()  # PVC names, resolved into ``volumes`` by the shell
    volumes: VolumeConstraint = NO_VOLUMES
    nominated_node: str = ""
    # Requests of resources the core does not model otherwise (ephemeral-storage, extended
    # resources other than GPUs), in the units the node's allocatable uses.
    scalars: Mapping[str, int] = field(default_factory=dict)
    terminating: bool = False
    # DRA: ``spec.resourceClaims`` (core.dra.pod.PodClaimRef), resolved by the shell into
    # ``dra`` (core.dra.pod.PodClaims) before each session; the DraAllocation plugin reads it.
    resource_claims: tuple[PodClaimRef, ...] = ()
    dra: PodClaims | None = None
    # Each container's requested resources (init containers first: name, resource -> count),
    # kept only for pods asking for an extended resource: DRA may back it by a DeviceClass
    # (core.dra.extended), which the shell decides per node.
    container_requests: tuple[tuple[str, Mapping[str, int]], ...] = ()

    @property
    def has_pod_affinity(self) -> bool:
        return bool(
            self.affinity
            or self.anti_affinity
            or self.preferred_affinity
            or self.preferred_anti_affinity
        )


@dataclass(frozen=True, slots=True)
class PlacedPod:
    """A pod already on a node (bound or assumed, any scheduler's): ``node`` is its row."""

    id: str
    node: int
    pod: PodInfo


def requirement_mask(
    codes: NDArray[np.int32] | None,
    vocab: Mapping[str, int],
    req: Requirement,
    n: int,
) -> BOOL:
    """Nodes whose label (``codes``/``vocab`` of one key, as in ``snapshot.Labels``) satisfies
    ``req``: the requirement is evaluated once per distinct value, not per node."""
    if codes is None:
        return np.full(n, req.matches_value(None), dtype=np.bool_)
    table = np.zeros(len(vocab) + 1, dtype=np.bool_)
    for value, code in vocab.items():
        table[code] = req.matches_value(value)
    table[-1] = req.matches_value(None)  # code -1 (key missing) indexes the last entry
    return np.asarray(table[codes], dtype=np.bool_)
