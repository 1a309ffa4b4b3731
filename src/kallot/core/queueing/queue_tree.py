"""``Queue`` and ``QueueTree``: the tenant quota hierarchy (KAI's meaning of "queue").

Each queue has a parent ("" = top level) and, per resource, a guaranteed amount, an optional
hard limit and an over-quota weight (``QueueResource``). Only leaf queues run tasks. The tree
also holds the cluster-wide value of each GPU model (so fairness counts one H100 as several
T4s) and the resources the dominant share is taken over. Plain frozen dataclasses: the sim
builds them directly, ``config/queues.py`` from Queue documents, the live scheduler from CRDs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from kallot.core.errors import ConfigError
from kallot.core.resources import canonical_model

I64 = NDArray[np.int64]
F64 = NDArray[np.float64]
BOOL = NDArray[np.bool_]

# Resource names, with their integer units. A per-model resource is MODEL_PREFIX + model name.
CPU = "cpu"  # milli-CPU
MEMORY = "memory"  # MiB of host memory
GPU = "gpu"  # milli GPU-equivalents (1000 = one whole GPU of any model)
GPU_MEMORY = "gpu_memory"  # MiB of GPU memory
GPU_VALUE = "gpu_value"  # milli value units: GPU-equivalents times the model's value weight
MODEL_PREFIX = "gpu/"  # "gpu/H100-80GB": milli GPU-equivalents of that model only

BASE_RESOURCES: tuple[str, ...] = (CPU, MEMORY, GPU, GPU_MEMORY, GPU_VALUE)
DEFAULT_FAIRNESS: tuple[str, ...] = (CPU, MEMORY, GPU_VALUE)

# "No limit" in the limit matrix: large, yet far enough from int64's maximum that adding any
# real usage to it cannot overflow.
UNLIMITED = np.int64(1 << 60)


def model_resource(model: str) -> str:
    """The per-model resource name of a GPU model ("gpu/T4")."""
    return MODEL_PREFIX + canonical_model(model)


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueResource:
    """A queue's claim on one resource.

    ``guaranteed``: always obtainable when the queue has pending work for it (idle guaranteed
    capacity is lent to others and reclaimed on demand). ``limit``: hard cap on what the queue
    (with its sub-queues) may hold; None = no cap. ``over_quota_weight``: the queue's weight
    when capacity beyond the guarantees is shared out; 0 = never more than the guarantee.
    """

    guaranteed: int = 0
    limit: int | None = None
    over_quota_weight: float = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Queue:
    """One node of the tree. ``resources`` maps resource names to claims; a resource not listed
    is guaranteed 0, unlimited, and shared with ``over_quota_weight``. ``priority`` (the Queue
    CRD's ``spec.priority``) breaks ties between sibling queues of equal dominant share."""

    name: str
    parent: str = ""
    resources: Mapping[str, QueueResource] = field(default_factory=dict)
    over_quota_weight: float = 1.0
    priority: int = 0

    def claim(self, resource: str) -> QueueResource:
        found = self.resources.get(resource)
        if found is not None:
            return found
        return QueueResource(over_quota_weight=self.over_quota_weight)


def _check_resource(name: str, where: str) -> None:
    if name in BASE_RESOURCES:
        return
    if name.startswith(MODEL_PREFIX) and len(name) > len(MODEL_PREFIX):
        return
    raise ConfigError(
        where, name, f"one of {', '.join(BASE_RESOURCES)} or '{MODEL_PREFIX}<GPU model>'"
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueTree:
    """The validated hierarchy plus its per-resource matrices (rows = queues, columns = ``axes``).

    ``model_values`` maps GPU models to value weights (unlisted models weigh 1.0); it sets the
    ``gpu_value`` resource. ``fairness`` lists the resources whose largest usage-to-entitlement
    ratio is a queue's dominant share. ``default_queue`` (a leaf) takes tasks that name none.
    """

    queues: tuple[Queue, ...]
    model_values: Mapping[str, float] = field(default_factory=dict)
    fairness: tuple[str, ...] = DEFAULT_FAIRNESS
    default_queue: str = ""

    names: tuple[str, ...] = field(init=False)
    index: Mapping[str, int] = field(init=False)
    parent: tuple[int, ...] = field(init=False)  # -1 for top-level queues
    children: tuple[tuple[int, ...], ...] = field(init=False)
    top: tuple[int, ...] = field(init=False)
    topo: tuple[int, ...] = field(init=False)  # parents before children
    leaf: tuple[bool, ...] = field(init=False)
    path: tuple[tuple[int, ...], ...] = field(init=False)  # the queue, its parent, ... top
    axes: tuple[str, ...] = field(init=False)
    axis: Mapping[str, int] = field(init=False)
    guaranteed: I64 = field(init=False)  # [Q, R]
    limit: I64 = field(init=False)  # [Q, R], UNLIMITED where none
    weight: F64 = field(init=False)  # [Q, R]
    quota_axes: BOOL = field(init=False)  # [R] resources some queue names explicitly
    fair_axes: BOOL = field(init=False)  # [R]

    def __post_init__(self) -> None:
        queues = self.queues
        names = tuple(q.name for q in queues)
        index: dict[str, int] = {}
        for i, q in enumerate(queues):
            if not q.name:
                raise ConfigError(f"queues[{i}].name", q.name, "a non-empty queue name")
            if q.name in index:
                raise ConfigError(f"queues[{q.name}].name", q.name, "a name used by one queue")
            index[q.name] = i
        parent = []
        for q in queues:
            if q.parent and q.parent not in index:
                raise ConfigError(
                    f"queues[{q.name}].parent", q.parent, f"one of the queues {sorted(index)}"
                )
            if q.parent == q.name:
                raise ConfigError(f"queues[{q.name}].parent", q.parent, "another queue")
            parent.append(index[q.parent] if q.parent else -1)
        path: list[tuple[int, ...]] = []
        for i, q in enumerate(queues):
            chain = [i]
            while parent[chain[-1]] >= 0:
                nxt = parent[chain[-1]]
                if nxt in chain:
                    raise ConfigError(
                        f"queues[{q.name}].parent", q.parent, "a parent chain without cycles"
                    )
                chain.append(nxt)
            path.append(tuple(chain))
        children = [
            tuple(j for j in range(len(queues)) if parent[j] == i) for i in range(len(queues))
        ]
        topo = tuple(sorted(range(len(queues)), key=lambda i: (len(path[i]), i)))

        models: set[str] = set()
        for q in queues:
            if not math.isfinite(q.over_quota_weight) or q.over_quota_weight < 0:
                raise ConfigError(
                    f"queues[{q.name}].over_quota_weight", q.over_quota_weight, "a number >= 0"
                )
            for res, claim in q.resources.items():
                where = f"queues[{q.name}].resources[{res}]"
                _check_resource(res, where)
                if res.startswith(MODEL_PREFIX):
                    models.add(MODEL_PREFIX + canonical_model(res[len(MODEL_PREFIX) :]))
                _check_claim(claim, where)
        for res in self.fairness:
            _check_resource(res, "fairness")
            if res.startswith(MODEL_PREFIX):
                models.add(MODEL_PREFIX + canonical_model(res[len(MODEL_PREFIX) :]))
        for model, value in self.model_values.items():
            if not math.isfinite(value) or value <= 0:
                raise ConfigError(f"model_values[{model}]", value, "a value weight > 0")
        if self.default_queue:
            if self.default_queue not in index:
                raise ConfigError("default_queue", self.default_queue, f"one of {sorted(index)}")
            if children[index[self.default_queue]]:
                raise ConfigError("default_queue", self.default_queue, "a leaf queue")

        axes = BASE_RESOURCES + tuple(sorted(models))
        axis = {a: r for r, a in enumerate(axes)}
        n, r = len(queues), len(axes)
        guaranteed = np.zeros((n, r), dtype=np.int64)
        limit = np.full((n, r), UNLIMITED, dtype=np.int64)
        weight = np.zeros((n, r), dtype=np.float64)
        quota_axes = np.zeros(r, dtype=np.bool_)
        for i, q in enumerate(queues):
            weight[i, :] = q.over_quota_weight
            for res, claim in q.resources.items():
                c = axis[canonical_resource(res)]
                guaranteed[i, c] = claim.guaranteed
                if claim.limit is not None:
                    limit[i, c] = claim.limit
                weight[i, c] = claim.over_quota_weight
                quota_axes[c] = True
        # A parent must be able to honour what it guarantees its children.
        for i, q in enumerate(queues):
            kids = children[i]
            if not kids:
                continue
            total = guaranteed[list(kids)].sum(axis=0)
            over = np.flatnonzero(total > guaranteed[i])
            if over.size:
                c = int(over[0])
                raise ConfigError(
                    f"queues[{q.name}].resources[{axes[c]}].guaranteed",
                    int(guaranteed[i, c]),
                    f">= {int(total[c])}, the sum its child queues are guaranteed",
                )
        fair_axes = np.zeros(r, dtype=np.bool_)
        for res in self.fairness:
            fair_axes[axis[canonical_resource(res)]] = True
        for a in (guaranteed, limit, weight, quota_axes, fair_axes):
            a.flags.writeable = False

        put = object.__setattr__
        put(self, "names", names)
        put(self, "index", index)
        put(self, "parent", tuple(parent))
        put(self, "children", tuple(children))
        put(self, "top", tuple(i for i in range(n) if parent[i] < 0))
        put(self, "topo", topo)
        put(self, "leaf", tuple(not c for c in children))
        put(self, "path", tuple(path))
        put(self, "axes", axes)
        put(self, "axis", axis)
        put(self, "guaranteed", guaranteed)
        put(self, "limit", limit)
        put(self, "weight", weight)
        put(self, "quota_axes", quota_axes)
        put(self, "fair_axes", fair_axes)

    @property
    def n_queues(self) -> int:
        return len(self.queues)

    def value_of(self, model: str) -> float:
        """Value weight of one GPU of ``model`` (1.0 when not configured)."""
        return float(
            self.model_values.get(canonical_model(model), self.model_values.get(model, 1.0))
        )

    def leaf_of(self, queue: str) -> int | None:
        """Row of the leaf queue a task naming ``queue`` is charged to (None if there is none)."""
        name = queue or self.default_queue
        i = self.index.get(name)
        if i is None or not self.leaf[i]:
            return None
        return i

    def lca(self, a: int, b: int) -> int:
        """Lowest common ancestor of two queues (-1 = the cluster above the top level)."""
        above_a = set(self.path[a])
        for q in self.path[b]:
            if q in above_a:
                return q
        return -1

    def below(self, queue: int, ancestor: int) -> tuple[int, ...]:
        """``queue`` and its ancestors strictly below ``ancestor`` (-1 = all of them)."""
        out = []
        for q in self.path[queue]:
            if q == ancestor:
                break
            out.append(q)
        return tuple(out)


def canonical_resource(name: str) -> str:
    """The axis name of a resource (a per-model one with the model's canonical name)."""
    if name.startswith(MODEL_PREFIX):
        return MODEL_PREFIX + canonical_model(name[len(MODEL_PREFIX) :])
    return name


def _check_claim(claim: QueueResource, where: str) -> None:
    if claim.guaranteed < 0:
        raise ConfigError(f"{where}.guaranteed", claim.guaranteed, "an amount >= 0")
    if claim.limit is not None and claim.limit < claim.guaranteed:
        raise ConfigError(
            f"{where}.limit",
            claim.limit,
            f"no limit, or a limit >= guaranteed ({claim.guaranteed})",
        )
    w = claim.over_quota_weight
    if not math.isfinite(w) or w < 0:
        raise ConfigError(f"{where}.over_quota_weight", w, "a number >= 0")
