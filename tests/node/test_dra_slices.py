"""The DRA ResourceSlices the agent publishes (``node.dra``), from the bundled inventories."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kallot.cli.main import app
from kallot.config.inventory import MigDevice, NodeInventory
from kallot.core import mig as core_mig
from kallot.node import dra
from kallot.node.discovery import build_inventory
from kallot.node.fake import load_inventory_file

DATA = Path(__file__).parent / "data"


def inventory(name: str) -> NodeInventory:
    spec = load_inventory_file(DATA / name)
    return build_inventory(spec.raw(), spec.sharing_setting())


def all_mig(inv: NodeInventory) -> NodeInventory:
    """Every GPU in MIG mode without instances (dynamic MIG owns the whole GPU)."""
    return inv.model_copy(
        update={
            "devices": tuple(d.model_copy(update={"mode": "mig", "mig": ()}) for d in inv.devices)
        }
    )


def devices_of(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for s in slices for d in s["spec"].get("devices") or []]


def test_hgx_mps_gpus_are_consumable_capacity_with_nvidia_attribute_names() -> None:
    slices = dra.resource_slices(inventory("hgx-h100-8.yaml"), dra.DraOptions(node="n1"))
    assert len(slices) == 1
    spec = slices[0]["spec"]
    assert spec["driver"] == "gpu.kallot.io"
    assert spec["nodeName"] == "n1"
    assert spec["pool"] == {"name": "n1", "generation": 1, "resourceSliceCount": 1}
    devs = spec["devices"]
    assert [d["name"] for d in devs] == [f"gpu-{i}" for i in range(8)]
    d0 = devs[0]
    assert d0["allowMultipleAllocations"] is True
    a = d0["attributes"]
    assert a["type"] == {"string": "gpu"}
    assert a["uuid"] == {"string": "GPU-5a3c9f1e-0100-4e4e-8a55-000000000000"}
    assert a["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert a["architecture"] == {"string": "Hopper"}
    assert a["cudaComputeCapability"] == {"version": "9.0.0"}
    assert a["driverVersion"] == {"version": "570.124.6"}  # semver: no leading zero
    assert a["cudaDriverVersion"] == {"version": "12.8.0"}
    assert a["resource.kubernetes.io/pciBusID"] == {"string": "0000:18:00.0"}
    assert a["sharing"] == {"string": "mps"}
    assert {d["attributes"]["nvlinkIsland"]["int"] for d in devs} == {0}
    assert [d["attributes"]["numaNode"]["int"] for d in devs] == [0] * 4 + [1] * 4
    cap = d0["capacity"]
    assert cap["memory"]["value"] == "81559Mi"
    assert cap["memory"]["requestPolicy"]["default"] == "81559Mi"
    assert cap["compute"]["value"] == "100"
    assert len(a) + len(cap) <= 32


def test_time_sliced_gpus_offer_one_replica_per_claim() -> None:
    devs = devices_of(dra.resource_slices(inventory("pcie-l40s-8.yaml"), dra.DraOptions(node="n")))
    sharing = [d["attributes"]["sharing"]["string"] for d in devs]
    assert sharing == ["mps"] * 6 + ["time-slicing"] * 2
    ts = devs[6]["capacity"]
    assert ts["replicas"] == {"value": "4", "requestPolicy": {"default": "1", "validValues": ["1"]}}
    # 2x oversubscribed memory, one replica's part by default
    assert ts["memory"]["value"] == f"{46068 * 2}Mi"
    assert ts["memory"]["requestPolicy"]["default"] == f"{46068 * 2 // 4}Mi"
    assert devs[0]["attributes"]["architecture"] == {"string": "Ada Lovelace"}


def test_static_mig_publishes_existing_instances_only() -> None:
    inv = inventory("mig-a100-mixed.yaml")
    slices = dra.resource_slices(inv, dra.DraOptions(node="n", mig="static"))
    devs = devices_of(slices)
    assert [d["name"] for d in devs] == [
        "gpu-0-mig-3g40gb-0",
        "gpu-0-mig-2g20gb-4",
        "gpu-0-mig-1g10gb-6",
        "gpu-1",
    ]
    mig = devs[0]["attributes"]
    assert mig["type"] == {"string": "mig"}
    assert mig["profile"] == {"string": "3g.40gb"}
    assert mig["parentUUID"] == {"string": "GPU-5a3c9f1e-0200-4e4e-8a55-000000000000"}
    assert mig["uuid"] == {"string": "MIG-5a3c9f1e-0200-4e4e-8a55-000000000001"}
    assert devs[0]["capacity"]["memory"] == {"value": "40192Mi"}
    assert devs[3]["attributes"]["sharing"] == {"string": "exclusive"}
    assert "allowMultipleAllocations" not in devs[3]
    assert not any("sharedCounters" in s["spec"] for s in slices)


def test_dynamic_mig_offers_every_placement_that_fits_next_to_existing_ones() -> None:
    inv = inventory("mig-a100-mixed.yaml")
    gpu0 = inv.devices[0]
    # keep only 3g.40gb@0: slices 4-7 and 4 compute slices are free
    inv = inv.model_copy(
        update={"devices": (gpu0.model_copy(update={"mig": gpu0.mig[:1]}), inv.devices[1])}
    )
    slices = dra.resource_slices(inv, dra.DraOptions(node="n"))
    counters = [s for s in slices if "sharedCounters" in s["spec"]]
    assert len(counters) == 1
    (cset,) = counters[0]["spec"]["sharedCounters"]
    assert cset["name"] == "gpu-0-counters"
    assert cset["counters"] == {
        **{f"memory-slice-{s}": {"value": "1"} for s in (4, 5, 6, 7)},
        "compute-slices": {"value": "4"},
        "media-engines": {"value": "1"},
    }
    names = {d["name"] for d in devices_of(slices)}
    dynamic = {n for n in names if n.startswith("gpu-0-mig") and n != "gpu-0-mig-3g40gb-0"}
    want = {
        dra.mig_device_name(0, p.name, s)
        for p in core_mig.PROFILES["A100-80GB"]
        for s in core_mig.placements("A100-80GB", [("3g.40gb", 0)], p.name)
    }
    assert dynamic == want
    assert "gpu-0-mig-3g40gb-4" in dynamic and "gpu-0-mig-4g40gb-0" not in dynamic
    d = next(d for d in devices_of(slices) if d["name"] == "gpu-0-mig-2g20gb-4")
    assert d["consumesCounters"] == [
        {
            "counterSet": "gpu-0-counters",
            "counters": {
                "memory-slice-4": {"value": "1"},
                "memory-slice-5": {"value": "1"},
                "compute-slices": {"value": "2"},
            },
        }
    ]
    assert d["attributes"]["dynamic"] == {"bool": True}


def test_slices_hold_at_most_64_devices_with_counters_and_the_pool_is_complete() -> None:
    inv = all_mig(inventory("hgx-h100-8.yaml"))
    slices = dra.resource_slices(inv, dra.DraOptions(node="big"), generation=7)
    per_gpu = sum(len(p.starts) for p in core_mig.PROFILES["H100-80GB"])
    assert per_gpu == 25
    devs = devices_of(slices)
    assert len(devs) == 8 * per_gpu
    assert len({d["name"] for d in devs}) == len(devs)
    assert all(len(s["spec"].get("devices") or []) <= 64 for s in slices)
    assert all(len(s["spec"].get("sharedCounters") or []) <= 8 for s in slices)
    assert all(
        s["spec"]["pool"] == {"name": "big", "generation": 7, "resourceSliceCount": len(slices)}
        for s in slices
    )
    assert len({s["metadata"]["name"] for s in slices}) == len(slices)
    # a slice holds devices or counters, never both (resource.k8s.io/v1 from 1.35)
    assert all(("devices" in s["spec"]) != ("sharedCounters" in s["spec"]) for s in slices)


def test_unhealthy_gpu_is_tainted_and_loses_the_taint_when_it_recovers() -> None:
    inv = inventory("hgx-h100-8.yaml")
    sick = inv.devices[3].uuid
    devs = devices_of(dra.resource_slices(inv, dra.DraOptions(node="n", unhealthy={sick})))
    tainted = [d["name"] for d in devs if d.get("taints")]
    assert tainted == ["gpu-3"]
    assert devs[3]["taints"] == [
        {"key": "gpu.kallot.io/unhealthy", "value": "xid", "effect": "NoSchedule"}
    ]
    devs = devices_of(dra.resource_slices(inv, dra.DraOptions(node="n")))
    assert not any(d.get("taints") for d in devs)


def test_owned_instances_are_placements_in_use_not_static_devices() -> None:
    inv = all_mig(inventory("mig-a100-mixed.yaml"))
    before = dra.resource_slices(inv, dra.DraOptions(node="n"))
    gpu0 = inv.devices[0]
    made = gpu0.model_copy(update={"mig": (MigDevice(profile="1g.10gb", start=2, uuid="MIG-x"),)})
    inv2 = inv.model_copy(update={"devices": (made, inv.devices[1])})
    # what the driver created for a claim does not change the pool (the claim holds it) ...
    assert dra.resource_slices(inv2, dra.DraOptions(node="n", owned_mig={(0, 2)})) == before
    # ... an instance someone else made is a static device and takes its slices out
    names = {d["name"] for d in devices_of(dra.resource_slices(inv2, dra.DraOptions(node="n")))}
    assert "gpu-0-mig-1g10gb-2" in names
    assert "gpu-0-mig-7g80gb-0" not in names


def test_device_classes_select_each_kind() -> None:
    classes = {c["metadata"]["name"]: c for c in dra.device_classes()}
    assert set(classes) == {"gpu.kallot.io", "mig.kallot.io", "gpu-share.kallot.io"}
    expr = classes["mig.kallot.io"]["spec"]["selectors"][0]["cel"]["expression"]
    assert "device.attributes['gpu.kallot.io'].type == 'mig'" in expr


def test_cli_prints_the_slices_as_json() -> None:
    result = CliRunner().invoke(
        app,
        [
            "agent",
            "inventory",
            "--inventory-file",
            str(DATA / "mig-a100-mixed.yaml"),
            "--dra",
            "--format",
            "json",
            "--node-name",
            "gpu-node-1",
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["kind"] == "List"
    assert {s["spec"]["pool"]["name"] for s in doc["items"]} == {"gpu-node-1"}
    names = [d["name"] for d in devices_of(doc["items"])]
    assert names[:3] == ["gpu-0-mig-3g40gb-0", "gpu-0-mig-2g20gb-4", "gpu-0-mig-1g10gb-6"]


def test_cli_rejects_a_bad_mig_mode() -> None:
    result = CliRunner().invoke(
        app,
        [
            "agent",
            "inventory",
            "--inventory-file",
            str(DATA / "mig-a100-mixed.yaml"),
            "--dra",
            "--dra-mig",
            "sometimes",
        ],
    )
    assert result.exit_code == 2
    assert "expected dynamic or static" in result.output


# -- counters are the MIG geometry: any set of placements the counters admit is a valid layout ---


def _consumption(d: dict[str, Any]) -> Counter[str]:
    out: Counter[str] = Counter()
    for c in d.get("consumesCounters") or []:
        for k, v in c["counters"].items():
            out[k] += int(v["value"])
    return out


_EMPTY_H100 = all_mig(inventory("hgx-h100-8.yaml"))
_GPU0 = [
    d
    for d in devices_of(dra.resource_slices(_EMPTY_H100, dra.DraOptions(node="n")))
    if d["name"].startswith("gpu-0-")
]
_SET0 = next(
    cs
    for s in dra.resource_slices(_EMPTY_H100, dra.DraOptions(node="n"))
    for cs in s["spec"].get("sharedCounters") or []
    if cs["name"] == "gpu-0-counters"
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(range(len(_GPU0))), unique=True, max_size=8))
def test_counters_admit_exactly_the_valid_layouts(picked: list[int]) -> None:
    chosen = [_GPU0[i] for i in picked]
    total: Counter[str] = Counter()
    for d in chosen:
        total += _consumption(d)
    fits = all(total[k] <= int(v["value"]) for k, v in _SET0["counters"].items())
    layout = [
        (d["attributes"]["profile"]["string"], d["attributes"]["placementStart"]["int"])
        for d in chosen
    ]
    assert fits == (core_mig.valid_layout("H100-80GB", layout) == "")


def test_pcie_root_is_read_from_sysfs(tmp_path: Path) -> None:
    dev = tmp_path / "devices" / "pci0000:17" / "0000:17:01.0" / "0000:18:00.0"
    dev.mkdir(parents=True)
    links = tmp_path / "bus" / "pci" / "devices"
    links.mkdir(parents=True)
    (links / "0000:18:00.0").symlink_to(dev)
    inv = inventory("hgx-h100-8.yaml")
    roots = dra.pcie_roots(inv, str(tmp_path))
    assert roots == {"0000:18:00.0": "pci0000:17"}  # the others are not in this sysfs
    devs = devices_of(dra.resource_slices(inv, dra.DraOptions(node="n", pcie_roots=roots)))
    assert devs[0]["attributes"]["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:17"}
    assert "resource.kubernetes.io/pcieRoot" not in devs[1]["attributes"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 10_000)), max_size=30))
def test_what_the_counters_admit_nvml_can_always_create(ops: list[tuple[bool, int]]) -> None:
    """A scheduler that allocates only while counters are free, and a driver that creates each
    allocated placement: NVML (the fake backend, which refuses what NVML refuses) never refuses,
    and the GPU's layout is valid after every step."""
    from kallot.node.fake import FakeBackend

    fake = FakeBackend.from_file(DATA / "dra-a100-3.yaml")
    free = {k: int(v["value"]) for k, v in _counters(fake).items()}
    held: list[dict[str, Any]] = []
    for allocate, pick in ops:
        if allocate:
            fits = [
                d for d in _dynamic(fake) if all(free[k] >= v for k, v in _consumption(d).items())
            ]
            if not fits:
                continue
            d = fits[pick % len(fits)]
            attrs = d["attributes"]
            fake.create_mig(0, attrs["profile"]["string"], attrs["placementStart"]["int"])
            free.update({k: free[k] - v for k, v in _consumption(d).items()})
            held.append(d)
        elif held:
            d = held.pop(pick % len(held))
            fake.destroy_mig(0, d["attributes"]["placementStart"]["int"])
            free.update({k: free[k] + v for k, v in _consumption(d).items()})
        assert core_mig.valid_layout("A100-80GB", fake.mig_layout(0)) == ""


