"""Each session's actions, from the cluster's Queue objects: the core's queue actions (fair
share, reclaim, preemption) over the tree they form, plain allocation when there are none.

Where it sits: the session loop (``kube.schedule.loop``) asks ``for_session`` once per
session and hands the result to ``Scheduler.run_session``; the scheduler itself is never
changed. A tree that does not validate keeps the previous one in force and says why on every
Queue (``kube.schedule.problems``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from kallot.core.actions import Action
from kallot.core.errors import ConfigError
from kallot.core.queueing.queue_tree import QueueTree
from kallot.kube import translate
from kallot.kube.schedule.problems import Problems
from kallot.kube.state.cache import Cache

logger = logging.getLogger(__name__)


class SessionActions:
    """The actions in force, rebuilt when the cache's Queues change. Runs on the event loop."""

    def __init__(
        self,
        cache: Cache,
        problems: Problems,
        *,
        plain: tuple[Action, ...],
        queue_actions: Callable[[QueueTree], tuple[Action, ...]],
    ) -> None:
        self.cache = cache
        self.problems = problems
        self.plain = plain  # the scheduler configuration's own (no Queues)
        self.queue_actions = queue_actions
        self.current = plain
        self._queues_seen = -1

    def for_session(self) -> tuple[Action, ...]:
        """The actions of the next session (the Queues as the cache holds them now)."""
        if self.cache.queues_generation == self._queues_seen:
            return self.current
        self._queues_seen = self.cache.queues_generation
        for name, err in self.cache.queue_errors.items():
            self.problems.queue_problem(name, f"kallot ignores this Queue: {err}")
        if not self.cache.queues:
            self.current = self.plain
            logger.info("no Queues: plain allocation")
            return self.current
        try:
            tree = translate.queue_tree(self.cache.queues.values())
        except ConfigError as exc:
            for name in self.cache.queues:
                self.problems.queue_problem(name, f"kallot keeps its previous queue tree: {exc}")
            return self.current
        self.current = self.queue_actions(tree)
        logger.info("queue tree queues=%s", ",".join(tree.names))
        return self.current
