"""Malformed inventory files as an operator might write them: each is refused with one line
naming the file, the GPU and the field (node.validate, node.fake). The table in
docs/node-agent.md lists these cases and their errors (``pytest -s`` prints it)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from kallot.core.errors import ConfigError
from kallot.node.fake import load_inventory_file

DATA = Path(__file__).parent / "data"
Doc = dict[str, Any]


def base(name: str) -> Doc:
    doc: Doc = yaml.safe_load((DATA / name).read_text())
    return doc


def hgx() -> Doc:
    return base("hgx-h100-8.yaml")


def mig_node(*instances: tuple[str, int]) -> Doc:
    doc = base("mig-a100-mixed.yaml")
    doc["gpus"][0]["mig"] = [
        {"name": p, "start": s, "uuid": f"MIG-5a3c9f1e-0200-4e4e-8a55-00000000001{k}"}
        for k, (p, s) in enumerate(instances)
    ]
    return doc


def _dup_uuid() -> Doc:
    doc = hgx()
    doc["gpus"][3]["uuid"] = doc["gpus"][0]["uuid"]
    return doc


def _mig_uuid_is_gpu_uuid() -> Doc:
    doc = base("mig-a100-mixed.yaml")
    doc["gpus"][0]["mig"][1]["uuid"] = doc["gpus"][1]["uuid"]
    return doc


def _sep_in_uuid() -> Doc:
    doc = hgx()
    doc["gpus"][2]["uuid"] = "GPU-5a3c9f1e::0102"
    return doc


def _mig_on_l40s() -> Doc:
    doc = base("pcie-l40s-8.yaml")
    doc["gpus"][1]["migEnabled"] = True
    doc["gpus"][1]["mig"] = [{"name": "1g.12gb", "start": 0, "uuid": "MIG-1"}]
    return doc


def _mig_not_enabled() -> Doc:
    doc = base("mig-a100-mixed.yaml")
    doc["gpus"][1]["mig"] = [{"name": "7g.80gb", "start": 0, "uuid": "MIG-2"}]
    return doc


def _used_above_total() -> Doc:
    doc = hgx()
    doc["gpus"][5]["metrics"]["memoryUsedMiB"] = 90000
    return doc


def _unknown_key() -> Doc:
    doc = hgx()
    g = doc["gpus"][1]
    g["memoryMib"] = g.pop("memoryMiB")
    return doc


def _unknown_top_key() -> Doc:
    doc = hgx()
    doc["shareing"] = doc.pop("sharing")
    return doc


def _time_sliced_x16() -> Doc:
    doc = hgx()
    doc["sharing"] = {"mode": "time-slicing", "replicas": 16, "oversubscription": 16}
    return doc


def _huge_node() -> Doc:
    doc = hgx()
    gpu = doc["gpus"][0]
    doc["sharing"] = {"mode": "exclusive"}
    doc.pop("topology", None)
    doc["gpus"] = []
    for i in range(1000):
        g = copy.deepcopy(gpu)
        g["uuid"] = f"GPU-5a3c9f1e-{i:04x}-4e4e-8a55-000000000000"
        doc["gpus"].append(g)
    return doc


# (what the operator wrote, the inventory, what the one-line error must contain)
CASES: list[tuple[str, Callable[[], Doc], list[str]]] = [
    ("duplicate GPU UUID", _dup_uuid, ["gpus[3]", ".uuid", "not already used by gpus[0]"]),
    ("a MIG UUID equal to a GPU UUID", _mig_uuid_is_gpu_uuid, ["gpus[1]", "already used"]),
    ("UUID containing the ID separator `::`", _sep_in_uuid, ["gpus[2]", ".uuid", "'::'"]),
    (
        "overlapping MIG instances (3g@0 + 2g@2)",
        lambda: mig_node(("3g.40gb", 0), ("2g.20gb", 2)),
        ["gpus[0]", ".mig", "overlaps"],
    ),
    (
        "invalid start slot (3g.40gb@2)",
        lambda: mig_node(("3g.40gb", 2)),
        ["gpus[0]", ".mig[0].start", "[0, 4]"],
    ),
    (
        "instance beyond the GPU's 8 memory slices (start 8)",
        lambda: mig_node(("1g.10gb", 8)),
        ["gpus.0.mig.0.start", "a number <= 7"],
    ),
    (
        "more instances of a profile than the GPU holds (two 1g.10gb+me)",
        lambda: mig_node(("1g.10gb+me", 0), ("1g.10gb+me", 1)),
        ["gpus[0]", ".mig", "more than 1 instances"],
    ),
    (
        "a profile of another model (H200's 1g.18gb on an A100-80GB)",
        lambda: mig_node(("1g.18gb", 0)),
        ["gpus[0]", ".mig[0].name", "A100-80GB profile"],
    ),
    (
        "an unknown profile (5g.50gb)",
        lambda: mig_node(("5g.50gb", 0)),
        ["gpus[0]", "mig[0].name", "5g.50gb"],
    ),
    ("MIG on a model without MIG (L40S)", _mig_on_l40s, ["gpus[1]", ".name", "MIG-capable"]),
    ("MIG instances on a GPU not in MIG mode", _mig_not_enabled, ["gpus[1]", ".mig", "not in MIG"]),
    (
        "memory used above total",
        _used_above_total,
        ["gpus.5.metrics.memoryUsedMiB", "90000", "81559"],
    ),
    ("unknown key `memoryMib`", _unknown_key, ["gpus.1.memoryMib", "did you mean 'memoryMiB'"]),
    ("unknown key `shareing`", _unknown_top_key, ["shareing", "did you mean 'sharing'"]),
    (
        "time-slicing x16 on 8 GPUs (128,000 milli IDs)",
        _time_sliced_x16,
        ["kallot.io/gpu-milli", "128000 device IDs", "at most 32768"],
    ),
    (
        "1,000 GPUs: an inventory annotation over 256 KiB",
        _huge_node,
        ["kallot.io/gpu-inventory", "1000 GPUs", "256 KiB"],
    ),
]


@pytest.mark.parametrize(("what", "make", "expect"), CASES, ids=[c[0] for c in CASES])
def test_malformed_inventory_is_one_line_naming_file_gpu_field(
    tmp_path: Path, what: str, make: Callable[[], Doc], expect: list[str]
) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump(make()))
    with pytest.raises(ConfigError) as info:
        load_inventory_file(path)
    msg = str(info.value)
    print(f"| {what} | `{msg.replace(str(tmp_path) + '/', '')}` |")
    assert "\n" not in msg and len(msg) < 400, msg
    assert msg.startswith(f"{path}: "), msg
    for part in expect:
        assert part in msg, msg


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("*.yaml")))
def test_the_example_inventories_pass(name: str) -> None:
    load_inventory_file(DATA / name)
