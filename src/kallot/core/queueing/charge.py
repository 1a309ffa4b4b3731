"""What one task costs a queue: a vector over ``QueueTree.axes`` in integer units.

``Charger`` is built once per session from the tree and the Snapshot. ``placed`` charges what a
placement actually took (its devices say which model, how much compute and memory);
``estimate`` charges a pending task before it has a node (used for demand and the reclaim
precondition only; hard limits are always checked on ``placed``). ``capacity`` is what the
cluster offers on every axis, the amount fair share splits.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from numpy.typing import NDArray

from kallot.core import mig
from kallot.core.decision import DeviceAssignment
from kallot.core.queueing.queue_tree import (
    CPU,
    GPU,
    GPU_MEMORY,
    GPU_VALUE,
    MEMORY,
    QueueTree,
    model_resource,
)
from kallot.core.resources import MILLI
from kallot.core.snapshot import Snapshot
from kallot.core.workload import Task

I64 = NDArray[np.int64]


class Charger:
    """Charges tasks to queue resource vectors for one Snapshot. Read-only after construction."""

    def __init__(self, tree: QueueTree, snapshot: Snapshot) -> None:
        self.tree = tree
        self.snapshot = snapshot
        self.n_axes = len(tree.axes)
        ax = tree.axis
        self._cpu, self._mem = ax[CPU], ax[MEMORY]
        self._gpu, self._gpu_mem, self._value = ax[GPU], ax[GPU_MEMORY], ax[GPU_VALUE]
        # Per snapshot model code: its value weight and its per-model axis (-1 = no such axis).
        self.model_value = np.array([tree.value_of(m) for m in snapshot.models], dtype=np.float64)
        self.model_axis = np.array(
            [ax.get(model_resource(m), -1) for m in snapshot.models], dtype=np.int64
        )
        usable = snapshot.gpu_valid & snapshot.gpu_healthy
        codes = snapshot.gpu_model[usable]
        self._model_count = np.bincount(codes, minlength=len(snapshot.models)).astype(np.int64)
        self._model_mem = np.zeros(len(snapshot.models), dtype=np.int64)
        for code in range(len(snapshot.models)):
            mems = snapshot.gpu_mem_mib[usable & (snapshot.gpu_model == code)]
            self._model_mem[code] = int(mems.min()) if mems.size else 0

    def zeros(self) -> I64:
        return np.zeros(self.n_axes, dtype=np.int64)

    def placed(self, task: Task, node: int, devices: Iterable[DeviceAssignment]) -> I64:
        """What ``task`` holds with ``devices`` on ``node``."""
        out = self.zeros()
        out[self._cpu] = task.cpu_milli
        out[self._mem] = task.mem_mib
        for d in devices:
            code = int(self.snapshot.gpu_model[node, d.slot])
            # A whole GPU of an oversubscribed time-sliced device is charged more than 1000
            # milli of capacity, but it is still one GPU-equivalent to its queue.
            milli = min(d.milli, MILLI)
            out[self._gpu] += milli
            out[self._gpu_mem] += d.mem_mib
            out[self._value] += int(milli * self.model_value[code])
            axis = int(self.model_axis[code])
            if axis >= 0:
                out[axis] += milli
        return out

    def estimate(self, task: Task) -> I64:
        """What ``task`` will probably hold once placed (it has no devices yet).

        GPU memory and value are those of the allowed model with the fewest GPU memory and the
        lowest value among models present (a task can always land there), so an estimate never
        overstates a demand; a per-model axis is charged only when one model is allowed.
        """
        out = self.zeros()
        out[self._cpu] = task.cpu_milli
        out[self._mem] = task.mem_mib
        req = task.gpu
        if req is None or req.count == 0:
            return out
        codes = self._allowed_codes(req.models)
        # A MIG instance is charged like its placement (core.fit.mig_assignment): its compute
        # slices in milli-GPU and its memory slices of the GPU's memory.
        shape = _mig_shape(req.mig_profile) if req.mig_profile else None
        milli = shape[0] if shape else min(req.milli, MILLI)
        total = req.count * milli
        out[self._gpu] = total
        if codes.size == 0:
            return out
        mem = int(self._model_mem[codes].min())
        out[self._gpu_mem] = req.count * (
            mem * shape[1] // mig.MEMORY_SLICES if shape else req.memory_for(mem)
        )
        out[self._value] = int(total * float(self.model_value[codes].min()))
        if codes.size == 1 and self.model_axis[codes[0]] >= 0:
            out[int(self.model_axis[codes[0]])] = total
        return out

    def capacity(self) -> I64:
        """What the cluster offers per axis (schedulable nodes, healthy GPUs)."""
        s = self.snapshot
        out = self.zeros()
        ok = s.node_schedulable
        out[self._cpu] = int(s.node_cpu_milli[ok].sum())
        out[self._mem] = int(s.node_mem_mib[ok].sum())
        usable = s.gpu_valid & s.gpu_healthy & ok[:, None]
        codes = s.gpu_model[usable]
        out[self._gpu] = MILLI * int(usable.sum())
        out[self._gpu_mem] = int(s.gpu_mem_mib[usable].sum())
        out[self._value] = int(MILLI * float(self.model_value[codes].sum())) if codes.size else 0
        for code in range(len(s.models)):
            axis = int(self.model_axis[code])
            if axis >= 0:
                out[axis] = MILLI * int((codes == code).sum())
        return out

    def _allowed_codes(self, models: frozenset[str]) -> NDArray[np.int64]:
        present = np.flatnonzero(self._model_count > 0)
        if not models:
            return present.astype(np.int64)
        allowed = self.snapshot.model_codes(models).astype(np.int64)
        return np.intersect1d(allowed, present)


def _mig_shape(name: str) -> tuple[int, int] | None:
    """(milli, memory slices) of a MIG profile name; the fewest memory slices over the models
    that have it ('1g.10gb' is 1 slice on an A100-80GB, 2 on an A100-40GB), so an estimate
    never overstates; the compute is the same on every model (the name's 'Ng')."""
    found = [p for table in mig.PROFILES.values() for p in table if p.name == name]
    if not found:
        return None
    return found[0].milli, min(p.mem_slices for p in found)
