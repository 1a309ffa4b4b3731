"""End to end on real parts: the kallot scheduler places two pods on the real API server, the
node agent (fake NVML backend, scripted per-pod use) exports allocated and used series, a real
Prometheus scrapes it, and ``kallot report waste`` and ``kallot rightsize`` read Prometheus.
The expected numbers are worked out by hand in the comments.

Script (constant over the window): ``web`` (a Deployment's pod) holds a whole H100 and uses
8192 MiB and 20% of the SMs; ``chat-0`` (a StatefulSet's pod) holds a share of 500 milli and
40 GiB and uses 10240 MiB and 10%.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s_client
from typer.testing import CliRunner

from kallot.cli.main import app
from kallot.config import device_record
from kallot.config.device_record import DeviceRecord
from kallot.node.agent import Agent, AgentConfig
from kallot.node.discovery import MIB, GpuProcess
from kallot.node.fake import FakeBackend, InventoryFile
from kallot.node.k8s import ApiRecordSource, NodeClient
from kallot.testing.controlplane import ControlPlane
from kallot.testing.kubelet import FakeKubelet
from kallot.testing.live import Cluster, inventory_node_body, pod_body, wait_until
from kallot.testing.prometheus import Prometheus

pytestmark = pytest.mark.controlplane

H100_MEM = 81559
W = 40  # window, seconds; step 1 s -> 41 points


@pytest.fixture
def cluster(report_cp: ControlPlane, tmp_path: Path) -> Iterator[Cluster]:
    with report_cp.api_client() as api:
        c = Cluster(report_cp, api, tmp_path)
        try:
            yield c
        finally:
            c.close()


def _owned(name: str, kind: str, owner: str, **kw: Any) -> dict[str, Any]:
    body = pod_body(name, **kw)
    body["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "apps/v1",
            "kind": kind,
            "name": owner,
            "uid": str(uuid.uuid4()),
            "controller": True,
        }
    ]
    return body


def _schedule(cluster: Cluster, node: str) -> tuple[dict[str, dict[str, Any]], int]:
    cluster.add_nodes([inventory_node_body(node, 2)])
    s = cluster.scheduler()
    web = _owned(
        "web-7d9f8c6b5-x2x4z",
        "ReplicaSet",
        "web-7d9f8c6b5",
        resources={"nvidia.com/gpu": "1"},
        labels={"pod-template-hash": "7d9f8c6b5"},
    )
    chat = _owned(
        "chat-0",
        "StatefulSet",
        "chat",
        resources={"kallot.io/gpu-milli": "500", "kallot.io/gpu-memory": "40Gi"},
    )
    cluster.create_pods([web, chat])
    names = {"web-7d9f8c6b5-x2x4z", "chat-0"}

    def bound() -> dict[str, dict[str, Any]] | None:
        pods = {p["metadata"]["name"]: p for p in cluster.pods()}
        ok = all(
            device_record.ANNOTATION
            in (pods.get(n, {}).get("metadata", {}).get("annotations") or {})
            and pods[n]["spec"].get("nodeName")
            for n in names
        )
        return pods if ok else None

    pods = wait_until(lambda: s.check_alive() and bound(), timeout=90, what="both pods bound")
    return pods, s.port


def _backend(node: str) -> FakeBackend:
    gpu = {"name": "NVIDIA H100 80GB HBM3", "memoryMiB": H100_MEM, "computeCapability": "9.0"}
    spec = InventoryFile.model_validate(
        {
            "sharing": {"mode": "mps"},
            "gpus": [{**gpu, "uuid": f"GPU-{node}-{i}"} for i in range(2)],
        }
    )
    return FakeBackend(spec)


def _cli(*args: str) -> Any:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result


async def test_waste_and_rightsize_from_real_prometheus(
    cluster: Cluster, report_cp: ControlPlane, tmp_path: Path
) -> None:
    node = f"{cluster.run}-gpu"
    pods, scheduler_port = await asyncio.to_thread(_schedule, cluster, node)
    web, chat = pods["web-7d9f8c6b5-x2x4z"], pods["chat-0"]
    rec = {
        n: DeviceRecord.from_json(p["metadata"]["annotations"][device_record.ANNOTATION])
        for n, p in (("web", web), ("chat", chat))
    }
    # the scheduler's records: a whole GPU (all of it) and the share
    assert (rec["web"].devices[0].milli, rec["web"].devices[0].mem_mib) == (1000, H100_MEM)
    assert (rec["chat"].devices[0].milli, rec["chat"].devices[0].mem_mib) == (500, 40960)
    # the script: pid -> pod (as /proc/<pid>/cgroup would say), use on the pod's GPU
    pid_pod = {1001: web["metadata"]["uid"], 1002: chat["metadata"]["uid"]}
    script = [
        GpuProcess(rec["web"].devices[0].uuid, 1001, 8192 * MIB, sm_util_pct=20.0),
        GpuProcess(rec["chat"].devices[0].uuid, 1002, 10240 * MIB, sm_util_pct=10.0),
    ]
    backend = _backend(node)
    backend.play(lambda _t: script)

    sockdir = Path(tempfile.mkdtemp(prefix="kdp-", dir="/tmp"))
    kubelet = FakeKubelet(sockdir)
    await kubelet.start()
    api = await NodeClient.connect(report_cp.kubeconfig_path)
    config = AgentConfig(
        node=node,
        plugin_dir=sockdir,
        pod_resources_socket=sockdir / "none.sock",
        sharing=backend.sharing(),
        refresh_s=0.5,
        metrics_address="127.0.0.1:0",
    )
    agent = Agent(config, backend, ApiRecordSource(api, node), pod_of_pid=pid_pod.get)
    await agent.start()
    try:
        targets = [f"127.0.0.1:{agent.metrics_port}", f"127.0.0.1:{scheduler_port}"]
        with Prometheus(targets) as prom:
            # both the agent's and the scheduler's /metrics are scraped
            await asyncio.to_thread(prom.wait_for, "sum(up) == 2")
            # synchronize on what Prometheus stored: both pods' used and allocated series...
            both = "count(kallot_pod_gpu_compute_used_milli) == 2 and count(kallot_pod_gpu_memory_allocated_bytes) == 2"
            await asyncio.to_thread(prom.wait_for, both)
            first = await asyncio.to_thread(
                prom.wait_for, "max(timestamp(kallot_pod_gpu_compute_used_milli))"
            )
            t0 = float(first[0]["value"][1])
            # ...then W more seconds of scrapes after them
            await asyncio.to_thread(
                prom.wait_for,
                "max(timestamp(kallot_pod_gpu_memory_used_bytes))",
                lambda r: bool(r) and float(r[0]["value"][1]) >= t0 + W + 2,
            )
            end = f"{t0 + W + 1:.3f}"
            prices = tmp_path / "prices.yaml"
            prices.write_text("currency: USD\nperGpuHour: {NVIDIA H100 80GB HBM3: 4.0}\n")
            out = tmp_path / "waste.json"
            page = tmp_path / "waste.html"
            window = ["--prometheus", prom.url, "--since", f"{W}s", "--end", end, "--step", "1"]
            _cli(
                "report",
                "waste",
                *window,
                "--prices",
                str(prices),
                "--json",
                str(out),
                "--html",
                str(page),
            )
            rs_out = tmp_path / "rs.json"
            patches = tmp_path / "patches.sh"
            _cli("rightsize", *window, "--json", str(rs_out), "--patches", str(patches))
    finally:
        await agent.stop()
        await api.close()
        await kubelet.stop()
        shutil.rmtree(sockdir, ignore_errors=True)

    w = json.loads(out.read_text())
    h = 41 / 3600  # 41 points of 1 s
    ns = cluster.ns
    web_w, chat_w = w["workloads"][f"{ns}/Deployment/web"], w["workloads"][f"{ns}/StatefulSet/chat"]
    # web: allocated max(1000/1000, 81559/81559) = 1; used max(200/1000, 8192/81559) = 0.2
    assert web_w["allocated_gpu_hours"] == pytest.approx(1.0 * h, abs=1e-6)
    assert web_w["used_gpu_hours"] == pytest.approx(0.2 * h, abs=1e-6)
    assert web_w["idle_gpu_hours"] == pytest.approx(0.8 * h, abs=1e-6)
    assert web_w["cost"] == pytest.approx(4.0 * h, abs=1e-4)
    # chat: allocated max(500/1000, 40960/81559 = 0.502213); used max(100/1000,
    # 10240/81559 = 0.125553)
    a_chat, u_chat = 40960 / H100_MEM, 10240 / H100_MEM
    assert chat_w["allocated_gpu_hours"] == pytest.approx(a_chat * h, abs=1e-6)
    assert chat_w["used_gpu_hours"] == pytest.approx(u_chat * h, abs=1e-6)
    # the namespace, the model and the cluster add them up; web is the worst offender
    total = w["namespaces"][ns]
    assert total["allocated_gpu_hours"] == pytest.approx((1 + a_chat) * h, abs=1e-6)
    assert total["idle_gpu_hours"] == pytest.approx((0.8 + a_chat - u_chat) * h, abs=1e-6)
    assert w["models"]["H100-80GB"]["pods"] == 2
    assert w["clusters"]["default"]["idle_cost"] == pytest.approx(
        4 * (0.8 + a_chat - u_chat) * h, abs=1e-4
    )
    assert w["worst_offenders"][:2] == [f"{ns}/Deployment/web", f"{ns}/StatefulSet/chat"]
    assert "data:image/png;base64," in page.read_text()

    recs = {r["workload"]: r for r in json.loads(rs_out.read_text())}
    r_web, r_chat = recs[f"{ns}/Deployment/web"], recs[f"{ns}/StatefulSet/chat"]
    # web: memory max(8192 x 1.1, 8192 x 1.25, 8192 + 512, 8192 + 0) = 10240 (a multiple of
    # 256); compute 200 x 1.2 = 240; saving 1 - max(0.24, 10240/81559 = 0.125553) = 0.76
    assert r_web["form"] == "share" and r_web["samples"] == 41
    assert r_web["recommended"] == {
        "milli": 240,
        "mem_mib": 10240,
        "mig_profile": "",
        "whole": False,
    }
    assert r_web["saving_gpu_eq_per_pod"] == pytest.approx(0.76, abs=1e-6)
    # chat: 10240 x 1.25 = 12800; 100 x 1.2 = 120; 0.502213 - max(0.12, 12800/81559)
    assert r_chat["recommended"]["mem_mib"] == 12800 and r_chat["recommended"]["milli"] == 120
    assert r_chat["saving_gpu_eq_per_pod"] == pytest.approx(a_chat - 12800 / H100_MEM, abs=1e-6)
    assert r_web["peak_mem_mib"] == 8192 and "out of memory" in r_web["oom_risk"]
    # the patches: web's Deployment moves from nvidia.com/gpu to a share; chat's StatefulSet
    lines = patches.read_text().splitlines()
    assert lines[0].startswith(f"kubectl -n {ns} patch deployment web --type=json")
    assert lines[1].startswith(f"kubectl -n {ns} patch statefulset chat --type=json")
    web_ops = json.loads(lines[0].split(" -p ", 1)[1].strip("'"))
    limits = "/spec/template/spec/containers/0/resources/limits/"
    assert web_ops == [
        {"op": "remove", "path": limits + "nvidia.com~1gpu"},
        {"op": "add", "path": limits + "kallot.io~1gpu-milli", "value": "240"},
        {"op": "add", "path": limits + "kallot.io~1gpu-memory", "value": "10240Mi"},
    ]
    # ...and the API server takes it: the Deployment's template now asks kallot's share
    apps = k8s_client.AppsV1Api(cluster.api)
    apps.create_namespaced_deployment(
        ns, k8s_client.V1Deployment.model_validate(_deployment("web"))
    )
    apps.patch_namespaced_deployment("web", ns, web_ops)
    got = apps.read_namespaced_deployment("web", ns, _preload_content=False)
    lim = json.loads(got.data)["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]  # type: ignore[attr-defined]  # _preload_content=False: the raw urllib3 response
    assert lim == {
        "cpu": "100m",
        "memory": "128Mi",
        "kallot.io/gpu-milli": "240",
        "kallot.io/gpu-memory": "10Gi",  # 10240Mi, as the API server canonicalizes it
    }


def _deployment(name: str) -> dict[str, Any]:
    pod = pod_body(name, resources={"nvidia.com/gpu": "1"})
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": pod["spec"]},
        },
    }
