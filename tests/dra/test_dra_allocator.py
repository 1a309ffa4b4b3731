"""The DRA allocator (``core.dra``) on ``gpu.nvidia.com``-shaped and ``gpu.kallot.io`` slices:
one test per feature, each expected allocation worked out by hand in its docstring."""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from kallot.config.dra import claim_from_json, device_class_from_json, slice_from_json
from kallot.core.dra.allocator import Budget, Inventory, Outcome, Policy, allocate
from kallot.core.dra.model import ClaimAllocation, Result, assemble_pools
from kallot.core.dra.policy import FirstFit, KallotPolicy
from kallot.node import dra as node_dra
from kallot.node.discovery import build_inventory
from kallot.node.fake import load_inventory_file
from kallot.testing.dra import NVIDIA, claim, exactly, nvidia_classes, nvidia_node_slices

GPU = "gpu.nvidia.com"
MIG = "mig.nvidia.com"
ROOT = "resource.kubernetes.io/pcieRoot"


def world(
    slices: Sequence[dict[str, Any]],
    used: Sequence[str] = (),
    classes: Sequence[dict[str, Any]] | None = None,
    driver: str = NVIDIA,
    pool: str = "n1",
) -> Inventory:
    pools, skipped = assemble_pools([slice_from_json(s) for s in slices])
    assert not skipped
    cls = {c.name: c for c in map(device_class_from_json, classes or nvidia_classes())}
    allocated = [ClaimAllocation((Result("r", driver, pool, name),)) for name in used]
    return Inventory(pools, cls, allocated)


def run(
    inv: Inventory,
    *claims: dict[str, Any],
    node: str = "n1",
    labels: dict[str, str] | None = None,
    policy: Policy | None = None,
) -> Outcome:
    return allocate(
        [claim_from_json(c) for c in claims],
        node,
        labels or {},
        inv,
        policy=policy or KallotPolicy(),
    )


def picked(out: Outcome, name: str = "c") -> list[str]:
    assert out.ok, out.reason
    return [r.device for r in out.allocations[f"default/{name}"].results]


def test_one_gpu_goes_to_the_fuller_pcie_root_first_fit_takes_gpu_0() -> None:
    """GPU 4 is in use: root pci0000:40 (GPUs 4-7) has 3 free, root pci0000:00 (0-3) has 4.
    kallot packs into the broken root (gpu-5, the first of it), keeping root 00 whole;
    kube-scheduler's first fit takes gpu-0."""
    inv = world(nvidia_node_slices("n1"), used=["gpu-4"])
    c = claim("c", [exactly("gpu", GPU)])
    assert picked(run(inv, c)) == ["gpu-5"]
    assert picked(run(inv, c, policy=FirstFit())) == ["gpu-0"]


def test_match_attribute_keeps_two_gpus_on_one_pcie_root() -> None:
    """GPUs 3 and 4 used: each root has 3 free. Two GPUs on one root: {0,1} (root 00) is the
    first valid pair in order; every pair leaves one free GPU on its root (island fit ties),
    so the tie-break by order keeps gpu-0, gpu-1. Without the constraint kallot still keeps
    them together (locality first)."""
    inv = world(nvidia_node_slices("n1"), used=["gpu-3", "gpu-4"])
    con = [{"matchAttribute": ROOT}]
    out = run(inv, claim("c", [exactly("gpu", GPU, count=2)], constraints=con))
    assert picked(out) == ["gpu-0", "gpu-1"]
    inv2 = world(nvidia_node_slices("n1"), used=["gpu-1", "gpu-2", "gpu-3", "gpu-4"])
    # free: gpu-0 (root 00) and 5,6,7 (root 40): the pair must be from root 40
    out = run(inv2, claim("c", [exactly("gpu", GPU, count=2)]))
    assert picked(out) == ["gpu-5", "gpu-6"]
    out = run(inv2, claim("c", [exactly("gpu", GPU, count=2)]), policy=FirstFit())
    assert picked(out) == ["gpu-0", "gpu-5"]  # first fit splits the pair over two roots


