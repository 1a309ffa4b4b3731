"""What the openb paper's baseline scores share (DotProduct, BestFit, GpuClustering): the
authors' resource scales and the idle milli-GPU of a node.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from kallot.core.framework.cycle import Cycle

MAX_SPEC_CPU = 128_000  # the authors' MaxSpecCpu, milli-CPU
MAX_SPEC_GPU = 8_000  # MaxSpecGpu, milli-GPU


def free_gpu_milli(cycle: Cycle, rows: NDArray[np.intp]) -> NDArray[np.int64]:
    """Idle milli-GPU per node (healthy GPUs only)."""
    s, x = cycle.snapshot, cycle.scratch
    free = np.where(s.gpu_healthy[rows], s.gpu_cap_milli[rows] - x.gpu_used_milli[rows], 0)
    return np.asarray(free.sum(axis=1), dtype=np.int64)
