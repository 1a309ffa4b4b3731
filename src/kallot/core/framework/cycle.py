"""``Cycle``: everything a plugin sees while one task is being placed inside a session.

``CycleState`` is per task (cleared for each task); ``SessionState`` lives for the whole session
(plugins keep per-node caches there, refreshed by ``Scratch.node_version``). Keys are typed
``StateKey``s named after the owning plugin so plugins cannot collide.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np
from numpy.typing import NDArray

from kallot.core.journal import Journal
from kallot.core.snapshot import Scratch, Snapshot
from kallot.core.topology import GangContext
from kallot.core.workload import Job, Task

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class StateKey(Generic[T]):
    """A typed key; by convention ``StateKey[Foo]('PluginName/what')``."""

    name: str


@dataclass(slots=True)
class _State:
    _data: dict[str, Any] = field(default_factory=dict)

    def get(self, key: StateKey[T]) -> T | None:
        value: T | None = self._data.get(key.name)  # typed by the key (no cast call per get)
        return value

    def put(self, key: StateKey[T], value: T) -> None:
        self._data[key.name] = value

    def clear(self) -> None:
        self._data.clear()


class CycleState(_State):
    """Per-task data shared between one plugin's extension points."""


class SessionState(_State):
    """Per-session data (caches) shared across tasks of one session."""


@dataclass(slots=True)
class Cycle:
    """One task's view of the session: read-only snapshot, mutable scratch, seeded rng.

    ``tie_rank[n]`` is node n's rank in the session's seeded node order: among equal scores the
    node with the lowest rank wins (kube-scheduler's patched selectHost in the FGD simulator).
    ``now`` is the session time in seconds (the shell's clock; the core never reads one).
    ``journal`` is the session's transaction log (the Statement), for plugins that keep
    accounting beside the Scratch (the Quota plugin); None outside a session.
    """

    snapshot: Snapshot
    scratch: Scratch
    rng: np.random.Generator
    tie_rank: np.ndarray[Any, np.dtype[np.int64]]
    now: float = 0.0
    state: CycleState = field(default_factory=CycleState)
    session: SessionState = field(default_factory=SessionState)
    journal: Journal | None = None


# The session's pending tasks in queue order, put by Scheduler.run_session (plugins that learn
# the workload from what is pending read it).
PENDING: StateKey[tuple[Task, ...]] = StateKey("Session/pending")

# Why a DeviceScore plugin chose the GPUs it chose, per task id ("GPUs 0,1: NV18 ..."), put by
# the plugin; the Decision carries the ones of tasks that stay placed.
DEVICE_REASONS: StateKey[dict[str, str]] = StateKey("Session/device_reasons")

# The session's Jobs by id (gangs and the queues they are charged to), put by the Session.
JOBS: StateKey[Mapping[str, Job]] = StateKey("Session/jobs")

# The gang being placed, put by the gang-allocate action (``core.actions.gang_allocate``) for
# each try and removed after; read by the plugins that keep a gang in its domain.
GANG_CONTEXT: StateKey[GangContext | None] = StateKey("Gang/context")

# [N, G] GPU slots that can take one device of the task, put by the DeviceFit filter for the
# task being placed (per cycle) and reused by the plugins that choose GPUs on the chosen node.
SLOT_FIT: StateKey[NDArray[np.bool_]] = StateKey("DeviceFit/slot_fit")
