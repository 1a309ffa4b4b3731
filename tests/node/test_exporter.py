"""The exporter's /metrics, scraped over HTTP and parsed with prometheus_client's parser."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kallot.config.device_record import DeviceRecord, RecordDevice
from kallot.node.allocate import PodRecord
from kallot.node.discovery import build_inventory
from kallot.node.exporter import (
    ExporterState,
    GpuCollector,
    make_registry,
    pod_uid_from_cgroup,
    pod_uid_of_pid,
    serve,
)
from kallot.node.fake import FakeBackend

DATA = Path(__file__).parent / "data"
MIB = 1 << 20


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def one(series: list[tuple[dict[str, str], float]], **labels: str) -> float:
    hits = [v for lab, v in series if all(lab.get(k) == v2 for k, v2 in labels.items())]
    assert len(hits) == 1, (labels, series)
    return hits[0]


def test_metrics_per_gpu_and_per_pod() -> None:
    backend = FakeBackend.from_file(DATA / "hgx-h100-8.yaml")
    inv = build_inventory(backend.raw(), backend.sharing())
    gpu0, gpu1 = inv.devices[0].uuid, inv.devices[1].uuid
    record = DeviceRecord(
        node="gpu-1",
        devices=(RecordDevice(index=0, uuid=gpu0, milli=500, mem_mib=40960, mode="mps"),),
    )
    pods = [
        PodRecord(
            namespace="ml", name="a", uid="11111111-2222-3333-4444-555555555555", record=record
        ),
    ]
    owners = {4242: pods[0].uid, 4343: pods[0].uid}
    state = ExporterState(node="gpu-1", inventory=inv)
    collector = GpuCollector(state, pod_of_pid=owners.get)
    backend.set_metrics(gpu1, utilization=87, memoryUsedMiB=30000)
    collector.update(
        samples=backend.metrics(),
        processes=backend.processes(),
        pods=pods,
        xid_counts={gpu1: 2},
        last_xid={gpu1: 79},
        unhealthy={gpu1},
        transitions={(gpu1, "Unhealthy"): 1},
    )
    httpd, port = serve(make_registry(collector), "127.0.0.1:0")
    try:
        m = scrape(port)
    finally:
        httpd.shutdown()
    assert len(m["DCGM_FI_DEV_GPU_UTIL"]) == 8
    labels = {"UUID": gpu1, "gpu": "1", "Hostname": "gpu-1", "modelName": "NVIDIA H100 80GB HBM3"}
    assert one(m["DCGM_FI_DEV_GPU_UTIL"], **labels) == 87
    assert one(m["DCGM_FI_DEV_FB_USED"], UUID=gpu1) == 30000
    assert one(m["DCGM_FI_DEV_FB_FREE"], UUID=gpu1) == 81559 - 30000
    assert one(m["DCGM_FI_DEV_FB_TOTAL"], UUID=gpu1) == 81559
    assert one(m["DCGM_FI_DEV_GPU_TEMP"], UUID=gpu1) == 31
    assert one(m["DCGM_FI_DEV_POWER_USAGE"], UUID=gpu1) == 110
    assert one(m["DCGM_FI_DEV_XID_ERRORS"], UUID=gpu1) == 79
    assert one(m["kallot_gpu_xid_errors_total"], UUID=gpu1) == 2
    assert one(m["kallot_gpu_healthy"], UUID=gpu1) == 0
    assert one(m["kallot_gpu_healthy"], UUID=gpu0) == 1
    assert one(m["kallot_gpu_health_transitions_total"], UUID=gpu1, to="Unhealthy") == 1
    # Per pod: allocated from the record, used from NVML's processes (10240 + 2048 MiB).
    pod = {"namespace": "ml", "pod": "a", "UUID": gpu0}
    assert one(m["kallot_pod_gpu_memory_allocated_bytes"], **pod) == 40960 * MIB
    assert one(m["kallot_pod_gpu_compute_allocated_milli"], **pod) == 500
    assert one(m["kallot_pod_gpu_memory_used_bytes"], **pod) == (10240 + 2048) * MIB
    assert one(m["kallot_pod_gpu_processes"], **pod) == 2


@pytest.mark.parametrize(
    ("text", "uid"),
    [
        (
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1f2e3d4c_5b6a_7980_a1b2_c3d4e5f60718.slice/cri-containerd-abc.scope\n",
            "1f2e3d4c-5b6a-7980-a1b2-c3d4e5f60718",
        ),
        (
            "12:memory:/kubepods/besteffort/pod1f2e3d4c-5b6a-7980-a1b2-c3d4e5f60718/0123abcd\n",
            "1f2e3d4c-5b6a-7980-a1b2-c3d4e5f60718",
        ),
        ("0::/user.slice/user-1000.slice/session-3.scope\n", None),
    ],
)
def test_pod_uid_from_cgroup(text: str, uid: str | None) -> None:
    assert pod_uid_from_cgroup(text) == uid


def test_pod_uid_of_pid_reads_proc(tmp_path: Path) -> None:
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "cgroup").write_text(
        "0::/kubepods/pod1f2e3d4c-5b6a-7980-a1b2-c3d4e5f60718/c1\n"
    )
    assert pod_uid_of_pid(77, tmp_path) == "1f2e3d4c-5b6a-7980-a1b2-c3d4e5f60718"
    assert pod_uid_of_pid(78, tmp_path) is None


async def test_dcgm_series_carry_the_holding_container_from_pod_resources(tmp_path: Path) -> None:
    """dcgm-exporter's pod, namespace and container labels, from the kubelet's pod-resources
    API (a real gRPC server): set for a GPU one container holds, empty for a shared one."""
    from kallot.node.podresources import holders_of, list_pod_resources
    from kallot.testing.kubelet import FakePodResources

    backend = FakeBackend.from_file(DATA / "hgx-h100-8.yaml")
    inv = build_inventory(backend.raw(), backend.sharing())
    gpu0, gpu1 = inv.devices[0].uuid, inv.devices[1].uuid
    server = FakePodResources(tmp_path / "pr.sock")
    server.pods[("ml", "train")] = {"c0": {"nvidia.com/gpu": [gpu1]}}
    server.pods[("ml", "a")] = {"main": {"kallot.io/gpu-milli": [f"{gpu0}::{k}" for k in range(3)]}}
    server.pods[("ml", "b")] = {
        "main": {"kallot.io/gpu-milli": [f"{gpu0}::{k}" for k in range(5, 9)]}
    }
    await server.start()
    try:
        holders = holders_of(await list_pod_resources(server.socket))
    finally:
        await server.stop()
    state = ExporterState(node="gpu-1", inventory=inv)
    collector = GpuCollector(state, pod_of_pid=lambda _pid: None)
    collector.update(samples=backend.metrics(), holders=holders)
    httpd, port = serve(make_registry(collector), "127.0.0.1:0")
    try:
        m = scrape(port)
        for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE"):
            one(m[name], UUID=gpu1, pod="train", namespace="ml", container="c0")
            one(m[name], UUID=gpu0, pod="", namespace="", container="")  # two pods share it
        assert len(m["DCGM_FI_DEV_GPU_UTIL"]) == 8  # one series per GPU: nothing counted twice
        # Next to dcgm-exporter: only kallot's own series.
        collector.update(dcgm_series=False)
        m = scrape(port)
        assert not [n for n in m if n.startswith("DCGM_")]
        assert len(m["kallot_gpu_healthy"]) == 8
    finally:
        httpd.shutdown()


async def test_agent_turns_dcgm_series_off_while_dcgm_exporter_runs(tmp_path: Path) -> None:
    from kallot.node.agent import Agent, AgentConfig
    from kallot.node.deviceplugin import StaticRecordSource

    class Source(StaticRecordSource):
        def __init__(self) -> None:
            super().__init__()
            self.running: list[str] = ["busybox"]

        def images(self) -> list[str]:
            return self.running

    source = Source()
    backend = FakeBackend.from_file(DATA / "hgx-h100-8.yaml")
    config = AgentConfig(node="gpu-1", plugin_dir=tmp_path, pod_resources_socket=tmp_path / "none")
    agent = Agent(config, backend, source)
    await agent.refresh()
    assert agent.state.dcgm_series
    source.running = ["nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3-4.1.3-ubuntu22.04"]
    await agent.refresh()
    # bool(): mypy would keep the narrowing of the assert above across the refresh
    assert not bool(agent.state.dcgm_series)
    agent.config.dcgm_series = "on"  # the flag wins over detection
    await agent.refresh()
    assert agent.state.dcgm_series
