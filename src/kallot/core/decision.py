"""What the core decides: ``Placement``s with device assignments and DRA claim allocations,
``Eviction``s, unschedulable tasks with their ``Diagnosis``, and MIG reconfigurations.
``Decision`` is the only thing shells consume: the simulator applies it to its cluster, the
live scheduler binds it (and decides nothing again: what it writes is what was scored).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kallot.core.dra.model import ClaimAllocation
from kallot.core.resources import SharingMode
from kallot.core.status import Diagnosis


@dataclass(frozen=True, slots=True, kw_only=True)
class MigInstance:
    """One MIG GPU instance: its profile name (e.g. '3g.40gb') and placement start slot."""

    profile: str
    start: int


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceAssignment:
    """One device (or share of one) given to a task.

    ``slot`` is the GPU's index on its node, ``uuid`` its NVML UUID; ``milli`` and ``mem_mib``
    the compute and memory charged; ``mode`` how the GPU is shared; ``mig`` the instance when
    ``mode`` is MIG.
    """

    slot: int
    uuid: str
    milli: int
    mem_mib: int
    mode: SharingMode
    mig: MigInstance | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimDecision:
    """A pod's ResourceClaims (DRA) on its node, as the session scored them.

    ``allocations``: claim key ("namespace/name") -> the allocation the session chose for an
    unallocated claim (each result's device, share id and consumed capacity), to be written to
    the claim's ``status.allocation``; ``reserve``: the keys of claims already allocated (before
    the session, or by a pod placed earlier in it) that only get the pod in ``reservedFor``.
    """

    allocations: Mapping[str, ClaimAllocation] = field(default_factory=dict)
    reserve: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Task ``task_id`` goes to node ``node`` (row ``node_row`` of the session's Snapshot).

    ``claims``: its DRA claim allocations there (None for a task without claims), chosen at the
    session's Reserve point by the plugin that filtered and scored them (``DraAllocation``)."""

    task_id: str
    node: str
    node_row: int
    devices: tuple[DeviceAssignment, ...] = ()
    claims: ClaimDecision | None = None
    attempt: int = 0  # order of the attempt within the session (interleaves with unschedulable)
    score: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Eviction:
    """A running task to evict so that ``for_task`` fits (preemption or reclaim)."""

    task_id: str
    node: str
    reason: str
    for_task: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Unschedulable:
    """Task ``task_id`` did not fit in this session, and why."""

    task_id: str
    diagnosis: Diagnosis
    attempt: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class MigReconfiguration:
    """Change the MIG layout of one GPU before the placements that need it.

    ``destroy`` instances must be idle; ``create`` are the new instances.
    """

    node: str
    slot: int
    uuid: str
    destroy: tuple[MigInstance, ...]
    create: tuple[MigInstance, ...]
    for_task: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """Everything one session decided, in the order it was decided."""

    placements: tuple[Placement, ...] = ()
    evictions: tuple[Eviction, ...] = ()
    unschedulable: tuple[Unschedulable, ...] = ()
    reconfigurations: tuple[MigReconfiguration, ...] = ()
    stats: dict[str, float] = field(default_factory=dict)
    # Per placed task id: why its devices were chosen (from the DeviceScore plugin, if it says).
    device_reasons: dict[str, str] = field(default_factory=dict)

    def placement_of(self, task_id: str) -> Placement | None:
        for p in self.placements:
            if p.task_id == task_id:
                return p
        return None
