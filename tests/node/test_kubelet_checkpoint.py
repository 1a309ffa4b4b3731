"""The kubelet's device checkpoint read by the agent (node.kubelet_checkpoint): the file as
pkg/kubelet/cm/devicemanager/checkpoint writes it (checkpointData, v2), and the verdicts."""

from __future__ import annotations

import json

import pytest

from kallot.node import kubelet_checkpoint as kc


def _file(entries: list[tuple[str, str, list[str]]], registered: dict[str, list[str]]) -> str:
    return json.dumps(
        {
            "Data": {
                "PodDeviceEntries": [
                    {
                        "PodUID": uid,
                        "ContainerName": "main",
                        "ResourceName": res,
                        "DeviceIDs": {"-1": ids} if ids else {},
                        "AllocResp": "CgA=",
                    }
                    for uid, res, ids in entries
                ],
                "RegisteredDevices": registered,
            },
            "Checksum": 1234,
        }
    )


def test_parse_reads_charges_per_numa_node_and_registered_devices() -> None:
    text = json.dumps(
        {
            "Data": {
                "PodDeviceEntries": [
                    {
                        "PodUID": "u1",
                        "ContainerName": "c",
                        "ResourceName": "nvidia.com/gpu",
                        "DeviceIDs": {"0": ["GPU-a"], "1": ["GPU-b"]},
                        "AllocResp": "",
                    }
                ],
                "RegisteredDevices": {"nvidia.com/gpu": ["GPU-a", "GPU-b", "GPU-c"]},
            },
            "Checksum": 1,
        }
    )
    cp = kc.Checkpoint.parse(text)
    assert cp.charges == (kc.Charge("u1", "c", "nvidia.com/gpu", frozenset({"GPU-a", "GPU-b"})),)
    assert cp.registered["nvidia.com/gpu"] == {"GPU-a", "GPU-b", "GPU-c"}


def test_a_fresh_kubelets_empty_checkpoint_parses() -> None:
    cp = kc.Checkpoint.parse(
        '{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{}},"Checksum":0}'
    )
    assert cp.charges == () and dict(cp.registered) == {}


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("{", "not JSON"),
        ('{"Data": []}', "Data is list"),
        ('{"Data": {"PodDeviceEntries": [{"DeviceIDs": []}]}}', "PodDeviceEntries[0].DeviceIDs"),
        ('{"Data": {"RegisteredDevices": []}}', "RegisteredDevices"),
    ],
)
def test_a_bad_file_is_one_line_naming_the_field(text: str, names: str) -> None:
    with pytest.raises(ValueError) as err:
        kc.Checkpoint.parse(text)
    assert names in str(err.value) and "\n" not in str(err.value)


def test_not_listed_names_the_resource_whose_ids_the_kubelet_lacks() -> None:
    cp = kc.Checkpoint.parse(_file([], {"nvidia.com/gpu": ["GPU-a"], "kallot.io/gpu-milli": []}))
    advertised = {"nvidia.com/gpu": {"GPU-a"}, "kallot.io/gpu-milli": {"GPU-a::0", "GPU-a::1"}}
    assert "2 of the 2 healthy kallot.io/gpu-milli" in kc.not_listed(cp, advertised)
    assert kc.not_listed(cp, {"nvidia.com/gpu": {"GPU-a"}}) == ""


def test_stale_charges_are_those_of_our_resources_to_pods_that_are_gone() -> None:
    cp = kc.Checkpoint.parse(
        _file(
            [
                ("gone", "nvidia.com/gpu", ["GPU-a"]),
                ("live", "nvidia.com/gpu", ["GPU-b"]),
                ("gone", "example.com/nic", ["nic0"]),  # another plugin's: not ours to judge
            ],
            {},
        )
    )
    stale = kc.stale(cp, {"live"}, {"nvidia.com/gpu"})
    assert [(c.pod_uid, set(c.ids)) for c in stale] == [("gone", {"GPU-a"})]
    assert "1 devices (GPU-a) to 1 pods" in kc.describe_stale(stale)
    assert kc.stale(cp, {"live", "gone"}, {"nvidia.com/gpu"}) == []
