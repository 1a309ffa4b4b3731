"""Score: GPU clustering, the openb paper's ``03-GpuClustering`` baseline.

Tasks are tagged by shape (a GPU share, or k whole GPUs); nodes prefer tasks of the tags they
already hold. With ``base = 25 * (8 GPUs - free milli) / 8 GPUs`` (integer division): 75 + base
when the node holds only this tag, 50 + base when it holds it among others, 25 + base when it
holds no tag, base when it holds only other tags. CPU-only tasks score 0.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from kallot.core.framework.cycle import Cycle
from kallot.core.framework.plugin import ScorePlugin
from kallot.core.helpers.baselines import MAX_SPEC_GPU, free_gpu_milli
from kallot.core.snapshot import shape_column
from kallot.core.workload import Task


class GpuClustering:
    name: ClassVar[str] = "GpuClustering"

    def score(self, cycle: Cycle, task: Task, candidates: NDArray[np.intp]) -> NDArray[np.float64]:
        col = shape_column(task, cycle.snapshot.max_gpus)
        if col < 0:
            return np.zeros(candidates.size, dtype=np.float64)
        shapes = cycle.scratch.node_shapes[candidates]
        has_tag = shapes[:, col] > 0
        n_tags = (shapes > 0).sum(axis=1)
        base = 25 * (MAX_SPEC_GPU - free_gpu_milli(cycle, candidates)) // MAX_SPEC_GPU
        out = np.where(
            has_tag,
            np.where(n_tags == 1, 75, 50),
            np.where(n_tags == 0, 25, 0),
        )
        return (out + base).astype(np.float64)


_: type[ScorePlugin] = GpuClustering
