"""The allocator on the node agent's dynamic-MIG slices agrees with kallot's MIG geometry
(``core.mig``): every sequence of 1g..7g claims and releases leaves a valid layout, and a claim
is refused only when ``core.mig.placements`` has no start for it."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from kallot.config.dra import claim_from_json, device_class_from_json, slice_from_json
from kallot.core import mig as core_mig
from kallot.core.dra.allocator import Inventory, allocate
from kallot.core.dra.model import ClaimAllocation, assemble_pools
from kallot.core.dra.policy import FirstFit, KallotPolicy
from kallot.node import dra as node_dra
from kallot.node.discovery import build_inventory
from kallot.node.fake import load_inventory_file
from kallot.testing.dra import claim, exactly

MODEL = "A100-80GB"
PROFILES = [p.name for p in core_mig.PROFILES[MODEL]]
DATA = Path(__file__).parents[1] / "node" / "data"


def _inventory() -> Inventory:
    spec = load_inventory_file(DATA / "dra-a100-3.yaml")
    inv = build_inventory(spec.raw(), spec.sharing_setting())
    slices = node_dra.resource_slices(inv, node_dra.DraOptions(node="n1"))
    pools, _ = assemble_pools([slice_from_json(s) for s in slices])
    classes = {c.name: c for c in map(device_class_from_json, node_dra.device_classes())}
    return Inventory(pools, classes)


INV = _inventory()
ATTR = f"device.attributes['{node_dra.DRIVER}']"
DEVICES = {d.name: d for p in INV.pools for d in p.devices}


def layout(live: dict[str, ClaimAllocation]) -> list[tuple[str, int]]:
    out = []
    for alloc in live.values():
        for r in alloc.results:
            d = DEVICES[r.device]
            start = d.attributes[f"{node_dra.DRIVER}/placementStart"]
            assert isinstance(start, int)  # an int attribute; the union also holds str, Version
            out.append((str(d.attributes[f"{node_dra.DRIVER}/profile"]), int(start)))
    return out


@settings(max_examples=120, deadline=None)
@given(
    st.lists(st.one_of(st.sampled_from(PROFILES), st.integers(0, 6)), min_size=1, max_size=14),
    st.booleans(),
)
def test_mig_claims_follow_core_mig_geometry(ops: list[str | int], first_fit: bool) -> None:
    policy = FirstFit() if first_fit else KallotPolicy()
    live: dict[str, ClaimAllocation] = {}
    for k, op in enumerate(ops):
        if isinstance(op, int):
            if live:
                del live[sorted(live)[op % len(live)]]
            continue
        now = layout(live)
        c = claim_from_json(
            claim(
                f"c{k}", [exactly("m", node_dra.CLASS_MIG, selectors=[f"{ATTR}.profile == '{op}'"])]
            )
        )
        out = allocate(
            [c], "n1", {}, Inventory(INV.pools, INV.classes, list(live.values())), policy=policy
        )
        possible = core_mig.placements(MODEL, now, op)
        assert out.ok == bool(possible), (now, op, out.reason)
        if out.ok:
            live[c.key] = out.allocations[c.key]
            assert core_mig.valid_layout(MODEL, layout(live)) == ""
            assert layout({c.key: out.allocations[c.key]})[0][1] in possible