def test_match_attribute_fails_when_no_root_has_enough() -> None:
    inv = world(nvidia_node_slices("n1", gpus=4), used=["gpu-1", "gpu-3"])  # 0 on 00, 2 on 40
    out = run(
        inv, claim("c", [exactly("gpu", GPU, count=2)], constraints=[{"matchAttribute": ROOT}])
    )
    assert not out.ok and "default/c" in out.reason


def test_distinct_attribute_spreads_over_roots() -> None:
    inv = world(nvidia_node_slices("n1"))
    con = [{"distinctAttribute": ROOT}]
    assert picked(run(inv, claim("c", [exactly("gpu", GPU, count=2)], constraints=con))) == [
        "gpu-0",
        "gpu-4",
    ]
    out = run(inv, claim("c", [exactly("gpu", GPU, count=3)], constraints=con))
    assert not out.ok  # only two roots


def test_all_mode_takes_every_matching_device_and_fails_if_one_is_in_use() -> None:
    inv = world(nvidia_node_slices("n1", gpus=4))
    out = run(inv, claim("c", [exactly("gpu", GPU, allocationMode="All")]))
    assert picked(out) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    busy = world(nvidia_node_slices("n1", gpus=4), used=["gpu-2"])
    assert not run(busy, claim("c", [exactly("gpu", GPU, allocationMode="All")])).ok


def test_first_available_takes_the_first_subrequest_that_fits() -> None:
    """Six GPUs used, two free: 'four' cannot be satisfied, 'two' can: results name gpu/two."""
    inv = world(nvidia_node_slices("n1"), used=[f"gpu-{i}" for i in range(6)])
    req = {
        "name": "gpu",
        "firstAvailable": [
            {"name": "four", "deviceClassName": GPU, "count": 4},
            {"name": "two", "deviceClassName": GPU, "count": 2},
            {"name": "one", "deviceClassName": GPU, "count": 1},
        ],
    }
    out = run(inv, claim("c", [req]))
    assert picked(out) == ["gpu-6", "gpu-7"]
    assert {r.request for r in out.allocations["default/c"].results} == {"gpu/two"}


def test_version_and_quantity_selectors() -> None:
    inv = world(nvidia_node_slices("n1", gpus=2))
    a = f"device.attributes['{NVIDIA}']"
    ok = [
        f"{a}.driverVersion.isGreaterThan(semver('570.0.0'))",
        f"{a}.cudaComputeCapability.compareTo(semver('9.0.0')) >= 0",
        f"device.capacity['{NVIDIA}'].memory.compareTo(quantity('40Gi')) > 0",
        f"{a}.productName.startsWith('NVIDIA H100')",
    ]
    assert picked(run(inv, claim("c", [exactly("gpu", GPU, selectors=ok)]))) == ["gpu-0"]
    too_new = [f"{a}.driverVersion.isGreaterThan(semver('580.0.0'))"]
    out = run(inv, claim("c", [exactly("gpu", GPU, selectors=too_new)]))
    assert not out.ok and "request gpu" in out.reason


def test_selector_runtime_error_names_claim_request_and_expression() -> None:
    inv = world(nvidia_node_slices("n1", gpus=1))
    expr = f"device.attributes['{NVIDIA}'].noSuchAttribute == 'x'"
    out = run(inv, claim("c", [exactly("gpu", GPU, selectors=[expr])]))
    assert not out.ok
    assert "claim default/c, request gpu" in out.reason and expr in out.reason
    assert "\n" not in out.reason


def test_admin_access_uses_a_device_in_use() -> None:
    inv = world(nvidia_node_slices("n1", gpus=1), used=["gpu-0"])
    assert not run(inv, claim("c", [exactly("gpu", GPU)])).ok
    out = run(inv, claim("c", [exactly("gpu", GPU, adminAccess=True)]))
    assert picked(out) == ["gpu-0"]
    assert out.allocations["default/c"].results[0].admin_access


