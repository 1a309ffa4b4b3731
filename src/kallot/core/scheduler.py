"""``Scheduler.run_session(snapshot, pending, now=, rng=) -> Decision``: the core's one entry point.

Sorts pending tasks with the profile's QueueSort plugin, opens a Session, runs the Actions in
order and returns what they decided. Same inputs and same seed give the same Decision.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from kallot.core.actions import Action
from kallot.core.actions.allocate import Allocate
from kallot.core.decision import Decision
from kallot.core.framework.cycle import DEVICE_REASONS, PENDING
from kallot.core.framework.runner import Framework
from kallot.core.session.session import Session
from kallot.core.snapshot import Snapshot
from kallot.core.workload import Job, Task


class Scheduler:
    """Runs sessions with one Framework (profile) and an ordered list of Actions."""

    def __init__(
        self,
        framework: Framework,
        actions: Sequence[Action] | None = None,
        *,
        explain: bool = True,
    ) -> None:
        """``explain=False`` skips building a Diagnosis for tasks that fit nowhere (they get
        ``status.NOT_EXPLAINED``): simulations that only count failures save the work."""
        self.framework = framework
        self.actions: tuple[Action, ...] = tuple(actions) if actions else (Allocate(),)
        self.explain = explain

    def run_session(
        self,
        snapshot: Snapshot,
        pending: Sequence[Task],
        *,
        now: float,
        rng: np.random.Generator,
        jobs: Mapping[str, Job] | None = None,
        actions: Sequence[Action] | None = None,
    ) -> Decision:
        """One session over ``pending``; ``actions``: this session's (default: the
        scheduler's own), so a shell whose actions follow the cluster (the live scheduler's
        Queues) gives them per session instead of changing the scheduler."""
        session = Session(
            self.framework, snapshot, now=now, rng=rng, jobs=jobs or {}, explain=self.explain
        )
        ordered = sorted(pending, key=self.framework.queue_sort.sort_key)
        session.shared.put(PENDING, tuple(ordered))
        for action in self.actions if actions is None else actions:
            action.execute(session, ordered)
        placements = tuple(session.statement.placements())
        reasons = session.shared.get(DEVICE_REASONS) or {}
        return Decision(
            device_reasons={
                p.task_id: reasons[p.task_id] for p in placements if p.task_id in reasons
            },
            placements=placements,
            evictions=tuple(session.statement.evictions()),
            reconfigurations=tuple(session.statement.reconfigurations()),
            unschedulable=tuple(session.unschedulable),
        )
