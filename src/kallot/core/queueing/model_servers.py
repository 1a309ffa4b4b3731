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

Both rules are the pod's own word (its ``kallot.io/model`` and ``kallot.io/model-size``), so
they are bounded where a queue's guarantee is at stake (docs/security.md): reclaim, which only
takes capacity a queue borrowed, does not keep a last replica (a tenant naming a distinct model
on every pod would otherwise never give a borrowed GPU back), and loading protects for at most
``max_protect_s`` (the scheduler configuration's ``actions.maxMinRuntimeSeconds``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kallot.core.models import DEFAULT_LOAD_MODEL, LoadModel, Tier
from kallot.core.snapshot import Allocation


def protected(
    running: Sequence[Allocation],
    now: float,
    load: LoadModel = DEFAULT_LOAD_MODEL,
    *,
    last_replica: bool = True,
    max_protect_s: float = math.inf,
) -> frozenset[str]:
    """Ids of the running tasks no eviction may take (module docstring)."""
    out: set[str] = set()
    oldest: dict[str, Allocation] = {}
    for alloc in running:
        model = alloc.task.model
        if model is None:
            continue
        if now - alloc.started < min(load.load_s(model.size_bytes, Tier.REMOTE), max_protect_s):
            out.add(alloc.task.id)
        first = oldest.get(model.id)
        if first is None or (alloc.started, alloc.task.id) < (first.started, first.task.id):
            oldest[model.id] = alloc
    if last_replica:
        out.update(a.task.id for a in oldest.values())
    return frozenset(out)
