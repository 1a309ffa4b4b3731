"""Which running model servers kallot's preemption and reclaim never take (docs/serving.md,
"Disruption safety").

Where it sits: ``victims.units`` drops every eviction unit with a member in ``protected``. Two
rules, for tasks that name a model (``Task.model``; every other task is unaffected):

- **loading**: a replica is protected while it may still be loading, for the worst-case load
  time of its weights (``core.models.LoadModel``: start-up + size from remote storage) after it
  started: evicting it throws the load away and frees GPUs that did no work;
- **the last replica**: per model, the replica that started first is protected, so preemption
  can take every other replica but never the last one (the oldest is the one most likely ready;
  the core does not see readiness, the kube shell's ``karpenter.sh/do-not-disrupt`` does).
"""

from __future__ import annotations

from collections.abc import Sequence

from kallot.core.models import DEFAULT_LOAD_MODEL, LoadModel, Tier
from kallot.core.snapshot import Allocation


def protected(
    running: Sequence[Allocation], now: float, load: LoadModel = DEFAULT_LOAD_MODEL
) -> frozenset[str]:
    """Ids of the running tasks no eviction may take (module docstring)."""
    out: set[str] = set()
    oldest: dict[str, Allocation] = {}
    for alloc in running:
        model = alloc.task.model
        if model is None:
            continue
        if now - alloc.started < load.load_s(model.size_bytes, Tier.REMOTE):
            out.add(alloc.task.id)
        first = oldest.get(model.id)
        if first is None or (alloc.started, alloc.task.id) < (first.started, first.task.id):
            oldest[model.id] = alloc
    out.update(a.task.id for a in oldest.values())
    return frozenset(out)
