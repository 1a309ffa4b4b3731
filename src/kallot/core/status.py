"""Expected scheduling outcomes as values: ``Code``, ``Status`` and the per-plugin ``Diagnosis``.

Plugins return these instead of raising (kube-scheduler's framework.Status). The Diagnosis is
what "why is my pod pending" shows: for each rejecting plugin, how many nodes it rejected and why.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Code(enum.Enum):
    """Outcome of one extension point. Mirrors kube-scheduler's framework.Code."""

    SUCCESS = "Success"
    UNSCHEDULABLE = "Unschedulable"  # may fit after the cluster changes (e.g. preemption)
    UNSCHEDULABLE_AND_UNRESOLVABLE = "UnschedulableAndUnresolvable"  # never fits as asked
    SKIP = "Skip"  # the plugin has nothing to say about this task
    ERROR = "Error"  # a bug or invalid input, never "does not fit"


@dataclass(frozen=True, slots=True)
class Status:
    """Result of a pre-filter or permit step. ``Status()`` is success."""

    code: Code = Code.SUCCESS
    reason: str = ""
    plugin: str = ""

    @property
    def ok(self) -> bool:
        return self.code in (Code.SUCCESS, Code.SKIP)


SUCCESS = Status()


@dataclass(frozen=True, slots=True)
class Reason:
    """One line of a Diagnosis: ``nodes`` nodes were rejected by ``plugin`` for ``message``."""

    plugin: str
    message: str
    nodes: int
    unresolvable: bool = False


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """Why a task did not fit: reasons ordered by how many nodes they cover.

    Each node is charged to the first filter (in profile order) that rejected it, like
    kube-scheduler's NodeToStatus, so the counts add up to the number of nodes considered.
    """

    reasons: tuple[Reason, ...] = ()
    nodes_considered: int = 0
    summary: str = field(default="")
    # Set when a fault in kallot's own code (an exception in a plugin or action), not the
    # cluster, kept the task from being placed: "<plugin>: <exception>". The live scheduler
    # backs such a task off instead of waiting for a cluster change (``core.session.Session``).
    fault: str = ""

    def message(self) -> str:
        """Plain words, e.g. '3 nodes: GPU model not in [H100]; 12 nodes: no GPU with 20 GiB free'."""
        if self.summary:
            return self.summary
        if not self.reasons:
            return f"0/{self.nodes_considered} nodes are available"
        parts = [
            f"{r.nodes} node{'s' if r.nodes != 1 else ''}: {r.message}" if r.nodes else r.message
            for r in self.reasons
        ]
        return f"0/{self.nodes_considered} nodes are available: " + "; ".join(parts)

    @property
    def unresolvable(self) -> bool:
        """True if no node could ever host the task as asked (preemption would not help)."""
        return bool(self.reasons) and all(r.unresolvable for r in self.reasons)

    @staticmethod
    def of(plugin: str, message: str, *, unresolvable: bool = False) -> Diagnosis:
        """A diagnosis that is not about nodes (invalid request, gang not complete, quota)."""
        return Diagnosis(reasons=(Reason(plugin, message, 0, unresolvable),), summary=message)


FAULT = "Fault"  # Reason.plugin of a fault diagnosis whose origin is not a plugin


# What a session reports for a task that fits nowhere when the scheduler runs with
# explain=False (simulations that only count failures).
NOT_EXPLAINED = Diagnosis.of("Filter", "no node fits (diagnosis not computed)")
