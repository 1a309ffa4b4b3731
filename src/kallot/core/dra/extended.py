"""Extended resources backed by DRA (KEP-5004): a pod asking ``nvidia.com/gpu: 2`` is served
from a DeviceClass whose ``extendedResourceName`` is ``nvidia.com/gpu``.

Where it sits: before ``core.dra.allocator``. On a node that does not advertise the resource
in its allocatable (no device plugin for it), the scheduler allocates a special claim for the
pod; ``extended_claim`` builds it (pure), as kube-scheduler's DynamicResources plugin does:
the containers are the init containers then the regular ones; one ``ExactCount`` request per
container and DRA-backed resource, named ``container-<i>-request-<j>`` (``i`` the container's
index, ``j`` the resource's index among the container's requested resource names in sorted
order, every resource counted), of the class that backs the resource (``extendedResourceName``,
or the implicit ``deviceclass.resource.kubernetes.io/<class>``), requests sorted by name. The
mappings (container, resource, request) are what the pod's
``status.extendedResourceClaimStatus.requestMappings`` says. The kube shell
(``kube.dra.cache`` / ``kube.bind.claims``) creates the claim with the annotation
``resource.kubernetes.io/extended-resource-claim: "true"`` and writes the allocation like any
other claim.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kallot.core.dra.model import DeviceClass, ExactRequest, Request, ResourceClaim

IMPLICIT_PREFIX = "deviceclass.resource.kubernetes.io/"
ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
# The in-memory name of a pod's special claim until it is created (the API then generates
# ``<pod>-extended-resources-<random>``).
SUFFIX = "-extended-resources"


@dataclass(frozen=True, slots=True)
class RequestMapping:
    """One entry of ``status.extendedResourceClaimStatus.requestMappings``."""

    container: str
    resource: str
    request: str


@dataclass(frozen=True, slots=True)
class ExtendedClaim:
    """A pod's special claim (unallocated, named ``<pod>-extended-resources`` in memory), the
    request mappings, and the DRA-backed resource names with their classes."""

    claim: ResourceClaim
    mappings: tuple[RequestMapping, ...]
    classes: Mapping[str, str]  # resource -> DeviceClass name

    @property
    def resources(self) -> frozenset[str]:
        return frozenset(self.classes)

    def describe(self) -> str:
        """``nvidia.com/gpu (DeviceClass gpu.nvidia.com)``, for reasons."""
        return ", ".join(f"{r} (DeviceClass {c})" for r, c in sorted(self.classes.items()))


def backing_class(resource: str, classes: Mapping[str, DeviceClass]) -> DeviceClass | None:
    """The DeviceClass serving an extended resource name, or None when DRA does not back it.
    When several declare it, the one created last, and of those the first by name (KEP-5004)."""
    if resource.startswith(IMPLICIT_PREFIX):
        return classes.get(resource[len(IMPLICIT_PREFIX) :])
    named = sorted(
        (c for c in classes.values() if c.extended_resource_name == resource), key=lambda c: c.name
    )
    return max(named, key=lambda c: c.created) if named else None


def extended_claim(
    namespace: str,
    pod: str,
    containers: Sequence[tuple[str, Mapping[str, int]]],
    classes: Mapping[str, DeviceClass],
) -> ExtendedClaim | None:
    """The special claim for the DRA-backed extended resources of a pod's containers
    ((name, every requested resource -> count), init containers first), or None when none is
    DRA-backed."""
    requests: list[Request] = []
    mappings: list[RequestMapping] = []
    backed: dict[str, str] = {}
    for i, (container, wants) in enumerate(containers):
        for j, resource in enumerate(sorted(wants)):
            count = wants[resource]
            cls = backing_class(resource, classes) if count > 0 else None
            if cls is None:
                continue
            name = f"container-{i}-request-{j}"
            requests.append(Request(name, exactly=ExactRequest(name, cls.name, count=count)))
            mappings.append(RequestMapping(container, resource, name))
            backed[resource] = cls.name
    if not requests:
        return None
    requests.sort(key=lambda r: r.name)
    claim = ResourceClaim(namespace, f"{pod}{SUFFIX}", requests=tuple(requests))
    return ExtendedClaim(claim, tuple(mappings), backed)


def extended_resource_claim(
    namespace: str,
    pod: str,
    containers: Sequence[Mapping[str, int]],
    classes: Mapping[str, DeviceClass],
) -> ResourceClaim | None:
    """``extended_claim``'s claim for unnamed containers (resource name -> count)."""
    got = extended_claim(namespace, pod, [(str(i), c) for i, c in enumerate(containers)], classes)
    return got.claim if got is not None else None
