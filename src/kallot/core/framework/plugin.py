"""Extension-point protocols. A plugin implements any subset; mypy proves conformance with
``_: type[FilterPlugin] = MyPlugin`` lines, like kube-scheduler's ``var _ FilterPlugin = &X{}``.

Contracts (all points):
- never mutate the Snapshot, never write the Scratch (only a Statement writes it);
- never raise for "does not fit": return a mask (and explain it on demand) or an unsuccessful Status;
- vectorize over nodes: Filter answers for all N nodes at once, Score for all candidates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np
from numpy.typing import NDArray

from kallot.core.decision import ClaimDecision, MigInstance, MigReconfiguration, Placement
from kallot.core.framework.cycle import Cycle
from kallot.core.gang import GangTopology
from kallot.core.status import Diagnosis, Status
from kallot.core.workload import Task

MAX_SCORE = 100.0


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why some nodes were rejected: ``message`` applies to the nodes in ``nodes`` ([N] mask).

    ``unresolvable`` means evicting pods would not help (wrong model, too few GPUs in total).
    """

    message: str
    nodes: NDArray[np.bool_]
    unresolvable: bool = False


class Plugin(Protocol):
    name: ClassVar[str]


class QueueSortPlugin(Plugin, Protocol):
    """Orders pending tasks: smaller keys go first. Must be a total order (end with the id)."""

    def sort_key(self, task: Task) -> tuple[Any, ...]: ...


class PreFilterPlugin(Plugin, Protocol):
    """Checks the task itself before any node is looked at (invalid requests, quotas)."""

    def pre_filter(self, cycle: Cycle, task: Task) -> Status: ...


class FilterPlugin(Plugin, Protocol):
    """Removes nodes that cannot host the task.

    ``filter`` returns an [N] mask (True = feasible) and is on the hot path; None means the
    plugin has nothing to say about this task (every node passes: a Kubernetes filter for a
    task without Kubernetes constraints), so the Framework skips it instead of ANDing an
    all-True mask. The mask may be a read-only cached array: callers never write it.
    ``explain`` is called only when a task fits nowhere: it returns Rejections covering the
    nodes in ``rejected`` that this plugin rejects, in plain words with numbers ("no GPU with
    20 GiB free, largest free is 16 GiB").
    """

    def filter(self, cycle: Cycle, task: Task) -> NDArray[np.bool_] | None: ...

    def explain(
        self, cycle: Cycle, task: Task, rejected: NDArray[np.bool_]
    ) -> tuple[Rejection, ...]: ...


class ScorePlugin(Plugin, Protocol):
    """Ranks feasible nodes: returns floats in [0, MAX_SCORE] for ``candidates``, higher is better.

    None means the plugin has no opinion on this task (it would score every candidate 0: a
    Kubernetes score for a task without the fields it reads), so the Framework adds nothing
    for it. The array may be the plugin's own: callers never write it."""

    def score(
        self, cycle: Cycle, task: Task, candidates: NDArray[np.intp]
    ) -> NDArray[np.float64] | None: ...


class DeviceScorePlugin(Plugin, Protocol):
    """Chooses which GPU slots on the chosen node the task gets.

    ``feasible`` holds the slots that can take one device of the request. Return ``count`` slots
    from it, or None to let the next DeviceScore plugin (or the framework default: lowest index
    for whole GPUs, tightest fit for shares) decide.
    """

    def choose(
        self, cycle: Cycle, task: Task, node: int, feasible: NDArray[np.intp]
    ) -> tuple[int, ...] | None: ...


class ReservePlugin(Plugin, Protocol):
    """Kube-scheduler's Reserve: called once the task's node (row ``node``) and devices are
    chosen, before the placement is written to the Statement; what it decides there goes into
    the ``Placement``, so the shell carries out exactly that and decides nothing again.

    Returns None when it has nothing to decide for the task (no claims), a ``ClaimDecision``
    (the pod's claim allocations on the node, chosen as its filter and score judged them), or a
    string: why the node cannot take the task after all (the Session then tries the next best
    node, as when no device choice holds it). What it keeps for later tasks must follow the
    Scratch (a rolled-back placement drops out of ``Scratch.pod_log``)."""

    def reserve(self, cycle: Cycle, task: Task, node: int) -> ClaimDecision | str | None: ...


@dataclass(frozen=True, slots=True)
class ShareChoice:
    """A MigChooserPlugin's answer for a share it chose to serve with a share slot (an MPS or
    time-sliced GPU ``slot``) rather than a MIG instance; ``key`` is why (smaller is better)."""

    slot: int
    key: tuple[int | float, ...]


@dataclass(frozen=True, slots=True)
class MigChoice:
    """A MigChooserPlugin's answer: the instance a task gets on one GPU, and the layout change
    it needs (None: the instance exists)."""

    slot: int
    instance: MigInstance
    reconfiguration: MigReconfiguration | None
    key: tuple[int, ...]  # smaller is better, comparable across GPUs and nodes


class MigChooserPlugin(Plugin, Protocol):
    """Serves MIG requests (``DeviceRequest.mig_profile``), and the shares that accept MIG on a
    snapshot with MIG GPUs that could hold them (``serves``): the Framework scores those tasks
    with this plugin alone and asks it for the device (and any MIG reconfiguration) on the
    chosen node. ``choose_mig`` returns a ``MigChoice`` (an instance), a ``ShareChoice`` (a
    share slot, for a share) or None. A profile declares its MIG chooser by name
    (``Profile.mig``); it must also be one of the profile's filters."""

    def serves(self, cycle: Cycle, task: Task) -> bool: ...

    def choose_mig(self, cycle: Cycle, task: Task, node: int) -> MigChoice | ShareChoice | None: ...

    def score(
        self, cycle: Cycle, task: Task, candidates: NDArray[np.intp]
    ) -> NDArray[np.float64]: ...


class GangTopologyPlugin(Plugin, Protocol):
    """Carries the profile's ``GangTopology``: the cluster levels gangs are placed in, and
    whether the profile weighs ``preferred`` domains and locality (``aware``) or only keeps a
    gang inside the domain being tried (``enforces_required``). A profile declares it by name
    (``Profile.gang_topology``); without one gangs are placed topology-blind (``gang.BLIND``)."""

    @property
    def gang_topology(self) -> GangTopology: ...


class QuotaPlugin(Plugin, Protocol):
    """Tenant quotas, called by the queue actions (``core.actions.queue``) around every
    placement of work charged to a queue (``queue``: the leaf queue's row in its QueueTree).

    ``limit``, before placing: refuse a task whose estimated charge breaks a hard limit.
    ``narrow``, before placing: the task the framework may place (e.g. without the GPU models
    whose per-model limit the queue reached), or why none. ``charge``, after placing one task
    or a gang: refuse what the placements actually took if it breaks a limit (with ``capped``,
    also the queue's static quota), else account all of it in the session's transaction log
    (``Cycle.journal``), so a Statement rollback undoes it. The caller rolls the placements
    back when ``charge`` refuses.
    """

    def limit(self, cycle: Cycle, queue: int, task: Task) -> Diagnosis | None: ...

    def narrow(self, cycle: Cycle, queue: int, task: Task) -> Task | Diagnosis: ...

    def charge(
        self,
        cycle: Cycle,
        queue: int,
        placed: Sequence[tuple[Task, Placement]],
        *,
        capped: bool,
    ) -> Diagnosis | None: ...
