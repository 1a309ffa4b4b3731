"""Score + DeviceScore: best fit by GPU memory for memory-sized shares (``mem_mib > 0``).

Where it sits: in the ``kallot`` profile (``core.policies``), before KallotScore. KallotScore's
fragmentation measure is in milli-GPU; a share that says its memory is usually bound by memory
(an LLM server asks a tenth of the compute and a third of the memory), so this plugin ranks by
memory: node score ``MAX_SCORE x (1 - f)`` where ``f`` is the smallest fraction of memory left
after placing on any GPU of the node that can take the share (``fit.slot_fit``), and the GPU
chosen is the one that leaves the least memory (then the least compute, then the lowest index).

A share without ``mem_mib`` (memory in proportion to compute: every openb pod) and whole-GPU or
MIG requests get None (no opinion) from the score and from ``choose``, so other plugins decide
exactly as without it. docs/design/005-sharing.md ("Fragmentation across modes") has the measurements.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from kallot.core import fit
from kallot.core.framework.cycle import Cycle
from kallot.core.framework.plugin import MAX_SCORE, DeviceScorePlugin, ScorePlugin
from kallot.core.workload import Task

F64 = NDArray[np.float64]


def _memory_sized(task: Task) -> bool:
    req = task.gpu
    return req is not None and req.is_fractional and req.mem_mib > 0


class MemoryFit:
    name: ClassVar[str] = "MemoryFit"

    def score(self, cycle: Cycle, task: Task, candidates: NDArray[np.intp]) -> F64 | None:
        if not _memory_sized(task):
            return None
        if candidates.size == 0:
            return np.zeros(0, dtype=np.float64)
        req = task.gpu
        assert req is not None
        s, x = cycle.snapshot, cycle.scratch
        ok = fit.slot_fit_rows(s, x, req, candidates)
        cap = np.maximum(s.gpu_cap_mem[candidates], 1)
        left = (s.gpu_cap_mem[candidates] - x.gpu_used_mem[candidates] - req.mem_mib) / cap
        best = np.where(ok, left, 1.0).min(axis=1) if ok.shape[1] else np.ones(candidates.size)
        return np.asarray(MAX_SCORE * (1.0 - np.clip(best, 0.0, 1.0)), dtype=np.float64)

    def choose(
        self, cycle: Cycle, task: Task, node: int, feasible: NDArray[np.intp]
    ) -> tuple[int, ...] | None:
        if not _memory_sized(task) or feasible.size == 0:
            return None
        req = task.gpu
        assert req is not None
        s, x = cycle.snapshot, cycle.scratch
        mem_left = s.gpu_cap_mem[node, feasible] - x.gpu_used_mem[node, feasible] - req.mem_mib
        milli_left = s.gpu_cap_milli[node, feasible] - x.gpu_used_milli[node, feasible]
        order = np.lexsort((feasible, milli_left, mem_left))
        return (int(feasible[order[0]]),)


_s: type[ScorePlugin] = MemoryFit
_d: type[DeviceScorePlugin] = MemoryFit
