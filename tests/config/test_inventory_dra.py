"""A GPU the agent's DRA driver serves (``devices[].dra``) is the DRA pool's alone: the
scheduler's extended-resource path never places on it, and inventories without such GPUs are
byte for byte what they were."""

from __future__ import annotations

from kallot.config.inventory import Device, NodeInventory


def device(index: int, *, dra: bool = False) -> Device:
    return Device.model_validate(
        {"index": index, "uuid": f"GPU-{index}", "model": "H100-80GB", "memMiB": 81559, "dra": dra}
    )


def test_a_dra_gpu_is_unavailable_to_extended_resources_and_keeps_its_index() -> None:
    inv = NodeInventory(devices=(device(0), device(1, dra=True), device(2)))
    specs = [d.to_gpu_spec() for d in inv.devices]
    assert [s.healthy for s in specs] == [True, False, True]
    again = NodeInventory.from_json(inv.to_json())
    assert [d.dra for d in again.devices] == [False, True, False]
    assert [d.index for d in again.devices] == [0, 1, 2]


def test_the_field_is_written_only_when_on() -> None:
    assert '"dra"' not in NodeInventory(devices=(device(0),)).to_json()
    assert '"dra":true' in NodeInventory(devices=(device(0, dra=True),)).to_json().replace(" ", "")
