"""Score: prefer nodes that already hold a serving task's model weights, in seconds saved.

Where it sits: a score plugin of the ``kallot`` profile (``core.policies``), next to KallotScore.
It scores only tasks that name a model (``Task.model``); every other task gets 0 on every node,
so profiles with it decide exactly as without it for them. It never filters: a node without the
model is as feasible as before, only slower to start on.

Score (docs/serving.md): ``saved_s[n]`` = load time from remote storage minus load time on node
``n`` (``core.models.LoadModel``: start-up plus size over the bandwidth of the fastest tier that
holds the weights on ``n``; a task that states no size gets the size the nodes measured).
A node running a replica of the same model counts as holding it in
host memory (its page cache). The score is

    max(0, 100 - (best_s - saved_s) * gpus / seconds_per_point)

where ``best_s`` is the most any candidate node saves: the fastest node scores 100 and every
second more to load costs ``gpus / seconds_per_point`` points, so the score difference of two
nodes is the seconds one saves over the other, exactly, while both are within 100 points of the
best. Further behind, fragmentation (at most 100 points of KallotScore) could not outweigh the
difference anyway. (A cap at the top instead, ``min(100, saved_s ...)``, would make a 140 GB
model score the same on a memory and a disk node; an absolute floor would make it score the same
on a disk node and a node that must pull it.) ``gpus`` is the task's GPU-equivalents (at least 1): a
tensor-parallel server on 8 GPUs idles 8 GPUs while it loads, and reads its weights once per
node (the node's bandwidth sets the time, not the GPU count), so its seconds weigh 8 times. ``seconds_per_point`` is the exchange rate
against fragmentation: KallotScore's ``100 * sigmoid(delta / 1000)`` moves by about 25 points
per GPU of expected fragment near its midpoint, so the default 1 GPU-second per point trades one
GPU of expected fragment for about 25 GPU-seconds of loading.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from kallot.core.errors import ConfigError
from kallot.core.framework.cycle import Cycle, StateKey
from kallot.core.framework.plugin import MAX_SCORE, ScorePlugin
from kallot.core.models import DEFAULT_LOAD_MODEL, LoadModel, ModelRef, Tier
from kallot.core.resources import MILLI
from kallot.core.snapshot import Snapshot
from kallot.core.workload import Task

F64 = NDArray[np.float64]
SECONDS_PER_POINT = 1.0


def sized(snapshot: Snapshot, model: ModelRef) -> ModelRef:
    """``model`` with a size: its own, else the largest size a node measured (else 0)."""
    if model.size_bytes or not snapshot.node_models:
        return model
    size = max(cache.size_of(model) for cache in snapshot.node_models)
    return ModelRef(model.id, model.revision, size)


def saved_seconds(snapshot: Snapshot, model: ModelRef, load: LoadModel) -> F64:
    """``[N]`` seconds each node saves on loading ``model`` over a node that must pull it."""
    n = snapshot.n_nodes
    if not snapshot.node_models:
        return np.zeros(n, dtype=np.float64)
    model = sized(snapshot, model)
    warm = np.zeros(n, dtype=np.bool_)
    for alloc in snapshot.running:
        other = alloc.task.model
        if other is None or other.id != model.id:
            continue
        if not model.revision or not other.revision or other.revision == model.revision:
            warm[alloc.node_row] = True
    out = np.empty(n, dtype=np.float64)
    cold = load.load_s(model.size_bytes, Tier.REMOTE)
    for i, cache in enumerate(snapshot.node_models):
        # a running replica of the model keeps its weights in the node's page cache
        on = load.load_s(model.size_bytes, Tier.MEMORY) if warm[i] else load.on(model, cache)
        out[i] = max(0.0, cold - on)
    return out


class ModelCacheScore:
    """Args: ``seconds_per_point`` (1.0) and the load-time model's ``startup_s``,
    ``remote_bytes_per_s``, ``disk_bytes_per_s``, ``memory_bytes_per_s`` (core.models)."""

    name: ClassVar[str] = "ModelCache"

    def __init__(
        self, *, seconds_per_point: float = SECONDS_PER_POINT, load: LoadModel = DEFAULT_LOAD_MODEL
    ) -> None:
        self._per_point = seconds_per_point
        self._load = load
        self._key: StateKey[dict[str, F64]] = StateKey(f"{self.name}/saved")

    @staticmethod
    def from_args(args: Mapping[str, Any]) -> ModelCacheScore:
        fields = ("startup_s", "remote_bytes_per_s", "disk_bytes_per_s", "memory_bytes_per_s")
        allowed = {"seconds_per_point", *fields}
        unknown = set(args) - allowed
        if unknown:
            raise ConfigError("ModelCache args", sorted(unknown), f"only {sorted(allowed)}")
        values: dict[str, float] = {}
        for key in allowed & set(args):
            value = args[key]
            positive = key != "startup_s"
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or value < 0
                or (positive and value == 0)
            ):
                raise ConfigError(
                    f"ModelCache args.{key}", value, "a number > 0" if positive else ">= 0"
                )
            values[key] = float(value)
        per_point = values.pop("seconds_per_point", SECONDS_PER_POINT)
        return ModelCacheScore(seconds_per_point=per_point, load=LoadModel(**values))

    def saved(self, cycle: Cycle, model: ModelRef) -> F64:
        """``[N]`` seconds saved per node, memoized per session and model."""
        memo = cycle.session.get(self._key)
        if memo is None:
            memo = {}
            cycle.session.put(self._key, memo)
        key = f"{model.key}:{model.size_bytes}"
        saved = memo.get(key)
        if saved is None:
            saved = saved_seconds(cycle.snapshot, model, self._load)
            memo[key] = saved
        return saved

    def score(self, cycle: Cycle, task: Task, candidates: NDArray[np.intp]) -> F64 | None:
        if task.model is None or not cycle.snapshot.node_models:
            return None  # no opinion: every candidate would score 0
        gpus = max(1.0, task.gpu_milli_total / MILLI)
        saved = self.saved(cycle, task.model)[candidates]
        if saved.size == 0:
            return np.zeros(0, dtype=np.float64)
        lost = saved.max() - saved
        return np.asarray(np.maximum(0.0, MAX_SCORE - lost * gpus / self._per_point))


_s: type[ScorePlugin] = ModelCacheScore