def test_taints_keep_claims_off_unless_tolerated() -> None:
    inv = world(nvidia_node_slices("n1", gpus=2, taint_gpu=0))
    assert picked(run(inv, claim("c", [exactly("gpu", GPU)]))) == ["gpu-1"]
    out = run(inv, claim("c", [exactly("gpu", GPU, count=2)]))
    assert not out.ok
    tol = [{"key": "nvidia.com/unhealthy", "operator": "Exists", "effect": "NoSchedule"}]
    out = run(inv, claim("c", [exactly("gpu", GPU, count=2, tolerations=tol)]))
    assert picked(out) == ["gpu-0", "gpu-1"]


def test_partitionable_mig_keeps_the_largest_placement_free() -> None:
    """An idle A100 offered as partitions (counters per GPU). A 1g.5gb at start 0-3 would
    break the 4g.20gb (slices 0-3); at 4-6 the 4g stays possible. Among 4, 5, 6: start 6
    leaves 3g@4? no (needs 4-7); start 4 leaves 2g@... the count of partitions that still
    fit decides: after 1g@6: 1g 0-5 (6), 2g 0,2,4 (3), 3g@0, 4g@0 = 11; after 1g@5: 1g x6,
    2g 0,2 (2), 3g@0, 4g@0 = 10; after 1g@4: 1g x6, 2g 0,2, 3g@0, 4g@0 = 10. So 1g@6."""
    inv = world(nvidia_node_slices("n1", gpus=0, dynamic_mig=1))
    sel = [f"device.attributes['{NVIDIA}'].profile == '1g.5gb'"]
    out = run(inv, claim("c", [exactly("mig", MIG, selectors=sel)]))
    assert picked(out) == ["gpu-0-mig-1g5gb-6"]
    first = run(inv, claim("c", [exactly("mig", MIG, selectors=sel)]), policy=FirstFit())
    assert picked(first) == ["gpu-0-mig-1g5gb-0"]


def test_counters_never_overcommit_and_packing_prefers_a_started_gpu() -> None:
    """GPU 0 has a 4g.20gb at 0 (slices 0-3 gone); GPU 1 is idle. A 3g.20gb fits only at 4 on
    GPU 0 or at 0/4 on GPU 1: kallot keeps GPU 1 whole (no new GPU opened). A 7g.40gb can
    only go to GPU 1; a second 4g.20gb on GPU 0 is impossible (counters)."""
    inv = world(nvidia_node_slices("n1", gpus=0, dynamic_mig=2), used=["gpu-0-mig-4g20gb-0"])
    a = f"device.attributes['{NVIDIA}']"
    out = run(inv, claim("c", [exactly("mig", MIG, selectors=[f"{a}.profile == '3g.20gb'"])]))
    assert picked(out) == ["gpu-0-mig-3g20gb-4"]
    out = run(inv, claim("c", [exactly("mig", MIG, selectors=[f"{a}.profile == '7g.40gb'"])]))
    assert picked(out) == ["gpu-1-mig-7g40gb-0"]
    sel = [f"{a}.profile == '4g.20gb' && {a}.parentUUID == 'GPU-n1-0000'"]
    assert not run(inv, claim("c", [exactly("mig", MIG, selectors=sel)])).ok


def share(name: str, memory: str | None = None, count: int = 1) -> dict[str, Any]:
    fields: dict[str, Any] = {"count": count}
    if memory:
        fields["capacity"] = {"requests": {"memory": memory}}
    return claim(name, [exactly("s", GPU, **fields)])


def shared_world(consumed: dict[str, str]) -> Inventory:
    inv = world(nvidia_node_slices("n1", gpus=0, shared=2))
    allocated = [
        ClaimAllocation(
            (
                Result(
                    "s",
                    NVIDIA,
                    "n1",
                    dev,
                    share_id=f"x{k}",
                    consumed={f"{NVIDIA}/memory": slice_from_json_quantity(q)},
                ),
            )
        )
        for k, (dev, q) in enumerate(consumed.items())
    ]
    return Inventory(inv.pools, inv.classes, allocated)


