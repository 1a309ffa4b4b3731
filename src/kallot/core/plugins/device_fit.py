"""Filter: the node has ``count`` healthy GPUs of an allowed model and mode that can each take
one device of the task's request (core.fit holds the per-GPU rule).

This is the FGD simulator's Open-Gpu-Share filter generalized to memory, sharing modes and
isolation. CPU-only tasks pass every node. A share that accepts MIG also passes nodes with a
healthy MIG GPU of an allowed model: the MigFit filter, which every shipped preset lists with
DeviceFit (``config/profiles/*.yaml``) and a profile serving such shares must too, keeps only
those where a MIG instance can hold it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from kallot.core import fit
from kallot.core.framework.cycle import SLOT_FIT, Cycle, StateKey
from kallot.core.framework.plugin import FilterPlugin, Rejection
from kallot.core.resources import SharingMode
from kallot.core.snapshot import Snapshot
from kallot.core.workload import DeviceRequest, Task


@dataclass(slots=True)
class _Fits:
    """One request signature's cached fit: per-slot mask, per-node mask, both current for every
    node as of ``mark`` (``Scratch.mark``)."""

    slots: NDArray[np.bool_]
    nodes: NDArray[np.bool_]
    mark: int


_FITS: StateKey[dict[tuple[object, ...], _Fits]] = StateKey("DeviceFit/fits")
# Off: the per-GPU rule over every node on every call (what the cache must equal; tests).
CACHE_FITS = True


def _gib(mib: int) -> str:
    return f"{mib / 1024:.1f}".rstrip("0").rstrip(".") + " GiB"


class DeviceFit:
    name: ClassVar[str] = "DeviceFit"

    def __init__(self) -> None:
        # Nodes with a healthy MIG GPU of the allowed models, per snapshot: health and modes do
        # not change within a session, and on clusters without MIG this is None, so shares
        # pay nothing for MIG (the mask over [N, G] cost ~5% of a placement on 10,000 nodes).
        self._mig_snapshot: Snapshot | None = None
        self._mig_nodes: dict[tuple[object, ...], NDArray[np.bool_] | None] = {}

    def _nodes_with_mig(self, s: Snapshot, req: DeviceRequest) -> NDArray[np.bool_] | None:
        """Nodes with a healthy MIG GPU of an allowed model that has a profile holding ``req``
        (``fit.mig_profile_for``): a share too large for every MIG instance on a node must not
        pass it (nothing there could take it). Cached per snapshot and request shape."""
        if self._mig_snapshot is not s:
            self._mig_snapshot = s
            self._mig_nodes = {}
        key = (req.models, req.milli, req.mem_mib, req.isolation, req.modes)
        if key not in self._mig_nodes:
            mig_gpu = fit.model_ok(s, req) & s.gpu_healthy & (s.gpu_mode == SharingMode.MIG)
            if mig_gpu.any():
                kinds = {
                    (int(s.gpu_model[n, g]), int(s.gpu_mem_mib[n, g]))
                    for n, g in zip(*np.nonzero(mig_gpu), strict=True)
                }
                for code, mem in kinds:
                    if not fit.mig_profile_for(req, s.models[code], mem):
                        mig_gpu &= ~((s.gpu_model == code) & (s.gpu_mem_mib == mem))
            nodes = mig_gpu.any(axis=1)
            self._mig_nodes[key] = nodes if nodes.any() else None
        return self._mig_nodes[key]

    def _fits(
        self, cycle: Cycle, req: DeviceRequest
    ) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
        """``([N, G] slots that can take one device of req, [N] nodes with req.count of
        them)``, cached per request signature for the session and recomputed only for the
        nodes that changed since (``Scratch.changed_since``): one placement dirties one node, so
        a placement pays neither the per-GPU rule nor a version compare over the whole
        cluster. The arrays are read-only to callers."""
        cache = cycle.session.get(_FITS)
        if cache is None:
            cache = {}
            cycle.session.put(_FITS, cache)
        key = (req.whole, req.milli, req.mem_mib, req.count, req.models, req.modes, req.isolation)
        entry = cache.get(key) if CACHE_FITS else None
        x = cycle.scratch
        if entry is None:
            slots = fit.slot_fit(cycle.snapshot, x, req)
            entry = cache[key] = _Fits(slots, fit.count_per_row(slots) >= req.count, x.mark)
        elif entry.mark != x.mark:
            stale = x.changed_since(entry.mark)
            if stale.size == 1:
                # One touched node (the usual case: the last placement): the same rule on
                # that node's slots by plain indexing, cheaper than the row gathers.
                r = int(stale[0])
                one = fit.slot_fit_node(cycle.snapshot, x, req, r)
                entry.slots[r] = one
                entry.nodes[r] = (
                    bool(one.any()) if req.count == 1 else int(np.count_nonzero(one)) >= req.count
                )
            else:
                rows = fit.slot_fit_rows(cycle.snapshot, x, req, stale)
                entry.slots[stale] = rows
                entry.nodes[stale] = (
                    rows.any(axis=1) if req.count == 1 else fit.count_per_row(rows) >= req.count
                )
            entry.mark = x.mark
        slots, nodes = entry.slots.view(), entry.nodes.view()
        slots.setflags(write=False)
        nodes.setflags(write=False)
        return slots, nodes

    def filter(self, cycle: Cycle, task: Task) -> NDArray[np.bool_] | None:
        req = task.gpu
        if req is None or req.count == 0:
            return None  # CPU-only: every node passes
        if req.mig_profile:
            return None  # served by the MigFit filter (every shipped preset)
        slots, out = self._fits(cycle, req)
        cycle.state.put(SLOT_FIT, slots)  # reused by DeviceScore plugins on the chosen node
        if fit.may_use_mig(req):
            # A share that accepts MIG may also take a MIG instance: pass nodes with a healthy
            # MIG GPU of an allowed model; the MigFit filter (every shipped preset) decides
            # exactly which of them have an instance for it.
            mig_nodes = self._nodes_with_mig(cycle.snapshot, req)
            if mig_nodes is not None:
                out = out | mig_nodes
        return out

    def explain(
        self, cycle: Cycle, task: Task, rejected: NDArray[np.bool_]
    ) -> tuple[Rejection, ...]:
        req = task.gpu
        if req is None or req.count == 0:
            return ()
        s, x = cycle.snapshot, cycle.scratch
        if req.mig_profile:
            return ()  # MigFit explains
        out: list[Rejection] = []
        left = rejected.copy()

        def take(message: str, mask: NDArray[np.bool_], unresolvable: bool = False) -> None:
            nonlocal left
            hit = left & mask
            if hit.any():
                out.append(Rejection(message, hit, unresolvable))
                left = left & ~hit

        total = s.gpu_valid.sum(axis=1)
        take("no GPUs", total == 0, True)
        take(f"fewer than {req.count} GPUs on the node", total < req.count, True)
        model = fit.model_ok(s, req)
        if req.models:
            models = ", ".join(sorted(req.models))
            n_model = model.sum(axis=1)
            take(f"GPU model not in [{models}]", n_model == 0, True)
            take(f"fewer than {req.count} GPUs of model [{models}]", n_model < req.count, True)
        mode = model & fit.mode_ok(s, req)
        if req.whole:
            take(
                f"GPU sharing mode or isolation ({req.isolation.name.lower()}) rules out the "
                "node's GPUs",
                mode.sum(axis=1) < req.count,
                True,
            )
        else:
            take(
                "no GPU in a sharing mode the task accepts "
                f"({', '.join(sorted(m.label for m in req.modes))}; isolation "
                f"{req.isolation.name.lower()})",
                mode.sum(axis=1) < req.count,
                True,
            )
        usable = mode & s.gpu_healthy
        take("GPUs unhealthy", usable.sum(axis=1) < req.count)
        if req.whole:
            idle = usable & (x.gpu_clients == 0) & (x.gpu_used_milli == 0)
            n_idle = idle.sum(axis=1)
            short = n_idle < req.count
            if (left & short).any():
                most = int(n_idle[left & short].max())
                take(f"fewer than {req.count} idle GPUs (most idle on one node: {most})", short)
        else:
            left_milli = np.where(usable, s.gpu_cap_milli - x.gpu_used_milli, -1)
            short_milli = (left_milli >= req.milli).sum(axis=1) < 1
            if (left & short_milli).any():
                best = int(left_milli[left & short_milli].max())
                take(
                    f"no GPU with {req.milli} milli-GPU free, largest free is {max(best, 0)}",
                    short_milli,
                )
            need = fit.share_memory(s.gpu_mem_mib, req)
            left_mem = np.where(usable, s.gpu_cap_mem - x.gpu_used_mem, -1)
            short_mem = ((left_mem >= need) & usable).sum(axis=1) < 1
            if (left & short_mem).any():
                best = int(left_mem[left & short_mem].max())
                want = int(need[left & short_mem].max())
                take(
                    f"no GPU with {_gib(want)} free, largest free is {_gib(max(best, 0))}",
                    short_mem,
                )
            take("no GPU with a free client slot", np.ones_like(left))
        if left.any():
            out.append(Rejection("no GPU fits the request", left))
        return tuple(out)


_: type[FilterPlugin] = DeviceFit
