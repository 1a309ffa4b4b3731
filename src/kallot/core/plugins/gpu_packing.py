"""Score: GPU packing, the openb paper's ``04-GpuPacking`` baseline.

From high to low: (1) the task fits on partially used GPUs: ``100 - (free % of those GPUs)/10``,
at least 50; (2) it needs idle GPUs of a node already in use: ``50 - idle GPUs taken``, at least
33; (3) the node is entirely idle: ``max(33 - GPUs, GPUs)``. CPU-only tasks score 0 everywhere.
GPUs are matched tightest first, as the authors' SortedMilliGpuLeftIndexList.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from kallot.core.framework.cycle import Cycle
from kallot.core.framework.plugin import ScorePlugin
from kallot.core.resources import MILLI
from kallot.core.workload import Task


class GpuPacking:
    name: ClassVar[str] = "GpuPacking"

    def score(self, cycle: Cycle, task: Task, candidates: NDArray[np.intp]) -> NDArray[np.float64]:
        req = task.gpu
        k = candidates.size
        if req is None or req.count == 0 or req.milli == 0:
            return np.zeros(k, dtype=np.float64)
        s, x = cycle.snapshot, cycle.scratch
        valid = s.gpu_valid[candidates]
        left = np.where(valid, s.gpu_cap_milli[candidates] - x.gpu_used_milli[candidates], -1)
        n_gpus = valid.sum(axis=1)
        fully_free = ((left == MILLI) & valid).sum(axis=1)
        # Walk GPUs from least free to most free and take the first `count` that fit.
        order = np.sort(np.where(left >= req.milli, left, MILLI * 1000), axis=1)[:, : req.count]
        taken_free = (order == MILLI).sum(axis=1)
        ratio = (order * 100 // MILLI).sum(axis=1)
        case1 = np.maximum(100 - ratio // 10, 50)
        case2 = np.maximum(50 - taken_free, 33)
        case3 = np.maximum(33 - fully_free, fully_free)
        out = np.where(fully_free == n_gpus, case3, np.where(taken_free > 0, case2, case1))
        return out.astype(np.float64)


_: type[ScorePlugin] = GpuPacking
