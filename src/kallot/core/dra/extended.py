"""Extended resources backed by DRA (KEP-5004): a pod asking ``nvidia.com/gpu: 2`` is served
from a DeviceClass whose ``extendedResourceName`` is ``nvidia.com/gpu``.

Where it sits: before ``core.dra.allocator``. On a node without a device plugin for the
resource, the scheduler allocates a special claim for the pod; ``extended_resource_claim``
builds it (pure): one ``ExactCount`` request per container and resource, named
``container-<i>-request-<j>`` as upstream names them, of the class that backs the resource
(``extendedResourceName``, or the implicit ``deviceclass.resource.kubernetes.io/<class>``).
The kube shell (not wired yet) creates it with the annotation
``resource.kubernetes.io/extended-resource-claim: "true"`` and writes the allocation like any
other claim.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kallot.core.dra.model import DeviceClass, ExactRequest, Request, ResourceClaim

IMPLICIT_PREFIX = "deviceclass.resource.kubernetes.io/"
ANNOTATION = "resource.kubernetes.io/extended-resource-claim"


def backing_class(resource: str, classes: Mapping[str, DeviceClass]) -> DeviceClass | None:
    """The DeviceClass serving an extended resource name (the first by name when several
    declare it), or None when DRA does not back it."""
    if resource.startswith(IMPLICIT_PREFIX):
        return classes.get(resource[len(IMPLICIT_PREFIX) :])
    named = sorted(
        (c for c in classes.values() if c.extended_resource_name == resource), key=lambda c: c.name
    )
    return named[0] if named else None


def extended_resource_claim(
    namespace: str,
    pod: str,
    containers: Sequence[Mapping[str, int]],
    classes: Mapping[str, DeviceClass],
) -> ResourceClaim | None:
    """The special claim for the DRA-backed extended resources of a pod's containers
    (resource name -> count, in container order), or None when none is DRA-backed."""
    requests = []
    for i, wants in enumerate(containers):
        for j, (resource, count) in enumerate(sorted(wants.items())):
            cls = backing_class(resource, classes)
            if cls is None or count <= 0:
                continue
            name = f"container-{i}-request-{j}"
            requests.append(Request(name, exactly=ExactRequest(name, cls.name, count=count)))
    if not requests:
        return None
    return ResourceClaim(namespace, f"{pod}-extended-resources", requests=tuple(requests))
