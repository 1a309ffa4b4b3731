"""node.cdi: the device plugin's own CDI spec names exactly what Allocate answers, the device
nodes point at ``--dev-root``, and the fake backend's stand-in device nodes are character
devices. (That containerd resolves the spec and starts the container: tests/realnode.)
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from kallot.config.device_record import DeviceRecord
from kallot.config.inventory import NodeInventory
from kallot.core.errors import ConfigError
from kallot.node import allocate, cdi
from kallot.node.discovery import Sharing, build_inventory
from kallot.node.fake import FakeBackend

DATA = Path(__file__).parent / "data"


def _inventory() -> NodeInventory:
    fake = FakeBackend.from_file(DATA / "mig-a100-mixed.yaml")
    return build_inventory(fake.raw(), fake.sharing() or Sharing())


def test_spec_defines_every_name_allocate_can_answer() -> None:
    inv = _inventory()
    spec = cdi.device_plugin_spec(inv)
    assert spec["kind"] == cdi.DEVICE_PLUGIN_KIND == cdi.kind_for("kallot")
    names = [d["name"] for d in spec["devices"]]
    want = [inv.devices[0].uuid, *(m.uuid for m in inv.devices[0].mig), inv.devices[1].uuid]
    assert sorted(names) == sorted(want)
    mig = next(d for d in spec["devices"] if d["name"] == inv.devices[0].mig[0].uuid)
    # A MIG instance is its parent GPU's device node plus the control nodes; on a GPU node the
    # paths are the host's own (no hostPath).
    assert mig["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia0"},
        {"path": "/dev/nvidiactl"},
        {"path": "/dev/nvidia-uvm"},
        {"path": "/dev/nvidia-uvm-tools"},
    ]


def test_dev_root_becomes_host_path_and_the_spec_is_written_atomically(tmp_path: Path) -> None:
    nodes = cdi.device_nodes(1, tmp_path / "dev")
    assert nodes[0] == {"path": "/dev/nvidia1", "hostPath": str(tmp_path / "dev" / "nvidia1")}
    path = cdi.device_plugin_spec_path(tmp_path / "cdi")
    cdi.write_spec(path, cdi.device_plugin_spec(_inventory(), tmp_path / "dev"))
    assert path.name == "k8s.device-plugin.kallot.io-gpu.json"
    assert json.loads(path.read_text())["cdiVersion"] == cdi.CDI_VERSION
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left


def test_kind_per_mode_and_a_bad_mode_is_one_line() -> None:
    assert cdi.kind_for("nvidia") == "nvidia.com/gpu"
    assert cdi.kind_for("none") == ""
    with pytest.raises(ConfigError, match=r"--cdi-devices: got 'amd', expected one of kallot"):
        cdi.kind_for("amd")


def test_no_kind_means_no_cdi_names_only_the_environment() -> None:
    inv = _inventory()
    gpu = inv.devices[1]
    rec = DeviceRecord.model_validate(
        {
            "node": "n",
            "devices": [
                {"index": 1, "uuid": gpu.uuid, "milli": 1000, "memMiB": 0, "mode": "exclusive"}
            ],
        }
    )
    pod = allocate.PodRecord("ns", "p", "uid", rec)
    g = allocate.grant(allocate.RESOURCE_GPU, pod, [gpu.uuid], inv, cdi_kind="")
    assert g.cdi_devices == ()
    assert g.envs["NVIDIA_VISIBLE_DEVICES"] == gpu.uuid


def test_fake_device_nodes_are_character_devices(tmp_path: Path) -> None:
    cdi.make_fake_device_nodes(tmp_path, [0, 2])
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidia2", "nvidiactl"]
    st = (tmp_path / "nvidia2").stat()
    assert stat.S_ISCHR(st.st_mode)
    cdi.make_fake_device_nodes(tmp_path, [0, 2])  # again: existing nodes are kept
