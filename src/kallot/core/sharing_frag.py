"""Fragmentation across sharing modes, in GPU-equivalents: what a GPU has free but cannot give.

Where it sits: pure measures used by the SharingFrag plugin (GPU choice for memory-sized shares),
by MigFit through ``core.mig.headroom`` and by the fleet report; ``core.frag`` keeps measuring
milli-GPU fragments against a target workload (the openb policies), untouched.

- A share GPU (MPS or time-sliced) with ``l`` of its compute and ``m`` of its memory free
  (fractions) can give at most ``min(l, m)`` of both together: the rest of the larger one,
  ``|l - m|``, is stranded (compute no memory is left to go with, or memory no compute). An idle
  or a full GPU strands nothing.
- A MIG GPU strands the free memory slices that the largest instance it can still create does
  not cover: ``(free slices - slices of the largest placeable profile) / 8``. Empty: 0; one
  3g@0 in use: 4 free, a 3g@4 still fits: 0; one 1g@3 in use: 7 free, the largest that fits is
  a 3g@4 (4 slices): 3/8.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from kallot.core import mig

F64 = NDArray[np.float64]


def share_fragment(left_compute: F64, left_memory: F64) -> F64:
    """Stranded fraction of share GPUs with ``left_*`` free (fractions in [0, 1])."""
    lc = np.clip(left_compute, 0.0, 1.0)
    lm = np.clip(left_memory, 0.0, 1.0)
    partly = (np.minimum(lc, lm) < 1.0) & (np.maximum(lc, lm) > 0.0)
    return np.where(partly, np.abs(lc - lm), 0.0)


def mig_fragment(model: str, instances: list[tuple[str, int]]) -> float:
    """Stranded fraction of one MIG GPU with live ``instances`` (profile, start)."""
    table = mig.PROFILES[model]
    occupied = 0
    for name, _start in instances:
        p = mig.profile(model, name)
        assert p is not None, name
        occupied += p.mem_slices
    free = mig.MEMORY_SLICES - occupied
    largest = max(
        (p.mem_slices for p in table if mig.placements(model, instances, p.name)), default=0
    )
    return (free - largest) / mig.MEMORY_SLICES
