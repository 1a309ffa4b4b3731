"""Discovery: NVML-shaped raw facts -> the published inventory, labels and core topology."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kallot.config.inventory import NodeInventory
from kallot.core import topology
from kallot.core.errors import ConfigError
from kallot.core.resources import SharingMode
from kallot.node.discovery import (
    RawGpu,
    RawMig,
    RawNode,
    build_inventory,
    cuda_version,
    gfd_labels,
    gpu_family,
    mig_profile,
    nvlink_counts,
)
from kallot.node.fake import FakeBackend, load_inventory_file

DATA = Path(__file__).parent / "data"
HGX = DATA / "hgx-h100-8.yaml"
MIG = DATA / "mig-a100-mixed.yaml"
PCIE = DATA / "pcie-l40s-8.yaml"


def inventory_of(path: Path) -> NodeInventory:
    backend = FakeBackend.from_file(path)
    return build_inventory(backend.raw(), backend.sharing())


@pytest.fixture
def hgx() -> NodeInventory:
    return inventory_of(HGX)


@pytest.fixture
def mig_node() -> NodeInventory:
    return inventory_of(MIG)


@pytest.fixture
def pcie() -> NodeInventory:
    return inventory_of(PCIE)


def test_hgx_h100_node(hgx: NodeInventory) -> None:
    assert [d.model for d in hgx.devices] == ["H100-80GB"] * 8
    assert hgx.cuda_version == "12.8"
    # NVSwitch: every pair NV18 -> one island; NUMA from NVML per GPU.
    assert {d.island for d in hgx.devices} == {0}
    assert [d.numa for d in hgx.devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    link = np.asarray(hgx.to_link())
    off = link[~np.eye(8, dtype=bool)]
    assert set(off.tolist()) == {topology.link_code(topology.LinkLevel.NODE, 18)} | {
        topology.link_code(topology.LinkLevel.SYSTEM, 18)
    }
    assert topology.link_name(int(link[0, 7])) == "NV18"
    # The same matrix as the core's HGX preset ranks sets the same way.
    assert topology.best_gpu_set(link, range(8), 4) is not None
    labels = gfd_labels(hgx)
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert labels["nvidia.com/gpu.count"] == "8"
    assert labels["nvidia.com/gpu.memory"] == "81559"
    assert labels["nvidia.com/gpu.family"] == "hopper"
    assert labels["nvidia.com/gpu.compute.major"] == "9"
    assert labels["nvidia.com/mig.capable"] == "true"
    assert labels["nvidia.com/mig.strategy"] == "none"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "mps"
    assert labels["nvidia.com/cuda.driver-version.major"] == "570"
    assert labels["nvidia.com/cuda.runtime-version.full"] == "12.8"


def test_mixed_mig_node(mig_node: NodeInventory) -> None:
    gpu0, gpu1 = mig_node.devices
    assert gpu0.mode == "mig" and gpu1.mode == "exclusive"
    assert [(m.profile, m.start) for m in gpu0.mig] == [
        ("3g.40gb", 0),
        ("2g.20gb", 4),
        ("1g.10gb", 6),
    ]
    assert gpu1.mig == ()
    # As the core sees them.
    specs = mig_node.to_gpu_specs()
    assert [s.mode for s in specs] == [SharingMode.MIG, SharingMode.EXCLUSIVE]
    # No NVLink: each GPU its own island; across sockets.
    assert [d.island for d in mig_node.devices] == [0, 1]
    assert topology.link_name(int(np.asarray(mig_node.to_link())[0, 1])) == "SYS"
    labels = gfd_labels(mig_node)
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    assert labels["nvidia.com/mig.capable"] == "true"
    assert labels["nvidia.com/mig-3g.40gb.count"] == "1"
    assert labels["nvidia.com/mig-1g.10gb.count"] == "1"
    assert labels["nvidia.com/gpu.family"] == "ampere"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "none"
    # The annotation round-trips through the scheduler's parser.
    assert NodeInventory.from_json(mig_node.to_json()) == mig_node


def test_pcie_two_numa_node(pcie: NodeInventory) -> None:
    assert [d.model for d in pcie.devices] == ["L40S"] * 8
    assert [d.numa for d in pcie.devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [d.island for d in pcie.devices] == list(range(8))  # no NVLink
    link = np.asarray(pcie.to_link())
    assert np.array_equal(link, topology.pcie_8gpu_2numa().link)
    # Best pair is a PIX pair on one switch; best 4 stay on one socket.
    assert topology.best_gpu_set(link, range(8), 2).best.slots == (0, 1)  # type: ignore[union-attr]
    four = topology.best_gpu_set(link, range(8), 4).best.slots  # type: ignore[union-attr]
    assert len({pcie.devices[s].numa for s in four}) == 1
    modes = [d.mode for d in pcie.devices]
    assert modes == ["mps"] * 6 + ["time-slicing"] * 2
    assert [d.replicas for d in pcie.devices][6:] == [4, 4]
    assert [d.oversubscription for d in pcie.devices] == [1.0] * 6 + [2.0, 2.0]
    labels = gfd_labels(pcie)
    assert labels["nvidia.com/mig.capable"] == "false"
    assert labels["nvidia.com/gpu.family"] == "ada-lovelace"  # L40S, 8.9 (GFD's name)
    assert labels["nvidia.com/gpu.replicas"] == "1"  # GPU 0 (MPS), as the strategy and product
    assert labels["nvidia.com/gpu.sharing-strategy"] == "mps"  # GPU 0's mode
    assert labels["nvidia.com/mps.capable"] == "true"
    # A node spec built from it is what the scheduler's snapshot gets.
    specs = pcie.to_gpu_specs()
    assert [(s.numa, s.island) for s in specs[:2]] == [(0, 0), (0, 1)]
    assert [s.mode for s in specs][5:] == [SharingMode.MPS] + [SharingMode.TIMESLICE] * 2


@pytest.mark.parametrize(
    ("name", "profile"),
    [
        ("NVIDIA A100-SXM4-80GB MIG 3g.40gb", "3g.40gb"),
        ("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me", "1g.10gb+me"),
        ("2g.20gb", "2g.20gb"),
    ],
)
def test_mig_profile_from_name(name: str, profile: str) -> None:
    assert mig_profile(name) == profile


def test_mig_profile_rejects_other_names() -> None:
    with pytest.raises(ValueError, match="does not end in a profile"):
        mig_profile("NVIDIA A100-SXM4-80GB")


@pytest.mark.parametrize(
    ("raw", "text"), [(12080, "12.8"), (11040, "11.4"), (13000, "13.0"), (0, "")]
)
def test_cuda_version(raw: int, text: str) -> None:
    assert cuda_version(raw) == text


# Every model of docs/gpu-models.md (G2/G3 are undisclosed: no compute capability), with
# GFD's family (k8s-device-plugin internal/lm/resource.go getArchFamily), plus the edges.
@pytest.mark.parametrize(
    ("model", "cc", "family"),
    [
        ("P100", "6.0", "pascal"),
        ("T4", "7.5", "turing"),
        ("V100M16", "7.0", "volta"),
        ("V100M32", "7.0", "volta"),
        ("A10", "8.6", "ampere"),
        ("A100-40GB", "8.0", "ampere"),
        ("A100-80GB", "8.0", "ampere"),
        ("H100-80GB", "9.0", "hopper"),
        ("H200-141GB", "9.0", "hopper"),
        ("L4", "8.9", "ada-lovelace"),
        ("L40S", "8.9", "ada-lovelace"),
        ("Jetson Xavier", "7.2", "volta"),
        ("A2/A16/A40", "8.6", "ampere"),
        ("B200", "10.0", "blackwell"),
        ("RTX PRO 6000 Blackwell", "12.0", "blackwell"),
        ("unknown", "", "undefined"),
        ("future", "13.0", "undefined"),
    ],
)
def test_gpu_family(model: str, cc: str, family: str) -> None:
    assert gpu_family(cc) == family


def test_nvlink_counts_direct_and_through_switches() -> None:
    bus = ["00000000:18:00.0", "00000000:2A:00.0", "0000:3a:00.0"]
    # GPU 0 and 1: four direct links (NVLink bridge); GPU 2: 2 links to a switch, as is one
    # link of GPU 0; P2P over NVLink only between 0 and 2 besides the bridge.
    remote = [
        ["0000:2a:00.0"] * 4 + ["0000:c1:00.0"],
        ["00000000:18:00.0"] * 4,
        ["0000:c1:00.0", "0000:c2:00.0"],
    ]
    p2p = [[False, True, True], [True, False, False], [True, False, False]]
    assert nvlink_counts(bus, remote, p2p) == [[0, 4, 1], [4, 0, 0], [1, 0, 0]]


def test_build_inventory_rejects_bad_matrix() -> None:
    raw = RawNode(
        driver_version="1",
        cuda_driver_version=0,
        gpus=(
            RawGpu(0, "GPU-a", "NVIDIA L4", 23034 << 20),
            RawGpu(1, "GPU-b", "NVIDIA L4", 23034 << 20),
        ),
        levels=((0, 10),),
    )
    with pytest.raises(ConfigError, match=r"topology.levels"):
        build_inventory(raw)


def test_build_inventory_names_a_bad_mig_device() -> None:
    raw = RawNode(
        driver_version="1",
        cuda_driver_version=0,
        gpus=(
            RawGpu(
                0,
                "GPU-a",
                "NVIDIA A100-SXM4-40GB",
                40960 << 20,
                mig_enabled=True,
                mig=(RawMig("weird", 0, "MIG-x"),),
            ),
        ),
    )
    with pytest.raises(ConfigError, match=r"gpus\[0\]\.mig\[0\]\.name"):
        build_inventory(raw)


def test_bad_inventory_file_names_file_field_and_value(tmp_path: Path) -> None:
    bad = tmp_path / "node.yaml"
    bad.write_text(HGX.read_text().replace("memoryMiB: 81559", "memoryMiB: -5", 1))
    with pytest.raises(ConfigError) as info:
        load_inventory_file(bad)
    msg = str(info.value)
    assert str(bad) in msg and "gpus.0.memoryMiB" in msg and "-5" in msg and "a number > 0" in msg


def test_missing_inventory_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="readable inventory file"):
        load_inventory_file(tmp_path / "nope.yaml")


def test_all_fixtures_load() -> None:
    for path in (HGX, MIG, PCIE):
        assert inventory_of(path).devices


def test_every_model_of_the_table_has_its_family_tested() -> None:
    from kallot.core.resources import GPU_MODELS

    marks = vars(test_gpu_family)["pytestmark"]  # set by the decorators, not in the type
    params = next(m for m in marks if m.name == "parametrize").args[1]
    tested = {model for model, _cc, _family in params}
    assert set(GPU_MODELS) - {"G2", "G3"} <= tested  # G2/G3: openb's undisclosed models
