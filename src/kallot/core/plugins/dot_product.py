"""Score: Dot-product (Tetris-style), the openb paper's ``02-DotProd`` baseline.

Node vector: free ``[cpu / 128 cores, GPU milli / 8 GPUs]``; task vector: its request on the
same scale (dimExt ``merge``, norm ``max``). Score ``int(100 * (1 - dot / 2))``: the smallest
dot product wins, i.e. the node whose free resources align least with the request.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from kallot.core.framework.cycle import Cycle
from kallot.core.framework.plugin import MAX_SCORE, ScorePlugin
from kallot.core.workload import Task

MAX_SPEC_CPU = 128_000  # the authors' MaxSpecCpu, milli-CPU
MAX_SPEC_GPU = 8_000  # MaxSpecGpu, milli-GPU


def free_gpu_milli(cycle: Cycle, rows: NDArray[np.intp]) -> NDArray[np.int64]:
    """Idle milli-GPU per node (healthy GPUs only)."""
    s, x = cycle.snapshot, cycle.scratch
    free = np.where(s.gpu_healthy[rows], s.gpu_cap_milli[rows] - x.gpu_used_milli[rows], 0)
    return np.asarray(free.sum(axis=1), dtype=np.int64)


class DotProduct:
    name: ClassVar[str] = "DotProduct"

    def score(self, cycle: Cycle, task: Task, candidates: NDArray[np.intp]) -> NDArray[np.float64]:
        s, x = cycle.snapshot, cycle.scratch
        cpu_left = (s.node_cpu_milli[candidates] - x.node_cpu_used[candidates]) / MAX_SPEC_CPU
        gpu_left = free_gpu_milli(cycle, candidates) / MAX_SPEC_GPU
        dot = cpu_left * (task.cpu_milli / MAX_SPEC_CPU) + gpu_left * (
            task.gpu_milli_total / MAX_SPEC_GPU
        )
        return np.floor(MAX_SCORE * (1.0 - dot / 2.0))


_: type[ScorePlugin] = DotProduct
