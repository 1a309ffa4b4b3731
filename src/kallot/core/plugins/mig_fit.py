"""Filter + Score + MIG device choice: one MIG instance of the requested profile.

Where it sits: in every shipped preset's filters (``config/profiles/*.yaml``); DeviceFit passes
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

Shares that accept MIG (``fit.may_use_mig``): on a snapshot with a MIG GPU that could hold
them (``serves``), MigFit also decides the mechanism. Per node, every option is keyed by
``fit.option_key`` (opens a GPU, waste in GPU-equivalents, fraction left after placing):
each share slot that fits (``fit.slot_fit``, MPS or time-sliced) and the best MIG choice above
for the profile ``fit.mig_profile_for`` names on each MIG GPU. The filter passes a node when
any option exists, the score ranks nodes by their best option's key, and ``choose_mig`` returns
that option: a ``MigChoice`` (the share is charged the instance, ``fit.mig_assignment``) or a
``ShareChoice`` (a slot, charged the share as always). On snapshots without such a MIG GPU a
share is filtered by DeviceFit and scored by the profile's score plugins exactly as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from kallot.core import fit, mig
from kallot.core.decision import MigInstance, MigReconfiguration
from kallot.core.framework.cycle import Cycle, StateKey
from kallot.core.framework.plugin import (
    MAX_SCORE,
    FilterPlugin,
    MigChoice,
    MigChooserPlugin,
    Rejection,
    ScorePlugin,
    ShareChoice,
)
from kallot.core.resources import MILLI, SharingMode
from kallot.core.snapshot import Scratch, Snapshot
from kallot.core.workload import DeviceRequest, Task

F64 = NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class _Option:
    """The best way to serve a share that accepts MIG on one node, and its comparable key."""

    key: tuple[int | float, ...]
    choice: MigChoice | ShareChoice


@dataclass(frozen=True, slots=True)
class _Gpus:
    """The snapshot's MIG GPUs: node row, slot and model name of each."""

    node: NDArray[np.intp]
    slot: NDArray[np.intp]
    model: tuple[str, ...]
    kind: dict[tuple[str, int], NDArray[np.bool_]]  # (model, memory MiB) -> which GPUs


_GPUS: StateKey[_Gpus] = StateKey("MigFit/gpus")
_CACHE: StateKey[dict[tuple[str, str, int], tuple[int, MigChoice | None]]] = StateKey("MigFit/best")
_GPU_CACHE: StateKey[dict[tuple[int, int, str], tuple[int, MigChoice | None]]] = StateKey(
    "MigFit/gpu"
)
_TABLES: StateKey[dict[str, _Table]] = StateKey("MigFit/tables")
_SERVES: StateKey[dict[tuple[int, int, frozenset[str]], bool]] = StateKey("MigFit/serves")
_OPTIONS: StateKey[dict[tuple[int, int, str, int, int, int], tuple[int, _Option | None]]] = (
    StateKey("MigFit/options")
)


@dataclass(slots=True)
class _Table:
    """Per MIG GPU (index into ``_Gpus``), refreshed when its node's version moves: memory
    slices in use, and whether one instance of ``profile`` can be given (idle or created)."""

    version: NDArray[np.int64]
    used_slices: NDArray[np.int64]
    ok: NDArray[np.bool_]


# Primary option keys packed into one int64, exactly lexicographic on fit.option_key's rounded
# values: opens x 10^15 + waste x 10^6 x 10^8 + left_after x 10^6 x 10 + mechanism (0 share, 1 MIG).
# waste and left_after are in [0, 1] (so x 10^6 < 10^7 fits its field).
_NONE = np.iinfo(np.int64).max


def _pack(opens: NDArray[np.bool_], waste: F64, left: F64, mech: int) -> NDArray[np.int64]:
    w = np.rint(np.clip(waste, 0.0, 1.0) * 1e6).astype(np.int64)
    lf = np.rint(np.clip(left, 0.0, 1.0) * 1e6).astype(np.int64)
    return opens.astype(np.int64) * 10**15 + w * 10**8 + lf * 10 + mech


def mig_gpus(snapshot: Snapshot) -> _Gpus:
    s = snapshot
    ok = s.gpu_valid & s.gpu_healthy & (s.gpu_mode == SharingMode.MIG)
    node, slot = np.nonzero(ok)
    model = tuple(s.models[int(s.gpu_model[n, g])] for n, g in zip(node, slot, strict=True))
    mem = s.gpu_mem_mib[node, slot]
    kind: dict[tuple[str, int], NDArray[np.bool_]] = {}
    for i, m in enumerate(model):
        key = (m, int(mem[i]))
        if key not in kind:
            kind[key] = np.array([x == m for x in model], dtype=np.bool_) & (mem == mem[i])
    return _Gpus(node, slot, model, kind)


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


