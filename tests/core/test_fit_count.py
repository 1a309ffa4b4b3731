"""fit.count_per_row: the popcount fast path agrees with numpy's bool sum."""

from __future__ import annotations

import numpy as np
import pytest

from kallot.core import fit


@pytest.mark.parametrize("shape", [(7, 8), (7, 16), (7, 3), (0, 8), (7, 0)])
def test_count_per_row_matches_sum(shape: tuple[int, int]) -> None:
    mask = np.random.default_rng(0).random(shape) > 0.5
    got = fit.count_per_row(mask)
    assert got.dtype == np.int64
    assert got.tolist() == mask.sum(axis=1).tolist()


def test_count_per_row_non_contiguous() -> None:
    mask = (np.random.default_rng(1).random((5, 16)) > 0.5)[:, ::2]  # 8 columns, strided
    assert fit.count_per_row(mask).tolist() == mask.sum(axis=1).tolist()
