"""NodeInventory.to_link: NVML levels + NVLink counts from the node agent become core link codes,
and a bad matrix is a ConfigError naming the entry."""

from __future__ import annotations

import pytest

from kallot.config.inventory import Device, NodeInventory, Topology
from kallot.core import topology
from kallot.core.errors import ConfigError


def inventory(levels: list[list[int]], nvlinks: list[list[int]] | None = None) -> NodeInventory:
    n = len(levels)
    devices = tuple(
        Device(index=i, uuid=f"GPU-{i}", model="H100-80GB", mem_mib=81559) for i in range(n)
    )
    topo = Topology(levels=tuple(map(tuple, levels)), nvlinks=tuple(map(tuple, nvlinks or [])))
    return NodeInventory(devices=devices, topology=topo)


def test_levels_and_nvlinks_become_link_codes() -> None:
    inv = inventory([[0, 10, 50], [10, 0, 50], [50, 50, 0]], [[0, 0, 0], [0, 0, 4], [0, 4, 0]])
    link = inv.to_link()
    assert link is not None
    assert [topology.link_name(c) for c in link[1]] == ["PIX", "?", "NV4"]


def test_no_topology_is_none() -> None:
    assert NodeInventory().to_link() is None


def test_bad_level_names_the_entry() -> None:
    with pytest.raises(ConfigError) as err:
        inventory([[0, 15], [15, 0]]).to_link(where="node n1")
    assert err.value.field == "node n1.topology"
    assert "levels[0][1]" in err.value.expected and "got 15" in err.value.expected