def _dynamic(fake: Any) -> list[dict[str, Any]]:
    inv = build_inventory(fake.spec.raw(), fake.sharing())  # the published pool stays fixed
    return [
        d
        for d in devices_of(dra.resource_slices(inv, dra.DraOptions(node="n")))
        if d["name"].startswith("gpu-0-mig-")
    ]


def _counters(fake: Any) -> dict[str, Any]:
    inv = build_inventory(fake.spec.raw(), fake.sharing())
    (cs,) = dra.counter_sets(inv, dra.DraOptions(node="n"))
    counters: dict[str, Any] = cs["counters"]
    return counters


def test_run_refuses_dra_without_the_api_and_a_mode_that_serves_nothing() -> None:
    data = str(DATA / "dra-a100-3.yaml")
    result = CliRunner().invoke(
        app, ["agent", "run", "--inventory-file", data, "--dra", "--no-kube"]
    )
    assert result.exit_code == 2
    assert "--dra needs the API" in result.output
    result = CliRunner().invoke(
        app, ["agent", "run", "--inventory-file", data, "--no-device-plugin", "--no-kube"]
    )
    assert result.exit_code == 2
    assert "serves nothing" in result.output


def test_an_unhealthy_mig_instance_taints_only_itself() -> None:
    inv = inventory("mig-a100-mixed.yaml")
    sick = inv.devices[0].mig[1].uuid
    devs = devices_of(
        dra.resource_slices(inv, dra.DraOptions(node="n", mig="static", unhealthy={sick}))
    )
    assert [d["name"] for d in devs if d.get("taints")] == ["gpu-0-mig-2g20gb-4"]


