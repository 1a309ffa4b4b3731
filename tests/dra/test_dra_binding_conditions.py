"""Devices with binding conditions (KEP-5007) in the DRA allocator: upstream (v0.36,
DRADeviceBindingConditions on) tries the pools that have such devices after the others and
records the device's ``bindingConditions`` / ``bindingFailureConditions`` in each result;
kallot's policy prefers devices without them, its upstream-order search puts those pools last,
and the allocation status carries both lists. The differential suite's case class for this is
in ``kallot.testing.dra_cases`` (pools with binding conditions on all or some devices)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kallot.config.dra import (
    allocation_status,
    claim_from_json,
    device_class_from_json,
    slice_from_json,
)
from kallot.core.dra.allocator import Inventory, _binding_last, allocate
from kallot.core.dra.model import Device, Placement, Pool, assemble_pools
from kallot.core.dra.policy import FirstFit, KallotPolicy
from kallot.core.errors import ConfigError
from kallot.testing.dra import NVIDIA, claim, exactly, nvidia_classes, nvidia_node_slices

GPU = "gpu.nvidia.com"

COND = ["example.com/attached"]
FAIL = ["example.com/failed"]


def _two_pools() -> list[dict[str, Any]]:
    """Pool ``a-waits`` (sorted first by name) whose GPUs have binding conditions, pool ``n1``
    whose GPUs have none; both on node n1."""
    waits = copy.deepcopy(nvidia_node_slices("n1", gpus=2))
    for s in waits:
        s["metadata"]["name"] = f"a-waits-{s['metadata']['name']}"
        s["spec"]["pool"]["name"] = "a-waits"
        for d in s["spec"]["devices"]:
            d["bindingConditions"] = COND
            d["bindingFailureConditions"] = FAIL
    return [*waits, *nvidia_node_slices("n1", gpus=2)]


def world(slices: list[dict[str, Any]]) -> Inventory:
    pools, skipped = assemble_pools([slice_from_json(s) for s in slices])
    assert not skipped
    return Inventory(pools, {c.name: c for c in map(device_class_from_json, nvidia_classes())})


def test_devices_without_binding_conditions_win_and_first_fit_tries_them_first() -> None:
    """Upstream's first fit (FirstFit here) takes pool n1's gpu-0 although pool a-waits sorts
    first: pools with binding conditions come last. kallot's policy also takes n1's GPU."""
    inv = world(_two_pools())
    c = claim_from_json(claim("c", [exactly("gpu", GPU)]))
    for policy in (KallotPolicy(), FirstFit()):
        out = allocate([c], "n1", {}, inv, policy=policy)
        assert out.ok, out.reason
        (r,) = out.allocations["default/c"].results
        assert (r.pool, r.binding_conditions) == ("n1", ())


def test_binding_conditions_are_recorded_in_the_result_and_status() -> None:
    """Three GPUs wanted, two without conditions: the third comes from pool a-waits, its
    result carries the device's conditions, and the status JSON writes them."""
    inv = world(_two_pools())
    c = claim_from_json(claim("c", [exactly("gpu", GPU, count=3)]))
    out = allocate([c], "n1", {}, inv, policy=KallotPolicy())
    assert out.ok, out.reason
    alloc = out.allocations["default/c"]
    waiting = [r for r in alloc.results if r.pool == "a-waits"]
    assert len(waiting) == 1
    assert waiting[0].binding_conditions == tuple(COND)
    assert waiting[0].binding_failure_conditions == tuple(FAIL)
    rows = allocation_status(alloc)["devices"]["results"]
    assert [r.get("bindingConditions") for r in rows if r["pool"] == "a-waits"] == [COND]
    assert all("bindingConditions" not in r for r in rows if r["pool"] == "n1")


def test_a_bad_binding_condition_is_a_one_line_error() -> None:
    s = nvidia_node_slices("n1", gpus=1)[0]
    s["spec"]["devices"][0]["bindingConditions"] = [7]
    with pytest.raises(ConfigError) as exc:
        slice_from_json(s)
    assert "bindingConditions[0]" in str(exc.value) and "\n" not in str(exc.value)


def test_pool_order_keeps_name_order_within_each_part() -> None:
    place = Placement(node_name="n1")

    def pool(name: str, waits: bool) -> Pool:
        dev = Device(NVIDIA, name, "d", place, binding_conditions=tuple(COND) if waits else ())
        return Pool(NVIDIA, name, 1, (dev,))

    pools = [pool("a", True), pool("b", False), pool("c", True), pool("d", False)]
    assert [p.name for p in _binding_last(pools)] == ["b", "d", "a", "c"]
