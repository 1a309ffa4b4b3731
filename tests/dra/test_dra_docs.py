"""The examples of docs/dra.md ("Examples (NVIDIA's gpu.nvidia.com driver)") applied as written
with kubectl on the real control plane (kube-apiserver, kube-controller-manager's job,
resourceclaim and garbage-collector controllers, kallot's scheduler), in order, on
``gpu.nvidia.com``-shaped slices: 11 whole H100s (8 on node dra-a, 3 on dra-d, two PCIe roots
each), one A100 as dynamic-MIG partitions (dra-b), two consumable-capacity GPUs (dra-c). The
whole-GPU examples use exactly the 11 whole GPUs (1 + 2 + 8), so the share can only be served
by a shareable GPU. The nodes have no ``nvidia.com/gpu`` in their allocatable (no device
plugin), so the last example's plain ``nvidia.com/gpu: 1`` pod is served by DRA. Every pod must
be bound with its claims allocated as the example says."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kallot.testing.controllers import ControllerManager
from kallot.testing.controlplane import ControlPlane, controlplane_bin_dir, gpu_node_body
from kallot.testing.dra import nvidia_classes, nvidia_node_slices
from kallot.testing.live import Cluster, wait_until

pytestmark = pytest.mark.controlplane

ROOT = Path(__file__).resolve().parents[2]
GROUP, VERSION = "resource.k8s.io", "v1"
PCIE = "resource.kubernetes.io/pcieRoot"


def examples() -> list[str]:
    text = (ROOT / "docs" / "dra.md").read_text()
    section = text.split("### Examples (NVIDIA's `gpu.nvidia.com` driver)", 1)[1]
    section = section.split("RBAC (Helm chart", 1)[0]
    return re.findall(r"```yaml\n(.*?)```", section, re.S)


@pytest.fixture(scope="module")
def cp() -> Iterator[ControlPlane]:
    controllers = ("job-controller", "resourceclaim-controller", "garbage-collector-controller")
    with ControlPlane(scheduler=False) as plane, ControllerManager(plane, controllers=controllers):
        yield plane


def _apply(cluster: Cluster, manifest: str) -> None:
    env = {**os.environ, "KUBECONFIG": str(cluster.cp.kubeconfig_path)}
    subprocess.run(
        [str(controlplane_bin_dir() / "kubectl"), "apply", "-n", cluster.ns, "-f", "-"],
        input=manifest,
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_docs_examples_are_allocated(cp: ControlPlane, tmp_path: Path) -> None:
    blocks = examples()
    assert len(blocks) == 6
    with cp.api_client() as api:
        cluster = Cluster(cp, api, tmp_path)
        co = client.CustomObjectsApi(api)
        slices = [
            *nvidia_node_slices("dra-a", gpus=8, roots=2),
            *nvidia_node_slices("dra-d", gpus=3, roots=2),
            *nvidia_node_slices("dra-b", gpus=0, dynamic_mig=1),
            *nvidia_node_slices("dra-c", gpus=0, shared=2),
        ]
        try:
            nodes = [gpu_node_body(n, gpus=0) for n in ("dra-a", "dra-b", "dra-c", "dra-d")]
            for node in nodes:  # DRA only: no device plugin advertises nvidia.com/gpu
                for part in ("capacity", "allocatable"):
                    del node["status"][part]["nvidia.com/gpu"]
            cluster.add_nodes(nodes)
            for cls in nvidia_classes():
                co.create_cluster_custom_object(GROUP, VERSION, "deviceclasses", cls)
            for s in slices:
                co.create_cluster_custom_object(GROUP, VERSION, "resourceslices", s)
            sched = cluster.scheduler()
            sched.wait_ready(timeout=60)

            def claims() -> dict[str, dict[str, Any]]:
                got = co.list_namespaced_custom_object(GROUP, VERSION, cluster.ns, "resourceclaims")
                assert isinstance(got, dict)  # the client annotates custom objects as object
                return {c["metadata"]["name"]: c for c in got["items"]}

            def results(name: str) -> list[dict[str, Any]]:
                alloc = (claims()[name].get("status") or {}).get("allocation") or {}
                out: list[dict[str, Any]] = alloc.get("devices", {}).get("results", [])
                return out

            def bound(*names: str) -> None:
                wait_until(
                    lambda: all(cluster.pod(n)["spec"].get("nodeName") for n in names),
                    timeout=90,
                    what=f"{names} bound\n{sched.log_tail()}",
                )

            whole, pair, gang, mig, share, plain = blocks
            _apply(cluster, whole)
            bound("one-gpu")
            assert len(results("one-gpu")) == 1

            _apply(cluster, pair)
            bound("gpu-pair")
            devices = {r["device"] for r in results("gpu-pair")}
            pool = {r["pool"] for r in results("gpu-pair")}
            assert len(devices) == 2 and len(pool) == 1
            roots = {
                d["attributes"][PCIE]["string"]
                for s in slices
                if s["spec"]["pool"]["name"] in pool
                for d in s["spec"].get("devices", [])
                if d["name"] in devices
            }
            assert len(roots) == 1, roots

            _apply(cluster, gang)
            wait_until(
                lambda: (
                    len([p for p in cluster.pods() if p["metadata"]["name"].startswith("train-")])
                    == 8
                    and all(
                        p["spec"].get("nodeName")
                        for p in cluster.pods()
                        if p["metadata"]["name"].startswith("train-")
                    )
                ),
                timeout=120,
                what=f"the 8 workers bound\n{sched.log_tail()}",
            )
            workers = [n for n in claims() if n.startswith("train-")]
            assert len(workers) == 8
            taken = [(r["pool"], r["device"]) for n in workers for r in results(n)]
            assert len(set(taken)) == 8

            _apply(cluster, mig)
            bound("mig-1g")
            [r] = results("mig-1g")
            assert r["pool"] == "dra-b" and "-mig-1g5gb-" in r["device"], r

            _apply(cluster, share)
            bound("share-20g")
            [r] = results("share-20g")
            assert r["pool"] == "dra-c" and r["consumedCapacity"] == {"memory": "20Gi"}, r
            assert r["shareID"]

            _apply(cluster, plain)
            bound("plain-gpu")
            pod = cluster.pod("plain-gpu")
            name = pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
            [r] = results(name)
            assert r["request"] == "container-0-request-0", r
        finally:
            cluster.close()
            for s in slices:
                co.delete_cluster_custom_object(
                    GROUP, VERSION, "resourceslices", s["metadata"]["name"]
                )
