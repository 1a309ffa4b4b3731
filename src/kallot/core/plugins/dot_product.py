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
from kallot.core.helpers.baselines import MAX_SPEC_CPU, MAX_SPEC_GPU, free_gpu_milli
from kallot.core.workload import Task


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