def slice_from_json_quantity(q: str) -> Fraction:
    from kallot.core.dra.model import parse_quantity

    return parse_quantity(q)


def test_consumable_capacity_packs_shares_and_rounds_by_policy() -> None:
    """gpu-1 already has a 40Gi share; a 20.5Gi request rounds up to 21Gi (1Gi steps) and goes
    to gpu-1 (fuller); first fit takes gpu-0. 50Gi no longer fits gpu-1: gpu-0."""
    inv = shared_world({"gpu-1": "40Gi"})
    out = run(inv, share("c", "20.5Gi"))
    assert picked(out) == ["gpu-1"]
    r = out.allocations["default/c"].results[0]
    assert r.consumed == {f"{NVIDIA}/memory": Fraction(21 * 2**30)}
    assert r.share_id
    assert picked(run(inv, share("c", "20.5Gi"), policy=FirstFit())) == ["gpu-0"]
    assert picked(run(inv, share("c", "50Gi"))) == ["gpu-0"]


def test_consumable_capacity_default_takes_the_whole_gpu_and_limits_hold() -> None:
    inv = shared_world({"gpu-1": "1Gi"})
    out = run(inv, share("c"))  # no request: the policy default, the whole 80Gi
    assert picked(out) == ["gpu-0"]
    assert not run(inv, share("c", "80Gi", count=2)).ok  # gpu-1 has 79Gi left
    assert not run(inv, share("c", "81Gi")).ok


def test_several_claims_of_one_pod_get_distinct_devices() -> None:
    inv = world(nvidia_node_slices("n1", gpus=2))
    out = run(inv, claim("a", [exactly("gpu", GPU)]), claim("b", [exactly("gpu", GPU)]))
    assert picked(out, "a") + picked(out, "b") == ["gpu-0", "gpu-1"]
    busy = world(nvidia_node_slices("n1", gpus=2), used=["gpu-0"])
    out = run(busy, claim("a", [exactly("gpu", GPU)]), claim("b", [exactly("gpu", GPU)]))
    assert not out.ok
    # explain: per request, what matches and what is taken
    assert "claim default/a, request gpu: wants 1, 2 devices match, 1 in use" in out.reason


def test_an_allocated_shared_claim_is_only_reserved_where_it_is_reachable() -> None:
    inv = world(nvidia_node_slices("n1", gpus=1))
    first = run(inv, claim("c", [exactly("gpu", GPU)]))
    alloc = first.allocations["default/c"]
    done = claim_from_json(claim("c", [exactly("gpu", GPU)]))
    from dataclasses import replace

    allocated = replace(done, allocation=alloc)
    out = allocate([allocated], "n1", {}, inv, policy=KallotPolicy())
    assert out.ok and out.reserve_only == ("default/c",) and not out.allocations
    elsewhere = allocate([allocated], "n2", {}, inv, policy=KallotPolicy())
    assert not elsewhere.ok and "n2" in elsewhere.reason


def test_network_attached_devices_follow_their_node_selector() -> None:
    fabric = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "fabric"},
        "spec": {
            "driver": NVIDIA,
            "pool": {"name": "fabric", "generation": 1, "resourceSliceCount": 1},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r1"]}]}
                ]
            },
            "devices": [{"name": "gpu-f", "attributes": {"type": {"string": "gpu"}}}],
        },
    }
    inv = world([fabric])
    out = run(inv, claim("c", [exactly("gpu", GPU)]), node="n7", labels={"rack": "r1"})
    assert picked(out) == ["gpu-f"]
    sel = out.allocations["default/c"].node_selector
    assert sel is not None and sel.matches("n9", {"rack": "r1"}) and not sel.matches("n9", {})
    assert not run(inv, claim("c", [exactly("gpu", GPU)]), node="n8", labels={"rack": "r2"}).ok