def test_run_refuses_dra_gpus_the_node_does_not_have(tmp_path: Path) -> None:
    # Every other flag is valid (node.flags checks them first); the kubeconfig is never used.
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("clusters: [{name: c}]\nusers: [{name: u}]\ncontexts: [{name: x}]\n")
    result = CliRunner().invoke(
        app,
        [
            "agent",
            "run",
            "--device-plugin-dir",
            str(tmp_path),
            "--inventory-file",
            str(DATA / "dra-a100-3.yaml"),
            "--dra",
            "--device-plugin",
            "--dra-gpus",
            "0,9",
            f"--kubeconfig={kubeconfig}",
            f"--device-plugin-dir={tmp_path}",
            "--metrics-address=127.0.0.1:0",
        ],
    )
    assert result.exit_code == 2
    assert "--dra-gpus: got '0,9', expected indices of this node's GPUs [0, 1, 2]" in result.output


def test_a_corrupt_checkpoint_is_one_clear_error(tmp_path: Path) -> None:
    import pytest

    from kallot.core.errors import ConfigError
    from kallot.node.draplugin import Checkpoint

    path = tmp_path / "checkpoint.json"
    path.write_text('{"claims": {"u1": {"namespace": "default"}}}')
    with pytest.raises(ConfigError) as err:
        Checkpoint(path)
    assert str(err.value) == (
        f"{path}: got 'KeyError', expected a kallot DRA checkpoint (JSON, version 1)"
    )
