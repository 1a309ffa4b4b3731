"""The committed gRPC modules are what tools/gen_protos.sh generates from the .proto files, and
the wire names and field numbers are the kubelet's (docs: kubernetes/kubelet api.proto)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kallot.node.proto import deviceplugin_v1beta1_pb2 as dp
from kallot.node.proto import dra_health_v1_pb2 as health
from kallot.node.proto import dra_health_v1alpha1_pb2 as health_alpha
from kallot.node.proto import podresources_v1_pb2 as pr

PROTO = Path(__file__).resolve().parents[2] / "src" / "kallot" / "node" / "proto"


def test_generated_modules_are_up_to_date(tmp_path: Path) -> None:
    src = tmp_path / "kallot" / "node" / "proto"
    src.mkdir(parents=True)
    for proto in PROTO.glob("*.proto"):
        shutil.copy(proto, src / proto.name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I",
            str(tmp_path),
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            *sorted(str(p) for p in src.glob("*.proto")),
        ],
        check=True,
        timeout=120,
    )
    for generated in sorted(src.glob("*_pb2*.py*")):
        committed = PROTO / generated.name
        assert committed.read_text() == generated.read_text(), (
            f"run tools/gen_protos.sh: {generated.name}"
        )


@pytest.mark.parametrize(
    ("message", "fields"),
    [
        (dp.RegisterRequest, {"version": 1, "endpoint": 2, "resource_name": 3, "options": 4}),
        (
            dp.DevicePluginOptions,
            {"pre_start_required": 1, "get_preferred_allocation_available": 2},
        ),
        (dp.Device, {"ID": 1, "health": 2, "topology": 3}),
        (
            dp.ContainerPreferredAllocationRequest,
            {"available_deviceIDs": 1, "must_include_deviceIDs": 2, "allocation_size": 3},
        ),
        (
            dp.ContainerAllocateResponse,
            {"envs": 1, "mounts": 2, "devices": 3, "annotations": 4, "cdi_devices": 5},
        ),
        (dp.Mount, {"container_path": 1, "host_path": 2, "read_only": 3}),
        (dp.DeviceSpec, {"container_path": 1, "host_path": 2, "permissions": 3}),
        (pr.PodResources, {"name": 1, "namespace": 2, "containers": 3}),
        *(
            (
                api.DeviceHealth,
                {
                    "device": 1,
                    "health": 2,
                    "last_updated_time": 3,
                    "health_check_timeout_seconds": 4,
                    "message": 5,
                },
            )
            for api in (health, health_alpha)
        ),
        (pr.ContainerDevices, {"resource_name": 1, "device_ids": 2, "topology": 3}),
    ],
)
def test_field_numbers(message: type, fields: dict[str, int]) -> None:
    got = {f.name: f.number for f in message.DESCRIPTOR.fields}  # type: ignore[attr-defined]
    assert got == fields


def test_service_names() -> None:
    services = {
        s.full_name: [m.name for m in s.methods] for s in dp.DESCRIPTOR.services_by_name.values()
    }
    assert services == {
        "v1beta1.Registration": ["Register"],
        "v1beta1.DevicePlugin": [
            "GetDevicePluginOptions",
            "ListAndWatch",
            "GetPreferredAllocation",
            "Allocate",
            "PreStartContainer",
        ],
    }
    assert pr.DESCRIPTOR.services_by_name["PodResourcesLister"].full_name == "v1.PodResourcesLister"


def test_health_service_names() -> None:
    # kubelets 1.34-1.36 call v1alpha1.DRAResourceHealth (k8s.io/kubelet v0.36
    # pkg/kubelet/cm/dra/plugin), 1.37 on v1.DRAResourceHealth: the plugin serves both.
    for api, name in ((health_alpha, "v1alpha1"), (health, "v1")):
        service = api.DESCRIPTOR.services_by_name["DRAResourceHealth"]
        assert service.full_name == f"{name}.DRAResourceHealth"
        assert [m.name for m in service.methods] == ["NodeWatchResources"]
        assert {v.name: v.number for v in api.HealthStatus.DESCRIPTOR.values} == {
            "UNKNOWN": 0,
            "HEALTHY": 1,
            "UNHEALTHY": 2,
        }