def test_incomplete_or_old_pools_are_left_out() -> None:
    old = nvidia_node_slices("n1", gpus=2, generation=1)
    new = nvidia_node_slices("n1", gpus=1, dynamic_mig=1, generation=2)  # 2 slices
    pools, skipped = assemble_pools([slice_from_json(s) for s in [*old, new[1]]])
    assert not pools and skipped and "1 of 2" in skipped[0]
    pools, _ = assemble_pools([slice_from_json(s) for s in [*old, *new]])
    assert [p.generation for p in pools] == [2]
    assert [d.name for d in pools[0].devices][:1] == ["gpu-0"]


def kallot_slices(name: str, **opts: Any) -> list[dict[str, Any]]:
    data = Path(__file__).parents[1] / "node" / "data"
    spec = load_inventory_file(data / name)
    inv = build_inventory(spec.raw(), spec.sharing_setting())
    return node_dra.resource_slices(inv, node_dra.DraOptions(node="n1", **opts))


def test_kallot_agent_slices_shares_and_classes() -> None:
    """The node agent's own slices (hgx-h100-8: 8 MPS GPUs): a 20Gi share with 30% compute goes
    to the GPU that already holds a share (gpu-3), not gpu-0."""
    inv0 = world(
        kallot_slices("hgx-h100-8.yaml"), classes=node_dra.device_classes(), driver=node_dra.DRIVER
    )
    res = Result(
        "s",
        node_dra.DRIVER,
        "n1",
        "gpu-3",
        share_id="a",
        consumed={
            f"{node_dra.DRIVER}/memory": Fraction(10 * 2**30),
            f"{node_dra.DRIVER}/compute": Fraction(50),
        },
    )
    inv = Inventory(inv0.pools, inv0.classes, [ClaimAllocation((res,))])
    c = claim(
        "c",
        [
            exactly(
                "s",
                node_dra.CLASS_SHARE,
                capacity={"requests": {"memory": "20Gi", "compute": "30"}},
            )
        ],
    )
    out = run(inv, c)
    assert picked(out) == ["gpu-3"]
    consumed = out.allocations["default/c"].results[0].consumed
    assert consumed[f"{node_dra.DRIVER}/compute"] == 30
    assert consumed[f"{node_dra.DRIVER}/memory"] == 20 * 2**30
    too_much = claim(
        "c", [exactly("s", node_dra.CLASS_SHARE, capacity={"requests": {"compute": "101"}})]
    )
    assert not run(inv, too_much).ok


def test_kallot_agent_dynamic_mig_slices_allocate_within_counters() -> None:
    """dra-a100-3: GPU 0 (A100 80GB) in MIG mode, offered as dynamic placements. Three
    1g.10gb claims of one pod get three distinct placements on it; eight cannot be placed
    (seven memory slices hold a 1g each, the counters refuse the eighth)."""
    slices = kallot_slices("dra-a100-3.yaml")
    inv = world(slices, classes=node_dra.device_classes(), driver=node_dra.DRIVER)
    a = f"device.attributes['{node_dra.DRIVER}']"
    req = exactly("m", node_dra.CLASS_MIG, selectors=[f"{a}.profile == '1g.10gb'"])
    out = run(inv, *[claim(f"c{k}", [req]) for k in range(3)])
    assert out.ok, out.reason
    names = [r.device for k in range(3) for r in out.allocations[f"default/c{k}"].results]
    assert len(set(names)) == 3
    assert run(inv, *[claim(f"c{k}", [req]) for k in range(7)]).ok
    assert not run(inv, *[claim(f"c{k}", [req]) for k in range(8)]).ok


def test_bounded_search_reports_the_bound() -> None:
    inv = world(nvidia_node_slices("n1"))
    c = claim_from_json(claim("c", [exactly("gpu", GPU, count=4)]))
    budget = Budget(steps=3, upstream_steps=3)
    out = allocate([c], "n1", {}, inv, policy=KallotPolicy(), budget=budget)
    assert not out.ok and out.exhausted and "search bound reached" in out.reason
    assert "the search gave up" in out.reason


