"""Score: Best-fit, the openb paper's ``05-BestFit`` baseline.

``int(100 * (1 - [0.5 (cpu_left - cpu_req) / 128 cores + 0.5 (gpu_left - gpu_req) / 8 GPUs]))``,
then min-max normalized over the candidates to [0, 100] with integer arithmetic, as the
authors' NormalizeScore (all candidates score 0 when they tie).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from kallot.core.framework.cycle import Cycle
from kallot.core.framework.plugin import MAX_SCORE, ScorePlugin
from kallot.core.helpers.baselines import MAX_SPEC_CPU, MAX_SPEC_GPU, free_gpu_milli
from kallot.core.workload import Task


class BestFit:
    name: ClassVar[str] = "BestFit"

    def score(self, cycle: Cycle, task: Task, candidates: NDArray[np.intp]) -> NDArray[np.float64]:
        s, x = cycle.snapshot, cycle.scratch
        cpu_after = s.node_cpu_milli[candidates] - x.node_cpu_used[candidates] - task.cpu_milli
        gpu_after = free_gpu_milli(cycle, candidates) - task.gpu_milli_total
        waste = 0.5 * cpu_after / MAX_SPEC_CPU + 0.5 * gpu_after / MAX_SPEC_GPU
        raw = np.floor(MAX_SCORE * (1.0 - waste)).astype(np.int64)
        lo, hi = int(raw.min()), int(raw.max())
        if hi == lo:
            return np.zeros(candidates.size, dtype=np.float64)
        return ((raw - lo) * int(MAX_SCORE) // (hi - lo)).astype(np.float64)


_: type[ScorePlugin] = BestFit
