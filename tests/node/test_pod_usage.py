"""Per-pod use next to allocation on the exporter: compute used from per-process SM samples,
the same labels on allocated and used series (MIG profile, model, workload), scripted usage
timelines and generators on the fake backend, and the pod's workload from its owner."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kallot.config.device_record import DeviceRecord, RecordDevice, RecordMig
from kallot.core.errors import ConfigError
from kallot.node.allocate import PodRecord
from kallot.node.discovery import MIB, GpuProcess, build_inventory
from kallot.node.exporter import ExporterState, GpuCollector, make_registry, serve
from kallot.node.fake import FakeBackend, InventoryFile, load_inventory_file
from kallot.node.k8s import pod_owner

DATA = Path(__file__).parent / "data"
UID_A = "11111111-2222-3333-4444-555555555555"
UID_B = "11111111-2222-3333-4444-666666666666"


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


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_compute_used_and_labels_join_allocated(tmp_path: Path) -> None:
    spec = load_inventory_file(DATA / "mig-a100-mixed.yaml")
    gpu, mig3 = (
        "GPU-5a3c9f1e-0200-4e4e-8a55-000000000000",
        "MIG-5a3c9f1e-0200-4e4e-8a55-000000000001",
    )
    spec = InventoryFile.model_validate(
        {
            **spec.model_dump(by_alias=True),
            "processes": [
                # pod a: two processes in the 3g.40gb instance; timeline for pid 10
                {
                    "uuid": mig3,
                    "pid": 10,
                    "usedMemoryMiB": 1000,
                    "smUtil": 5,
                    "timeline": [[0, 8192, 20], [30, 12288, 35.5]],
                },
                {"uuid": mig3, "pid": 11, "usedMemoryMiB": 2048, "smUtil": 10},
                # pod b: one process without a per-process sample (None: no compute series)
                {"uuid": gpu, "pid": 20, "usedMemoryMiB": 512},
            ],
        }
    )
    clock = Clock()
    backend = FakeBackend(spec, clock=clock)
    inv = build_inventory(backend.raw(), backend.sharing())
    rec_a = DeviceRecord(
        node="n1",
        devices=(
            RecordDevice(
                index=0,
                uuid=mig3,
                milli=428,
                mem_mib=40960,
                mode="mig",
                mig=RecordMig(profile="3g.40gb", start=0),
            ),
        ),
    )
    pods = [
        PodRecord(namespace="ml", name="a-1", uid=UID_A, record=rec_a, owner="Deployment/a"),
        PodRecord(namespace="ml", name="b", uid=UID_B, record=None),
    ]
    owners = {10: UID_A, 11: UID_A, 20: UID_B}
    collector = GpuCollector(ExporterState(node="n1", inventory=inv), pod_of_pid=owners.get)
    httpd, port = serve(make_registry(collector), "127.0.0.1:0")
    try:
        clock.t = 110.0  # 10 s in: pid 10 at its first point (8192 MiB, 20%)
        collector.update(processes=backend.processes(), pods=pods)
        m10 = scrape(port)
        clock.t = 140.0  # 40 s in: second point (12288 MiB, 35.5%)
        collector.update(processes=backend.processes(), pods=pods)
        m40 = scrape(port)
    finally:
        httpd.shutdown()
    labels = {
        "namespace": "ml",
        "pod": "a-1",
        "UUID": mig3,
        "GPU_I_PROFILE": "3g.40gb",
        "modelName": "NVIDIA A100-SXM4-80GB",
        "workload": "Deployment/a",
        "Hostname": "n1",
    }
    # (20 + 10) % x 10 = 300 milli; memory (8192 + 2048) MiB
    assert one(m10["kallot_pod_gpu_compute_used_milli"], **labels) == 300
    assert one(m10["kallot_pod_gpu_memory_used_bytes"], **labels) == (8192 + 2048) * MIB
    # the allocated series carry exactly the same labels: one join gives allocated vs used
    assert one(m10["kallot_pod_gpu_compute_allocated_milli"], **labels) == 428
    alloc = [lab for lab, _ in m10["kallot_pod_gpu_compute_allocated_milli"]]
    used = [lab for lab, _ in m10["kallot_pod_gpu_compute_used_milli"]]
    assert alloc == used == [labels]
    # (35.5 + 10) x 10 = 455 milli; (12288 + 2048) MiB
    assert one(m40["kallot_pod_gpu_compute_used_milli"], **labels) == 455
    assert one(m40["kallot_pod_gpu_memory_used_bytes"], **labels) == (12288 + 2048) * MIB
    # pod b: used (no record: nothing allocated), no compute sample -> no compute series
    assert one(m40["kallot_pod_gpu_memory_used_bytes"], pod="b") == 512 * MIB
    assert not [lab for lab, _ in m40["kallot_pod_gpu_compute_used_milli"] if lab["pod"] == "b"]


def test_fake_play_generator() -> None:
    clock = Clock()
    backend = FakeBackend(load_inventory_file(DATA / "hgx-h100-8.yaml"), clock=clock)
    uuid = backend.spec.gpus[0].uuid
    backend.play(lambda t: [GpuProcess(uuid, 7, int(t) * MIB, sm_util_pct=t / 2)])
    clock.t = 130.0
    assert backend.processes() == [GpuProcess(uuid, 7, 30 * MIB, sm_util_pct=15.0)]


def test_fake_timeline_must_be_ordered(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    text = (DATA / "hgx-h100-8.yaml").read_text()
    text = text.replace(
        "pid: 4242, usedMemoryMiB: 10240}",
        "pid: 4242, usedMemoryMiB: 10240, timeline: [[10, 1, 1], [5, 1, 1]]}",
    )
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"timeline.*times must not decrease"):
        load_inventory_file(path)


@pytest.mark.parametrize(
    ("meta", "want"),
    [
        (
            {
                "labels": {"pod-template-hash": "7d9f8c6b5"},
                "ownerReferences": [
                    {"kind": "ReplicaSet", "name": "web-7d9f8c6b5", "controller": True}
                ],
            },
            "Deployment/web",
        ),
        (
            {"ownerReferences": [{"kind": "StatefulSet", "name": "db", "controller": True}]},
            "StatefulSet/db",
        ),
        (
            {"ownerReferences": [{"kind": "Job", "name": "train-1", "controller": True}]},
            "Job/train-1",
        ),
        # a ReplicaSet without the Deployment's hash label is its own workload
        (
            {"ownerReferences": [{"kind": "ReplicaSet", "name": "rs", "controller": True}]},
            "ReplicaSet/rs",
        ),
        ({"ownerReferences": [{"kind": "ConfigMap", "name": "x"}]}, ""),
        ({}, ""),
    ],
)
def test_pod_owner(meta: dict[str, object], want: str) -> None:
    assert pod_owner(meta) == want