def test_policy_bound_falls_back_to_first_fit_in_upstream_order() -> None:
    """The policy's search running out of steps is not the end: the first-fit search in
    upstream's order goes on (upstream gives up only at its 10 s filter budget)."""
    inv = world(nvidia_node_slices("n1"))
    c = claim_from_json(claim("c", [exactly("gpu", GPU, count=4)]))
    out = allocate([c], "n1", {}, inv, policy=KallotPolicy(), budget=Budget(steps=3))
    assert out.ok, out.reason
    assert [r.device for r in out.allocations["default/c"].results] == [
        f"gpu-{i}" for i in range(4)
    ]


@pytest.mark.parametrize("bad", ["device.driver ==", "device.attributes['x'.y"])
def test_selector_that_does_not_compile_is_one_line_naming_claim_request_expression(
    bad: str,
) -> None:
    from kallot.core.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        claim_from_json(claim("c", [exactly("gpu", GPU, selectors=[bad])]))
    text = str(err.value)
    assert "claim default/c, request gpu" in text and bad in text and "\n" not in text


def test_extended_resource_nvidia_gpu_is_served_by_the_backing_class() -> None:
    """A pod asking nvidia.com/gpu: 2 (container 0) and the implicit class name for one MIG
    device (container 1): a claim with one request per container and resource, allocated
    like any claim; a resource no class backs is left to device plugins."""
    from kallot.core.dra.extended import extended_resource_claim

    inv = world(nvidia_node_slices("n1", gpus=2, dynamic_mig=1))
    containers = [
        {"nvidia.com/gpu": 2, "example.com/fpga": 1},
        {"deviceclass.resource.kubernetes.io/mig.nvidia.com": 1},
    ]
    special = extended_resource_claim("default", "p", containers, inv.classes)
    assert special is not None
    assert [(r.name, r.exactly.device_class if r.exactly else "") for r in special.requests] == [
        ("container-0-request-1", "gpu.nvidia.com"),
        ("container-1-request-0", "mig.nvidia.com"),
    ]
    out = allocate([special], "n1", {}, inv, policy=KallotPolicy())
    assert out.ok, out.reason
    results = out.allocations["default/p-extended-resources"].results
    assert [r.device for r in results][:2] == ["gpu-0", "gpu-1"]
    assert results[2].device.startswith("gpu-2-mig-1g5gb")
    assert extended_resource_claim("default", "p", [{"example.com/fpga": 1}], inv.classes) is None


def test_per_device_node_selection_and_all_nodes() -> None:
    """A pool with perDeviceNodeSelection: gpu-a only on n1, gpu-b only on n2, gpu-c anywhere.
    On n2 with gpu-c taken, the claim gets gpu-b and its node selector pins n2; on n1, gpu-a."""
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "per-device"},
        "spec": {
            "driver": NVIDIA,
            "pool": {"name": "fabric", "generation": 3, "resourceSliceCount": 1},
            "perDeviceNodeSelection": True,
            "devices": [
                {"name": "gpu-a", "nodeName": "n1", "attributes": {"type": {"string": "gpu"}}},
                {"name": "gpu-b", "nodeName": "n2", "attributes": {"type": {"string": "gpu"}}},
                {"name": "gpu-c", "allNodes": True, "attributes": {"type": {"string": "gpu"}}},
            ],
        },
    }
    inv = world([body], used=["gpu-c"], pool="fabric")
    out = run(inv, claim("c", [exactly("gpu", GPU)]), node="n2")
    assert picked(out) == ["gpu-b"]
    sel = out.allocations["default/c"].node_selector
    assert sel is not None and sel.matches("n2", {}) and not sel.matches("n1", {})
    assert picked(run(inv, claim("c", [exactly("gpu", GPU)]), node="n1")) == ["gpu-a"]
    free = world([body], pool="fabric")
    out = run(free, claim("c", [exactly("gpu", GPU, count=2)]), node="n3")
    assert not out.ok  # only gpu-c reaches n3
    out = run(free, claim("c", [exactly("gpu", GPU)]), node="n3")
    assert picked(out) == ["gpu-c"] and out.allocations["default/c"].node_selector is None
