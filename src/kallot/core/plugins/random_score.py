"""Score + DeviceScore: Random-fit, the openb paper's ``01-Random`` baseline.

One feasible node, drawn uniformly with the session's seeded rng, scores MAX_SCORE and the rest
0 (the authors' PreScore draws ``rand.Intn(len(feasible))``); a GPU share goes to a GPU drawn
uniformly among those that can take it. Whole GPUs take the lowest-index idle GPUs.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from kallot.core.framework.cycle import Cycle
from kallot.core.framework.plugin import MAX_SCORE, DeviceScorePlugin, ScorePlugin
from kallot.core.workload import Task


class RandomScore:
    name: ClassVar[str] = "RandomScore"

    def score(self, cycle: Cycle, task: Task, candidates: NDArray[np.intp]) -> NDArray[np.float64]:
        out = np.zeros(candidates.size, dtype=np.float64)
        out[int(cycle.rng.integers(candidates.size))] = MAX_SCORE
        return out


class RandomGpu:
    name: ClassVar[str] = "RandomGpu"

    def choose(
        self, cycle: Cycle, task: Task, node: int, feasible: NDArray[np.intp]
    ) -> tuple[int, ...] | None:
        req = task.gpu
        if req is None or not (req.count == 1 and req.is_fractional) or feasible.size == 0:
            return None
        return (int(feasible[int(cycle.rng.integers(feasible.size))]),)


_s: type[ScorePlugin] = RandomScore
_d: type[DeviceScorePlugin] = RandomGpu
