"""The DRA edge (``config.dra``): parsing resource.k8s.io/v1 objects, one-line errors, CEL
environment functions, and the claim's ``status.allocation`` for the bind step."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from kallot.config.dra import (
    allocation_status,
    claim_from_json,
    device_class_from_json,
    format_quantity,
    slice_from_json,
)
from kallot.config.dra_cel import compile_selector
from kallot.core.dra.allocator import Inventory, allocate
from kallot.core.dra.model import (
    Capacity,
    Device,
    Placement,
    RequestPolicy,
    Version,
    assemble_pools,
    parse_quantity,
)
from kallot.core.dra.policy import KallotPolicy
from kallot.core.errors import ConfigError
from kallot.testing.dra import NVIDIA, claim, exactly, nvidia_classes, nvidia_node_slices


def test_quantities_and_versions() -> None:
    assert parse_quantity("80Gi") == 80 * 2**30
    assert parse_quantity("500m") == Fraction(1, 2)
    assert parse_quantity("1.5k") == 1500
    assert parse_quantity("2e3") == 2000
    with pytest.raises(ConfigError, match=r"capacity\.memory: got '8 GB'"):
        parse_quantity("8 GB", "capacity.memory")
    assert Version.parse("1.2.3-rc.1").compare(Version.parse("1.2.3")) < 0
    assert Version.parse("1.10.0").compare(Version.parse("1.9.9")) > 0
    assert format_quantity(Fraction(20 * 2**30)) == "20Gi"
    assert format_quantity(Fraction(30)) == "30"
    assert format_quantity(Fraction(1, 2)) == "500m"


def test_request_policy_rounding() -> None:
    rng = RequestPolicy(min=Fraction(2), step=Fraction(4), max=Fraction(10))
    assert [rng.rounds(Fraction(x)) for x in (1, 2, 3, 6, 7, 10, 11)] == [2, 2, 6, 6, 10, 10, None]
    vals = RequestPolicy(valid_values=(Fraction(1), Fraction(4)))
    assert [vals.rounds(Fraction(x)) for x in (1, 2, 4, 5)] == [1, 4, 4, None]


def dev(**attrs: Any) -> Device:
    return Device(
        "d.io",
        "p",
        "x",
        Placement(node_name="n"),
        {f"d.io/{k}": v for k, v in attrs.items()},
        {"d.io/memory": Capacity(Fraction(40 * 2**30))},
    )


@pytest.mark.parametrize(
    ("expr", "want"),
    [
        ("device.attributes['d.io'].v.isGreaterThan(semver('1.2.3'))", True),
        ("device.attributes['d.io'].v.isLessThan(semver('1.10.0'))", True),
        ("device.attributes['d.io'].v == semver('1.9.0')", True),
        ("device.attributes['d.io'].v.compareTo(semver('1.9.0')) == 0", True),
        ("device.attributes['d.io'].v.minor() == 9", True),
        ("semver('v1.2', true) == semver('1.2.0')", True),
        ("isSemver('1.2') || isQuantity('x')", False),
        ("device.capacity['d.io'].memory == quantity('40960Mi')", True),
        ("device.capacity['d.io'].memory.isGreaterThan(quantity('40G'))", True),
        ("device.capacity['d.io'].memory.asInteger() == 42949672960", True),
        ("quantity('1Gi').add(quantity('1Gi')) == quantity('2Gi')", True),
        ("device.attributes['other.io'].size() == 0", True),
        ("!has(device.attributes['other.io'].v)", True),
        ("device.attributes['d.io'].n >= 2 && device.attributes['d.io'].ok", True),
    ],
)
def test_kubernetes_cel_environment(expr: str, want: bool) -> None:
    d = dev(v=Version.parse("1.9.0"), n=3, ok=True)
    assert compile_selector(expr, "f").matches(d) is want


def test_slice_parse_errors_name_the_field() -> None:
    s = nvidia_node_slices("n1", gpus=1)[0]
    s["spec"]["devices"][0]["attributes"]["driverVersion"] = {"version": "570.124.06"}
    with pytest.raises(ConfigError) as err:
        slice_from_json(s)
    assert str(err.value).startswith(
        "ResourceSlice n1-gpu.nvidia.com-0: spec.devices[0].attributes.driverVersion.version: "
        "got '570.124.06'"
    )
    s = nvidia_node_slices("n1", gpus=1)[0]
    s["spec"]["devices"][0]["capacity"]["memory"] = {"value": "lots"}
    with pytest.raises(ConfigError, match=r"devices\[0\]\.capacity\.memory\.value: got 'lots'"):
        slice_from_json(s)


def test_claim_parse_errors_name_claim_and_request() -> None:
    bad = claim("c", [{"name": "gpu", "exactly": {"deviceClassName": "x", "count": 0}}])
    with pytest.raises(
        ConfigError, match=r"^claim default/c, request gpu: .*exactly\.count: got 0"
    ):
        claim_from_json(bad)
    both = claim("c", [{"name": "gpu"}])
    with pytest.raises(ConfigError, match="exactly one of exactly, firstAvailable"):
        claim_from_json(both)
    con = claim("c", [exactly("gpu", "x")], constraints=[{"matchAttribute": "pcieRoot"}])
    with pytest.raises(ConfigError, match="fully qualified"):
        claim_from_json(con)


def test_status_allocation_has_results_config_and_node_selector() -> None:
    """A share of a consumable-capacity GPU with class config and claim config: results carry
    shareID and consumedCapacity (short names of the driver's domain, canonical quantities),
    class config is scoped to the request that used the class, claim config copied as is,
    the node selector pins the node (node-local slice)."""
    classes = nvidia_classes()
    classes[0]["spec"]["config"] = [
        {"opaque": {"driver": NVIDIA, "parameters": {"kind": "GpuConfig", "sharing": "MPS"}}}
    ]
    pools, _ = assemble_pools(
        [slice_from_json(s) for s in nvidia_node_slices("n1", gpus=0, shared=1)]
    )
    inv = Inventory(pools, {c.name: c for c in map(device_class_from_json, classes)})
    cfg = [{"requests": ["s"], "opaque": {"driver": NVIDIA, "parameters": {"limit": "20Gi"}}}]
    c = claim_from_json(
        claim(
            "c",
            [exactly("s", "gpu.nvidia.com", capacity={"requests": {"memory": "20Gi"}})],
            config=cfg,
        )
    )
    out = allocate([c], "n1", {}, inv, policy=KallotPolicy())
    status = allocation_status(out.allocations["default/c"])
    result = dict(status["devices"]["results"][0])
    share = result.pop("shareID")
    assert len(share) == 36  # a UUID, stable for claim/request/device
    assert result == {
        "request": "s",
        "driver": NVIDIA,
        "pool": "n1",
        "device": "gpu-0",
        "consumedCapacity": {"memory": "20Gi"},
    }
    assert status["devices"]["config"] == [
        {
            "source": "FromClass",
            "requests": ["s"],
            "opaque": {"driver": NVIDIA, "parameters": {"kind": "GpuConfig", "sharing": "MPS"}},
        },
        {
            "source": "FromClaim",
            "requests": ["s"],
            "opaque": {"driver": NVIDIA, "parameters": {"limit": "20Gi"}},
        },
    ]
    assert status["nodeSelector"] == {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
        ]
    }
    # the written status reads back as the same allocation (the bind step's round trip)
    back = claim_from_json({**claim("c", []), "status": {"allocation": status}}).allocation
    assert back is not None
    assert [(r.device, r.share_id, r.consumed) for r in back.results] == [
        ("gpu-0", share, {f"{NVIDIA}/memory": Fraction(20 * 2**30)})
    ]


def test_admin_access_and_tolerations_are_in_the_results() -> None:
    pools, _ = assemble_pools(
        [slice_from_json(s) for s in nvidia_node_slices("n1", gpus=1, taint_gpu=0)]
    )
    inv = Inventory(pools, {c.name: c for c in map(device_class_from_json, nvidia_classes())})
    tol = [{"key": "nvidia.com/unhealthy", "operator": "Exists"}]
    c = claim_from_json(
        claim("c", [exactly("g", "gpu.nvidia.com", adminAccess=True, tolerations=tol)])
    )
    out = allocate([c], "n1", {}, inv, policy=KallotPolicy())
    result = allocation_status(out.allocations["default/c"])["devices"]["results"][0]
    assert result["adminAccess"] is True
    assert result["tolerations"] == [{"key": "nvidia.com/unhealthy", "operator": "Exists"}]
