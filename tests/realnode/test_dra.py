"""The DRA path on a real node: ``kallot agent run --dra`` (fake backend, a real process)
registers the driver ``gpu.kallot.io`` with the real kubelet's plugin watcher and publishes its
ResourceSlices; ``kallot scheduler`` allocates a pod's ResourceClaim; the kubelet calls
NodePrepareResources, containerd applies the CDI edits of the agent's per-claim spec (environment
and the stand-in device nodes under ``--dev-root``), and NodeUnprepareResources removes the spec
once the pod is gone. A claim whose preparation fails leaves its pod pending with the kubelet's
event.

What the stand-in (kallot.testing.kubelet.DraKubelet, tests/node/test_dra_plugin.py) still
covers: every prepare error, dynamic MIG, checkpoints across agent restarts, the specs against
the runtimes' CDI library.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from kallot.k8sclient import sync as client
from kallot.node import cdi, dra
from kallot.testing.controlplane import ControlPlane
from kallot.testing.dra import GROUP, VERSION, claim, dra_control_plane, exactly
from kallot.testing.live import SchedulerProcess, free_port
from kallot.testing.node import BUSYBOX_IMAGE, Node

pytestmark = [pytest.mark.node, pytest.mark.controlplane]

INVENTORY = Path(__file__).parents[1] / "node" / "data" / "dra-a100-3.yaml"
GPU1 = "GPU-5a3c9f1e-0401-4e4e-8a55-000000000000"
SCRIPT = (
    "env | grep -E '^(NVIDIA_|CUDA_|KALLOT_)' | sort; "
    "for f in /dev/nvidia*; do [ -c $f ] && echo dev=$f; done; "
    "echo done; exec sleep 3600"
)


class DraNode:
    def __init__(self, plane: ControlPlane, node: Node, api: Any) -> None:
        self.plane, self.node = plane, node
        self.v1: Any = client.CoreV1Api(api)
        self.co: Any = k8s.CustomObjectsApi(api)
        log = node.dir / "agent.log"
        args = [
            sys.executable,
            "-m",
            "kallot.cli.main",
            "agent",
            "run",
            "--dra",
            "--no-device-plugin",
            f"--node-name={node.name}",
            f"--inventory-file={INVENTORY}",
            f"--kubeconfig={plane.kubeconfig_path}",
            f"--kubelet-plugins-dir={node.plugins_dir}",
            f"--kubelet-registry-dir={node.plugins_registry_dir}",
            f"--cdi-dir={node.cdi_dir}",
            f"--dev-root={node.dir / 'dev'}",
            f"--metrics-address=127.0.0.1:{free_port()}",
            "--refresh-seconds=1",
        ]
        with log.open("ab") as f:
            self.agent = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT)
        self.scheduler = SchedulerProcess(
            plane.kubeconfig_path, node.dir / "scheduler.log", identity="realnode-dra"
        )

    def stop(self) -> None:
        for p in self.v1.list_namespaced_pod("default").items:
            self.v1.delete_namespaced_pod(p.metadata.name, "default", grace_period_seconds=1)
        self.scheduler.terminate()
        self.agent.terminate()
        try:
            self.agent.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.agent.kill()
            self.agent.wait()

    def pod(self, name: str, claim_name: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "schedulerName": "kallot",
                "terminationGracePeriodSeconds": 1,
                "automountServiceAccountToken": False,
                "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
                "containers": [
                    {
                        "name": "main",
                        "image": BUSYBOX_IMAGE,
                        "imagePullPolicy": "Never",
                        "command": ["sh", "-c", SCRIPT],
                        "resources": {"requests": {"cpu": "100m"}, "claims": [{"name": "gpu"}]},
                    }
                ],
            },
        }

    def claim_specs(self) -> list[Path]:
        return sorted(self.node.cdi_dir.glob("k8s.gpu.kallot.io-claim_*.json"))


@pytest.fixture(scope="module")
def dra_node() -> Iterator[DraNode]:
    with (
        dra_control_plane(scheduler=False) as plane,
        Node(plane) as node,
        plane.api_client() as api,
    ):
        d = DraNode(plane, node, api)
        try:
            for body in dra.device_classes():
                d.co.create_cluster_custom_object(GROUP, VERSION, "deviceclasses", body)
            yield d
        finally:
            d.stop()


def test_a_claim_kallot_allocates_is_prepared_and_unprepared_by_the_real_kubelet(
    dra_node: DraNode,
) -> None:
    d = dra_node
    # The kubelet's plugin watcher found the driver's registration socket and the agent
    # published its slices.
    d.node.wait_for(
        lambda: (
            d.node.kubelet_log_count(dra.DRIVER) > 0
            and d.co.list_cluster_custom_object(GROUP, VERSION, "resourceslices")["items"]
        ),
        60,
        "the driver registered with the kubelet and its ResourceSlices published",
    )
    body = claim("whole", [exactly("gpu", dra.CLASS_GPU)])
    body["metadata"].pop("uid")
    d.co.create_namespaced_custom_object(GROUP, VERSION, "default", "resourceclaims", body)
    d.v1.create_namespaced_pod("default", d.pod("dra-whole", "whole"))

    def printed() -> str | None:
        pod = d.v1.read_namespaced_pod("dra-whole", "default")
        if pod.status.phase != "Running":
            return None
        text = d.node.pod_log("default", "dra-whole", "main")
        return text if text.endswith("done\n") else None

    text = d.node.wait_for(printed, 90, "pod dra-whole running and printing its devices")
    alloc = d.co.get_namespaced_custom_object(GROUP, VERSION, "default", "resourceclaims", "whole")
    (result,) = alloc["status"]["allocation"]["devices"]["results"]
    assert result["driver"] == dra.DRIVER and result["pool"] == d.node.name
    assert result["device"] == "gpu-1"  # the only whole, exclusive GPU of the node
    shown = set(text.splitlines()) - {"done"}
    assert shown == {
        f"NVIDIA_VISIBLE_DEVICES={GPU1}",
        "KALLOT_DRA_DEVICE=gpu-1",
        "dev=/dev/nvidia1",
        *(f"dev=/dev/{n}" for n in cdi.CONTROL_NODES),
    }
    assert len(d.claim_specs()) == 1
    d.v1.delete_namespaced_pod("dra-whole", "default", grace_period_seconds=1)
    # NodeUnprepareResources once the pod is gone: the claim's CDI spec is removed.
    d.node.wait_for(lambda: not d.claim_specs(), 60, "the claim unprepared (its CDI spec gone)")


def test_a_claim_whose_preparation_fails_leaves_the_pod_pending_with_the_kubelets_event(
    dra_node: DraNode,
) -> None:
    d = dra_node
    bad = {
        "apiVersion": "gpu.kallot.io/v1alpha1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "Sometimes"},
    }
    body = claim(
        "bad",
        [exactly("gpu", dra.CLASS_GPU)],
        config=[{"opaque": {"driver": dra.DRIVER, "parameters": bad}}],
    )
    body["metadata"].pop("uid")
    d.co.create_namespaced_custom_object(GROUP, VERSION, "default", "resourceclaims", body)
    d.v1.create_namespaced_pod("default", d.pod("dra-bad", "bad"))

    def event() -> str | None:
        for e in d.v1.list_namespaced_event("default").items:
            if e.involved_object.name == "dra-bad" and "sharing.strategy" in (e.message or ""):
                return f"{e.reason}: {e.message}"
        return None

    message = d.node.wait_for(event, 90, "the kubelet's event for the failed prepare")
    assert "got Sometimes" in message and "Traceback" not in message, message
    pod = d.v1.read_namespaced_pod("dra-bad", "default")
    assert pod.spec.node_name == d.node.name
    assert pod.status.phase == "Pending"
    d.v1.delete_namespaced_pod("dra-bad", "default", grace_period_seconds=1)
