"""``core.dra.allocator.Usage.copy``: the allocator scores candidates against a copy of the
search's starting state (issue 19 speed), so the copy must equal a fresh replay of the
allocations and stay independent of the original (hand-worked amounts)."""

from __future__ import annotations

from fractions import Fraction

from kallot.config.dra import slice_from_json
from kallot.core.dra.allocator import Usage
from kallot.core.dra.model import ClaimAllocation, Result, assemble_pools
from kallot.testing.dra import NVIDIA, nvidia_node_slices

GI = Fraction(2**30)
MEM = f"{NVIDIA}/memory"


def _state() -> tuple[Usage, list[ClaimAllocation]]:
    pools, skipped = assemble_pools(
        [slice_from_json(s) for s in nvidia_node_slices("n1", gpus=1, shared=1)]
    )
    assert not skipped
    allocs = [
        ClaimAllocation((Result("r", NVIDIA, "n1", "gpu-0"),)),  # the plain GPU, exclusive
        ClaimAllocation(
            (Result("r", NVIDIA, "n1", "gpu-1", share_id="a", consumed={MEM: 20 * GI}),)
        ),
    ]
    return Usage(pools, allocs), allocs


def test_copy_equals_a_replay_and_is_independent() -> None:
    """gpu-0 is held whole, gpu-1 carries one 20Gi share. In the copy, a 30Gi share more on
    gpu-1 makes 50Gi there and the plain GPU is released; the original still says 20Gi, one
    share and gpu-0 held. Undone in the copy, it equals the original again."""
    usage, _ = _state()
    gpu0, gpu1 = usage.devices[(NVIDIA, "n1", "gpu-0")], usage.devices[(NVIDIA, "n1", "gpu-1")]
    twin = usage.copy()
    assert (twin.exclusive, twin.shares, twin.consumed) == (
        usage.exclusive,
        usage.shares,
        usage.consumed,
    )
    twin.take(gpu1, {MEM: 30 * GI})
    twin.release(gpu0, {})
    assert twin.consumed[gpu1.id][MEM] == 50 * GI and twin.shares[gpu1.id] == 2
    assert not twin.in_use(gpu0)
    assert usage.consumed[gpu1.id][MEM] == 20 * GI and usage.shares[gpu1.id] == 1
    assert usage.in_use(gpu0)
    twin.release(gpu1, {MEM: 30 * GI})
    twin.take(gpu0, {})
    assert (twin.exclusive, twin.shares, twin.consumed) == (
        usage.exclusive,
        usage.shares,
        usage.consumed,
    )
