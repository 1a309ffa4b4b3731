"""core.sharing_frag: stranded capacity of share and MIG GPUs (tables, arithmetic in comments)."""

from __future__ import annotations

import numpy as np
import pytest

from kallot.core import sharing_frag


@pytest.mark.parametrize(
    ("left_c", "left_m", "stranded"),
    [
        (1.0, 1.0, 0.0),  # idle: everything usable
        (0.0, 0.0, 0.0),  # full: nothing left to strand
        (0.8, 0.1, 0.7),  # memory-bound: 0.8 compute, 0.1 memory -> 0.7 compute stranded
        (0.25, 0.75, 0.5),  # compute-bound: 0.5 memory stranded
        (0.5, 0.5, 0.0),  # balanced
        (1.0, 0.0, 1.0),  # all memory taken by a client with little compute
    ],
)
def test_share_fragment(left_c: float, left_m: float, stranded: float) -> None:
    got = sharing_frag.share_fragment(np.array([left_c]), np.array([left_m]))
    assert got[0] == pytest.approx(stranded)


@pytest.mark.parametrize(
    ("instances", "stranded"),
    [
        ([], 0.0),  # empty: 8 free, a 7g (8 slices) fits
        ([("3g.40gb", 0)], 0.0),  # 4 free, 3g@4 (4 slices) fits
        ([("1g.10gb", 3)], 3 / 8),  # 7 free, largest that fits is 3g@4 (4): 3 stranded
        # 6 free (1-3, 5-7); 3g/4g/7g blocked, the largest that fits has 2 slices (2g@2): 6 - 2
        ([("1g.10gb", 0), ("1g.10gb", 4)], 4 / 8),
    ],
)
def test_mig_fragment(instances: list[tuple[str, int]], stranded: float) -> None:
    assert sharing_frag.mig_fragment("A100-80GB", instances) == pytest.approx(stranded)
