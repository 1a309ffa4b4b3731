"""Filter + Score + MIG device choice: one MIG instance of the requested profile.

Where it sits: in every built-in profile's filters (``core.policies.FILTERS``); DeviceFit passes
MIG requests through to it. The Framework asks it (``choose_mig``) for the instance on the chosen
node, and scores MIG tasks with it alone (other score plugins measure milli-GPU fragments, which
say nothing about MIG slots).

A GPU can serve a request for profile P when it is valid, healthy, in MIG mode, of a model that
has P (and that the request allows), the request accepts MIG (isolation never rules MIG out), and

- a live instance of P is idle (static layout), or
- the GPU is dynamic (``Snapshot.gpu_mig_dynamic``) and P fits once every idle instance is
  destroyed (``core.mig.reconfigure`` then finds the cheapest change).

Choice on a node, best first: an idle existing instance (on the GPU with the most compute in
use, so partly used GPUs fill first), else the reconfiguration with the smallest
``Plan.key`` = (instances destroyed, loss of headroom largest profile first, start).
Node score: the same order as ranks over the candidates, 100 for the best.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from kallot.core import mig
from kallot.core.decision import MigInstance, MigReconfiguration
from kallot.core.framework.cycle import Cycle, StateKey
from kallot.core.framework.plugin import MAX_SCORE, FilterPlugin, Rejection, ScorePlugin
from kallot.core.resources import SharingMode
from kallot.core.snapshot import Scratch, Snapshot
from kallot.core.workload import DeviceRequest, Task

F64 = NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class MigChoice:
    """The instance a task gets on one GPU, and the layout change it needs (None: exists)."""

    slot: int
    instance: MigInstance
    reconfiguration: MigReconfiguration | None
    key: tuple[int, ...]  # smaller is better, comparable across GPUs and nodes


@dataclass(frozen=True, slots=True)
class _Gpus:
    """The snapshot's MIG GPUs: node row, slot and model name of each."""

    node: NDArray[np.intp]
    slot: NDArray[np.intp]
    model: tuple[str, ...]


_GPUS: StateKey[_Gpus] = StateKey("MigFit/gpus")
_CACHE: StateKey[dict[tuple[str, str, int], tuple[int, MigChoice | None]]] = StateKey("MigFit/best")


def mig_gpus(snapshot: Snapshot) -> _Gpus:
    s = snapshot
    ok = s.gpu_valid & s.gpu_healthy & (s.gpu_mode == SharingMode.MIG)
    node, slot = np.nonzero(ok)
    return _Gpus(
        node, slot, tuple(s.models[int(s.gpu_model[n, g])] for n, g in zip(node, slot, strict=True))
    )


def best_on_gpu(
    snapshot: Snapshot, scratch: Scratch, node: int, slot: int, *, model: str, profile: str
) -> MigChoice | None:
    """The best way to give one ``profile`` instance on GPU (node, slot), or None."""
    instances = scratch.mig_instances(node, slot)
    idle = [s for name, s, used in instances if name == profile and not used]
    if idle:
        used_compute = sum(
            p.compute for name, _, used in instances if used and (p := mig.profile(model, name))
        )
        start = min(idle)
        return MigChoice(slot, MigInstance(profile=profile, start=start), None, (0, -used_compute))
    dynamic = snapshot.gpu_mig_dynamic
    if dynamic is None or not dynamic[node, slot]:
        return None
    plan = mig.reconfigure(model, instances, profile)
    if plan is None:
        return None
    created = MigInstance(profile=plan.create[0], start=plan.create[1])
    rec = MigReconfiguration(
        node=snapshot.node_names[node],
        slot=slot,
        uuid=snapshot.gpu_uuid[node][slot],
        destroy=tuple(MigInstance(profile=n, start=s) for n, s in plan.destroy),
        create=(created,),
    )
    return MigChoice(slot, created, rec, (1, *plan.key))


def _allowed(req: DeviceRequest, model: str) -> bool:
    return (
        req.accepts(SharingMode.MIG)
        and (not req.models or model in req.models)
        and mig.profile(model, req.mig_profile) is not None
    )


