"""What the owner derivation reads of a pod (``PodFacts``) and what it says (``Derived``).

Where it sits: the data of ``kube.owners``: the index keeps a ``PodFacts`` per kallot pod, each
owner kind's gang rule (``gangs``, named by its entry in ``kinds.KINDS``) turns facts into a
``Derived``, and ``OwnerIndex.resolve`` applies it to the pod's Task.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from kallot.core.workload import Job, TopologyConstraint, TopologyMode


@dataclass(frozen=True, slots=True)
class Derived:
    """What a pod's owner chain says: the gang (None = a single pod), the queue, and where
    each came from (for ``kallot explain``). ``note`` says why no gang was derived for a pod
    whose owner is unknown or malformed; ``wait`` says which owner object a pod waits for."""

    job: Job | None = None
    gang_source: str = ""
    queue: str = ""
    queue_source: str = ""
    note: str = ""
    wait: str = ""
    #: the wait does not time out (a Kueue Workload not admitted yet)
    hold: bool = False
    #: node labels the pod must land on (the admitted Kueue Workload's ResourceFlavor)
    node_selector: Mapping[str, str] = field(default_factory=dict)


NOTHING = Derived()


@dataclass(frozen=True, slots=True)
class PodFacts:
    """The part of a pod the derivation reads, kept per pod by the index."""

    namespace: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    controller: tuple[str, str, str, str]  # (apiVersion, kind, name, uid) or empty strings
    name: str = ""
    scheduling_group: str = ""  # spec.schedulingGroup.podGroupName (the upstream Workload API)
    node_selector: Mapping[str, str] = field(default_factory=dict)  # the pod's own nodeSelector

    @staticmethod
    def of(pod: Mapping[str, Any]) -> PodFacts:
        meta = pod.get("metadata") or {}
        ctrl = ("", "", "", "")
        for ref in meta.get("ownerReferences") or []:
            if ref.get("controller"):
                ctrl = (
                    str(ref.get("apiVersion", "")),
                    str(ref.get("kind", "")),
                    str(ref.get("name", "")),
                    str(ref.get("uid", "")),
                )
                break
        return PodFacts(
            namespace=str(meta.get("namespace", "")),
            labels=dict(meta.get("labels") or {}),
            annotations=dict(meta.get("annotations") or {}),
            controller=ctrl,
            name=str(meta.get("name", "")),
            scheduling_group=str(
                ((pod.get("spec") or {}).get("schedulingGroup") or {}).get("podGroupName") or ""
            ),
            node_selector={
                str(k): str(v)
                for k, v in ((pod.get("spec") or {}).get("nodeSelector") or {}).items()
            },
        )


class Lookup(Protocol):
    """The owner objects a gang rule reads (``OwnerIndex``)."""

    def get(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None: ...

    def jobset_jobs(self, namespace: str, jobset: str) -> list[Mapping[str, Any]]: ...


def to_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def exclusive_in(key: str) -> TopologyConstraint:
    return TopologyConstraint(mode=TopologyMode.REQUIRED, level=key.strip())


def condition(obj: Mapping[str, Any], kind: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


def controller_of(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """(kind, name) of the object's controller ownerReference, if any."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("kind", "")), str(ref.get("name", ""))
    return None
