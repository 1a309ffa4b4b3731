"""What is asked: ``Task`` (one pod), ``Job`` (a gang) and ``DeviceRequest`` (its GPU needs).

Shells translate pods and trace rows into these frozen dataclasses once, at the edge; the core
never sees a pod or a CSV row. ``DeviceRequest`` mirrors DRA's ``ResourceClaim`` request: a
count of devices, a per-device share, allowed models, accepted sharing modes and isolation.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from kallot.core.k8s import PodInfo
from kallot.core.models import ModelRef
from kallot.core.resources import ALL_MODES, MILLI, Isolation, SharingMode

# The longest a task's min_runtime_s may shield it from reclaim and preemption: a pod's
# kallot.io/min-runtime is the tenant's own word, so the protection it buys is bounded; a borrowed
# pod is reclaimable at the latest this long after it started (docs/security.md). The scheduler
# configuration may lower it (actions.maxMinRuntimeSeconds); a longer annotation is refused.
MIN_RUNTIME_MAX_S = 3600.0


class TopologyMode(enum.IntEnum):
    """How hard a topology constraint is."""

    NONE = 0
    PREFERRED = 1  # scored: better links / one domain when possible
    REQUIRED = 2  # filtered: never violated


@dataclass(frozen=True, slots=True, kw_only=True)
class TopologyConstraint:
    """Where the devices of a task (or the tasks of a gang) must sit.

    ``level`` names an in-node level for a multi-GPU task ("nvlink", "numa") or a cluster level
    for a gang (a node-label key such as "kallot.io/rack", or its configured short name).
    """

    mode: TopologyMode = TopologyMode.NONE
    level: str = ""


NO_TOPOLOGY = TopologyConstraint()


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceRequest:
    """GPU needs of one task.

    ``count`` devices, each with ``milli`` compute (1000 = whole GPU) and ``mem_mib`` memory
    (0 = in proportion to ``milli`` on whatever GPU is chosen). A ``mig_profile`` asks for one
    MIG instance of that profile instead (``count`` must be 1). ``models`` restricts GPU models
    (empty = any); ``modes`` are the sharing modes the task accepts; ``isolation`` further
    restricts modes.
    """

    count: int = 1
    milli: int = MILLI
    mem_mib: int = 0
    models: frozenset[str] = frozenset()
    modes: frozenset[SharingMode] = ALL_MODES
    isolation: Isolation = Isolation.NONE
    mig_profile: str = ""
    topology: TopologyConstraint = NO_TOPOLOGY

    def __post_init__(self) -> None:
        # Invariants a shell must guarantee when it translates user input (kube/translate/ and
        # sim/trace.py validate and report errors with field names before building these).
        if self.count < 0:
            raise ValueError(f"DeviceRequest.count: got {self.count}, expected >= 0")
        if not 0 <= self.milli <= MILLI:
            raise ValueError(f"DeviceRequest.milli: got {self.milli}, expected 0..{MILLI}")
        if self.mem_mib < 0:
            raise ValueError(f"DeviceRequest.mem_mib: got {self.mem_mib}, expected >= 0")
        if self.count > 1 and self.is_fractional:
            raise ValueError(
                f"DeviceRequest: a share ({self.milli} milli, {self.mem_mib} MiB) is per device and "
                f"needs count 1, got count {self.count}"
            )
        if self.mig_profile and self.count != 1:
            raise ValueError(f"DeviceRequest: a MIG profile needs count 1, got {self.count}")

    @property
    def whole(self) -> bool:
        """Whole GPUs: full compute and no explicit memory cap (memory is the whole device)."""
        return not self.mig_profile and self.milli >= MILLI and self.mem_mib == 0

    @property
    def is_fractional(self) -> bool:
        """A share of one GPU (by compute and/or memory)."""
        return not self.mig_profile and (self.milli < MILLI or self.mem_mib > 0)

    @property
    def total_milli(self) -> int:
        return self.count * self.milli

    def memory_for(self, device_mem_mib: int) -> int:
        """Memory this request takes on a device of ``device_mem_mib``.

        Whole GPUs take all of it. A share without an explicit memory size takes memory in
        proportion to compute, rounded down so that shares whose compute sums to one GPU never
        sum to more memory than the GPU has.
        """
        if self.whole:
            return device_mem_mib
        if self.mem_mib:
            return self.mem_mib
        return (self.milli * device_mem_mib) // MILLI

    def accepts(self, mode: SharingMode) -> bool:
        return mode in self.modes and self.isolation.allows(mode)


@dataclass(frozen=True, slots=True, kw_only=True)
class Task:
    """One pod-equivalent unit of work.

    ``cpu_milli`` and ``mem_mib`` are host resources; ``gpu`` is None for a CPU-only task.
    ``created`` orders tasks of equal priority (earlier first); ``job`` names its gang (or "").
    ``model`` names the weights a serving task loads (None: no model, the ModelCache plugin
    leaves the task alone).
    """

    id: str
    cpu_milli: int = 0
    mem_mib: int = 0
    gpu: DeviceRequest | None = None
    priority: int = 0
    created: float = 0.0
    queue: str = ""
    job: str = ""
    node_selector: Mapping[str, str] = field(default_factory=dict)
    do_not_disrupt: bool = False
    min_runtime_s: float = 0.0
    model: ModelRef | None = None
    # Kubernetes semantics beyond resources (taints, affinity, spread, ports, volumes); None
    # for a task that has none of them (every simulator task): the k8s plugins pass it.
    k8s: PodInfo | None = None

    @property
    def gpu_milli_total(self) -> int:
        return 0 if self.gpu is None else self.gpu.total_milli

    @property
    def wants_gpu(self) -> bool:
        return self.gpu is not None and self.gpu.count > 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """A gang: at least ``min_available`` of its tasks start together, or none do.

    ``topology`` optionally keeps the whole gang inside one domain of a cluster level.
    ``exclusive`` makes that domain the gang's alone among exclusive gangs (JobSet's and
    LeaderWorkerSet's exclusive placement): a session gives no two exclusive gangs the same
    domain, and ``avoid_nodes`` names the nodes whose domains running ones already hold.
    """

    id: str
    min_available: int = 1
    queue: str = ""
    priority: int = 0
    topology: TopologyConstraint = NO_TOPOLOGY
    exclusive: bool = False
    avoid_nodes: frozenset[str] = frozenset()