class MigFit:
    name: ClassVar[str] = "MigFit"

    def _gpus(self, cycle: Cycle) -> _Gpus:
        gpus = cycle.session.get(_GPUS)
        if gpus is None:
            gpus = mig_gpus(cycle.snapshot)
            cycle.session.put(_GPUS, gpus)
        return gpus

    def best_on_node(self, cycle: Cycle, req: DeviceRequest, node: int) -> MigChoice | None:
        """The best choice over the node's MIG GPUs (cached per node version and profile)."""
        cache = cycle.session.get(_CACHE)
        if cache is None:
            cache = {}
            cycle.session.put(_CACHE, cache)
        models = ",".join(sorted(req.models))
        key = (req.mig_profile, models, node)
        version = int(cycle.scratch.node_version[node])
        hit = cache.get(key)
        if hit is not None and hit[0] == version:
            return hit[1]
        gpus = self._gpus(cycle)
        best: MigChoice | None = None
        for i in np.flatnonzero(gpus.node == node):
            model = gpus.model[i]
            if not _allowed(req, model):
                continue
            c = best_on_gpu(
                cycle.snapshot,
                cycle.scratch,
                node,
                int(gpus.slot[i]),
                model=model,
                profile=req.mig_profile,
            )
            if c is not None and (best is None or (c.key, c.slot) < (best.key, best.slot)):
                best = c
        cache[key] = (version, best)
        return best

    def filter(self, cycle: Cycle, task: Task) -> NDArray[np.bool_]:
        n = cycle.snapshot.n_nodes
        req = task.gpu
        if req is None or not req.mig_profile:
            return np.ones(n, dtype=np.bool_)
        out = np.zeros(n, dtype=np.bool_)
        for node in np.unique(self._gpus(cycle).node):
            out[node] = self.best_on_node(cycle, req, int(node)) is not None
        return out

    def explain(
        self, cycle: Cycle, task: Task, rejected: NDArray[np.bool_]
    ) -> tuple[Rejection, ...]:
        req = task.gpu
        if req is None or not req.mig_profile:
            return ()
        s = cycle.snapshot
        gpus = self._gpus(cycle)
        has_mig = np.zeros(s.n_nodes, dtype=np.bool_)
        has_model = np.zeros(s.n_nodes, dtype=np.bool_)
        for i, node in enumerate(gpus.node):
            has_mig[node] = True
            has_model[node] |= _allowed(req, gpus.model[i])
        out = [
            Rejection("no healthy GPU in MIG mode", rejected & ~has_mig, True),
            Rejection(
                f"no MIG GPU offers {req.mig_profile}"
                + (f" among models [{', '.join(sorted(req.models))}]" if req.models else ""),
                rejected & has_mig & ~has_model,
                True,
            ),
            Rejection(
                f"no idle MIG instance {req.mig_profile}, and no "
                "GPU's layout can change to add one without touching running work",
                rejected & has_model,
            ),
        ]
        return tuple(r for r in out if r.nodes.any())

    def score(self, cycle: Cycle, task: Task, candidates: NDArray[np.intp]) -> F64:
        req = task.gpu
        if req is None or not req.mig_profile or candidates.size == 0:
            return np.zeros(candidates.size, dtype=np.float64)
        keys = []
        for node in candidates:
            c = self.best_on_node(cycle, req, int(node))
            keys.append(c.key if c is not None else (9,))
        order = sorted(set(keys))
        rank = {k: i for i, k in enumerate(order)}
        span = max(1, len(order))
        return np.array([MAX_SCORE * (1 - rank[k] / span) for k in keys], dtype=np.float64)

    def choose_mig(self, cycle: Cycle, task: Task, node: int) -> MigChoice | None:
        req = task.gpu
        if req is None or not req.mig_profile:
            return None
        return self.best_on_node(cycle, req, node)


_f: type[FilterPlugin] = MigFit
_s: type[ScorePlugin] = MigFit
