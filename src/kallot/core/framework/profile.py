"""``Profile``: which plugins run at each extension point, with score weights and plugin args.

A ``Policy`` in kallot is a named Profile preset (``core.policies``), e.g. ``fgd`` or ``kallot``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    """Plugin names per extension point, in order. ``score`` pairs names with integer weights.

    Capabilities are declared, not discovered: ``mig`` names the filter that serves MIG
    requests and chooses MIG instances (a ``MigChooserPlugin``; "" = MIG requests fit nowhere),
    ``gang_topology`` the plugin whose ``GangTopology`` gangs are placed under (a
    ``GangTopologyPlugin``; "" = topology-blind gangs), ``reserve`` the plugins, among the
    profile's own, whose Reserve runs once a task's node and devices are chosen (a
    ``ReservePlugin``: DraAllocation decides the pod's claim allocations there, with the
    policy it scored them by; one not in the profile is skipped).
    """

    name: str
    queue_sort: str = "PrioritySort"
    pre_filter: tuple[str, ...] = ()
    filter: tuple[str, ...] = ("NodeResourcesFit", "NodeSelector", "DeviceFit")
    score: tuple[tuple[str, int], ...] = ()
    device_score: tuple[str, ...] = ()
    mig: str = ""
    gang_topology: str = ""
    reserve: tuple[str, ...] = ("DraAllocation",)
    args: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def plugin_names(self) -> tuple[str, ...]:
        names: list[str] = [self.queue_sort, *self.pre_filter, *self.filter]
        names += [n for n, _ in self.score]
        names += list(self.device_score)
        names += [n for n in (self.mig, self.gang_topology) if n]
        seen: dict[str, None] = {}
        for n in names:
            seen.setdefault(n, None)
        return tuple(seen)