def _allowed(req: DeviceRequest, model: str, gpu_mem: int) -> str:
    """The profile ``req`` takes on a MIG GPU of ``model`` (``fit.mig_profile_for``), or ''."""
    if not req.accepts(SharingMode.MIG) or (req.models and model not in req.models):
        return ""
    return fit.mig_profile_for(req, model, gpu_mem)


def _used_slices(scratch: Scratch, node: int, slot: int, model: str) -> int:
    """Memory slices of the GPU's instances in use."""
    return sum(
        p.mem_slices
        for name, _, used in scratch.mig_instances(node, slot)
        if used and (p := mig.profile(model, name)) is not None
    )


class MigFit:
    name: ClassVar[str] = "MigFit"

    def _gpus(self, cycle: Cycle) -> _Gpus:
        gpus = cycle.session.get(_GPUS)
        if gpus is None:
            gpus = mig_gpus(cycle.snapshot)
            cycle.session.put(_GPUS, gpus)
        return gpus

    def _on_gpu(
        self, cycle: Cycle, node: int, slot: int, model: str, profile: str
    ) -> MigChoice | None:
        """``best_on_gpu``, cached per (GPU, profile) and node version."""
        cache = cycle.session.get(_GPU_CACHE)
        if cache is None:
            cache = {}
            cycle.session.put(_GPU_CACHE, cache)
        version = int(cycle.scratch.node_version[node])
        hit = cache.get((node, slot, profile))
        if hit is not None and hit[0] == version:
            return hit[1]
        c = best_on_gpu(cycle.snapshot, cycle.scratch, node, slot, model=model, profile=profile)
        cache[(node, slot, profile)] = (version, c)
        return c

    def best_on_node(self, cycle: Cycle, req: DeviceRequest, node: int) -> MigChoice | None:
        """The best choice over the node's MIG GPUs (cached per node version and profile)."""
        cache = cycle.session.get(_CACHE)
        if cache is None:
            cache = {}
            cycle.session.put(_CACHE, cache)
        models = ",".join(sorted(req.models))
        what = req.mig_profile or f"share:{req.milli}:{req.mem_mib}:{int(req.isolation)}"
        key = (what, models + ("" if req.accepts(SharingMode.MIG) else "!mig"), node)
        version = int(cycle.scratch.node_version[node])
        hit = cache.get(key)
        if hit is not None and hit[0] == version:
            return hit[1]
        gpus = self._gpus(cycle)
        best: MigChoice | None = None
        for i in np.flatnonzero(gpus.node == node):
            model = gpus.model[i]
            slot = int(gpus.slot[i])
            profile = _allowed(req, model, int(cycle.snapshot.gpu_mem_mib[node, slot]))
            if not profile:
                continue
            c = self._on_gpu(cycle, node, slot, model, profile)
            if c is not None and (best is None or (c.key, c.slot) < (best.key, best.slot)):
                best = c
        cache[key] = (version, best)
        return best

    def serves(self, cycle: Cycle, task: Task) -> bool:
        """Whether MigFit places ``task``: a MIG request, or a share that accepts MIG on a
        snapshot with a healthy MIG GPU whose model has a profile that holds it."""
        req = task.gpu
        if req is None or req.count == 0:
            return False
        if req.mig_profile:
            return True
        if not fit.may_use_mig(req):
            return False
        cache = cycle.session.get(_SERVES)
        if cache is None:
            cache = {}
            cycle.session.put(_SERVES, cache)
        shape = (req.milli, req.mem_mib, req.models)
        hit = cache.get(shape)
        if hit is None:
            gpus = self._gpus(cycle)
            mem = cycle.snapshot.gpu_mem_mib
            hit = any(
                _allowed(req, model, int(mem[n, g]))
                for n, g, model in zip(gpus.node, gpus.slot, gpus.model, strict=True)
            )
            cache[shape] = hit
        return hit

    def best_option(self, cycle: Cycle, req: DeviceRequest, node: int) -> _Option | None:
        """The best way to serve share ``req`` on ``node``, by ``fit.option_key`` over its share
        slots and its MIG GPUs (then the share before MIG, then MigChoice.key, then the slot),
        cached per node version and request shape."""
        cache = cycle.session.get(_OPTIONS)
        if cache is None:
            cache = {}
            cycle.session.put(_OPTIONS, cache)
        shape = (
            req.milli,
            req.mem_mib,
            ",".join(sorted(req.models)),
            int(req.isolation),
            sum(1 << int(m) for m in req.modes),
            node,
        )
        version = int(cycle.scratch.node_version[node])
        hit = cache.get(shape)
        if hit is not None and hit[0] == version:
            return hit[1]
        s, x = cycle.snapshot, cycle.scratch
        best: _Option | None = None
        for g in np.flatnonzero(fit.slot_fit_node(s, x, req, node)):
            slot = int(g)
            cap_c, cap_m = int(s.gpu_cap_milli[node, slot]), int(s.gpu_cap_mem[node, slot])
            milli, mem = fit.charge(s, node, slot, req)
            left_c = (cap_c - int(x.gpu_used_milli[node, slot]) - milli) / max(1, cap_c)
            left_m = (cap_m - int(x.gpu_used_mem[node, slot]) - mem) / max(1, cap_m)
            key: tuple[int | float, ...] = (
                *fit.option_key(
                    opens_gpu=int(x.gpu_clients[node, slot]) == 0
                    and int(x.gpu_used_milli[node, slot]) == 0,
                    charged=0.0,
                    needed=0.0,
                    left_after=min(left_c, left_m),
                ),
                0,
                slot,
            )
            if best is None or key < best.key:
                best = _Option(key, ShareChoice(slot, key))
        gpus = self._gpus(cycle)
        for i in np.flatnonzero(gpus.node == node):
            model, slot = gpus.model[i], int(gpus.slot[i])
            gpu_mem = int(s.gpu_mem_mib[node, slot])
            profile = _allowed(req, model, gpu_mem)
            if not profile:
                continue
            c = self._on_gpu(cycle, node, slot, model, profile)
            if c is None:
                continue
            p = mig.profile(model, profile)
            assert p is not None
            used = _used_slices(x, node, slot, model)
            needed = max(req.milli / MILLI, req.memory_for(gpu_mem) / gpu_mem)
            key = (
                *fit.option_key(
                    opens_gpu=used == 0,
                    charged=max(p.milli / MILLI, p.mem_slices / mig.MEMORY_SLICES),
                    needed=needed,
                    left_after=1 - (used + p.mem_slices) / mig.MEMORY_SLICES,
                ),
                1,
                *c.key,
                slot,
            )
            if best is None or key < best.key:
                best = _Option(key, c)
        cache[shape] = (version, best)
        return best

    def _table(self, cycle: Cycle, profile: str) -> _Table:
        """The per-GPU table of ``profile``, recomputed for GPUs whose node changed."""
        tables = cycle.session.get(_TABLES)
        if tables is None:
            tables = {}
            cycle.session.put(_TABLES, tables)
        gpus = self._gpus(cycle)
        t = tables.get(profile)
        if t is None:
            m = gpus.node.size
            t = _Table(np.full(m, -1, np.int64), np.zeros(m, np.int64), np.zeros(m, dtype=np.bool_))
            tables[profile] = t
        now = cycle.scratch.node_version[gpus.node]
        for i in np.flatnonzero(now != t.version):
            node, slot, model = int(gpus.node[i]), int(gpus.slot[i]), gpus.model[i]
            t.used_slices[i] = _used_slices(cycle.scratch, node, slot, model)
            t.ok[i] = (
                mig.profile(model, profile) is not None
                and self._on_gpu(cycle, node, slot, model, profile) is not None
            )
            t.version[i] = now[i]
        return t

    def _primary(self, cycle: Cycle, req: DeviceRequest) -> NDArray[np.int64]:
        """[N] packed primary key (``_pack``) of each node's best option for share ``req``;
        ``_NONE`` where nothing can serve it. Vectorized over share slots and MIG GPUs."""
        s, x = cycle.snapshot, cycle.scratch
        ok = fit.slot_fit(s, x, req)
        milli = req.milli
        need_mem = fit.share_memory(s.gpu_mem_mib, req)
        cap_c = np.maximum(s.gpu_cap_milli, 1)
        cap_m = np.maximum(s.gpu_cap_mem, 1)
        left = np.minimum(
            (s.gpu_cap_milli - x.gpu_used_milli - milli) / cap_c,
            (s.gpu_cap_mem - x.gpu_used_mem - need_mem) / cap_m,
        )
        opens = (x.gpu_clients == 0) & (x.gpu_used_milli == 0)
        code = np.where(ok, _pack(opens, np.zeros(left.shape), left, 0), _NONE)
        best = code.min(axis=1) if code.shape[1] else np.full(s.n_nodes, _NONE, np.int64)
        gpus = self._gpus(cycle)
        if gpus.node.size == 0:
            return np.asarray(best, dtype=np.int64)
        for (model, mem), kind in gpus.kind.items():
            profile = _allowed(req, model, mem)
            if not profile:
                continue
            p = mig.profile(model, profile)
            assert p is not None
            t = self._table(cycle, profile)
            sel = kind.copy()
            sel &= t.ok
            if not sel.any():
                continue
            needed = max(req.milli / MILLI, req.memory_for(mem) / mem)
            charged = max(p.milli / MILLI, p.mem_slices / mig.MEMORY_SLICES)
            used = t.used_slices[sel]
            c = _pack(
                used == 0,
                np.full(used.shape, charged - needed),
                1 - (used + p.mem_slices) / mig.MEMORY_SLICES,
                1,
            )
            np.minimum.at(best, gpus.node[sel], c)
        return np.asarray(best, dtype=np.int64)

    def filter(self, cycle: Cycle, task: Task) -> NDArray[np.bool_] | None:
        n = cycle.snapshot.n_nodes
        req = task.gpu
        if req is None or not self.serves(cycle, task):
            return None  # DeviceFit decides
        if not req.mig_profile:
            # a share that accepts MIG: any node with a share slot or a MIG option
            return np.asarray(self._primary(cycle, req) != _NONE, dtype=np.bool_)
        out = np.zeros(n, dtype=np.bool_)
        for node in np.unique(self._gpus(cycle).node):
            out[node] = self.best_on_node(cycle, req, int(node)) is not None
        return out

    def explain(
        self, cycle: Cycle, task: Task, rejected: NDArray[np.bool_]
    ) -> tuple[Rejection, ...]:
        req = task.gpu
        if req is None or not self.serves(cycle, task):
            return ()
        s = cycle.snapshot
        gpus = self._gpus(cycle)
        has_mig = np.zeros(s.n_nodes, dtype=np.bool_)
        has_model = np.zeros(s.n_nodes, dtype=np.bool_)
        for i, node in enumerate(gpus.node):
            has_mig[node] = True
            mem = int(s.gpu_mem_mib[node, gpus.slot[i]])
            has_model[node] |= bool(_allowed(req, gpus.model[i], mem))
        if not req.mig_profile:
            what = f"a share ({req.milli} milli-GPU" + (
                f", {req.mem_mib} MiB)" if req.mem_mib else ")"
            )
            return (
                Rejection(
                    f"no GPU takes {what}: no share slot fits it, and no MIG instance that "
                    "holds it is idle or can be created without touching running work",
                    rejected,
                ),
            )
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
        if req is None or candidates.size == 0 or not self.serves(cycle, task):
            return np.zeros(candidates.size, dtype=np.float64)
        if not req.mig_profile:
            return self._score_share(cycle, req, candidates)
        keys: list[tuple[int | float, ...]] = []
        for node in candidates:
            c = self.best_on_node(cycle, req, int(node))
            keys.append(c.key if c is not None else (9,))
        order = sorted(set(keys))
        rank = {k: i for i, k in enumerate(order)}
        span = max(1, len(order))
        return np.array([MAX_SCORE * (1 - rank[k] / span) for k in keys], dtype=np.float64)

    def _score_share(self, cycle: Cycle, req: DeviceRequest, candidates: NDArray[np.intp]) -> F64:
        """Nodes whose best option has the smallest full key (``best_option``) get MAX_SCORE;
        the others rank by their packed primary key (dense rank), below MAX_SCORE. Only nodes
        tied on the smallest primary key (opens, waste, left after, mechanism) are keyed in
        full: the full key differs from the primary only by MigChoice.key and the slot."""
        code = self._primary(cycle, req)[candidates]
        order, rank = np.unique(code, return_inverse=True)
        span = order.size + 1
        out = MAX_SCORE * (1 - (rank + 1) / span)
        tied = np.flatnonzero(code == order[0])
        if tied.size == 1 or order[0] % 10 == 0:
            # one node, or share options: equal keys up to the slot, the node order decides
            out[tied] = MAX_SCORE
            return np.asarray(out, dtype=np.float64)
        keys = []
        for i in tied:
            o = self.best_option(cycle, req, int(candidates[i]))
            keys.append(o.key[:-1] if o is not None else (9,))  # the slot never ranks nodes
        best = min(keys)
        for i, k in zip(tied, keys, strict=True):
            if k == best:
                out[i] = MAX_SCORE
        return np.asarray(out, dtype=np.float64)

    def choose_mig(self, cycle: Cycle, task: Task, node: int) -> MigChoice | ShareChoice | None:
        """The instance for a MIG request; for a share that MigFit serves, the chosen option
        (a MIG instance or a share slot) on ``node``."""
        req = task.gpu
        if req is None or not self.serves(cycle, task):
            return None
        if req.mig_profile:
            return self.best_on_node(cycle, req, node)
        o = self.best_option(cycle, req, node)
        return None if o is None else o.choice


_f: type[FilterPlugin] = MigFit
_s: type[ScorePlugin] = MigFit
_m: type[MigChooserPlugin] = MigFit
