"""The test node itself (kallot.testing.node): containerd and the kubelet from
tools/testenv/build-node.sh register a Ready Node with the test control plane, and a pod from the
hand-written busybox image runs and its output is read back from the kubelet's pod logs.
"""

from __future__ import annotations

from typing import Any

import pytest

from kallot.k8sclient import sync as client
from kallot.testing.controlplane import ControlPlane
from kallot.testing.node import BUSYBOX_IMAGE, Node

pytestmark = [pytest.mark.node, pytest.mark.controlplane]


def busybox_pod(name: str, script: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "main",
                    "image": BUSYBOX_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", script],
                }
            ],
            **spec,
        },
    }


def test_node_is_ready_with_the_kubelet_version(node_plane: ControlPlane, real_node: Node) -> None:
    with node_plane.api_client() as c:
        _node_is_ready(client.CoreV1Api(c), real_node)


def _node_is_ready(api: Any, real_node: Node) -> None:
    node = api.read_node(real_node.name)
    assert node.status.node_info.kubelet_version == "v1.36.3"
    assert node.status.node_info.container_runtime_version.startswith("containerd://2.")
    ready = {c.type: c.status for c in node.status.conditions}
    assert ready["Ready"] == "True"


def test_a_pod_runs_and_its_output_is_read_back(node_plane: ControlPlane, real_node: Node) -> None:
    with node_plane.api_client() as c:
        _pod_runs(client.CoreV1Api(c), real_node)


def _pod_runs(api: Any, real_node: Node) -> None:
    api.create_namespaced_pod(
        "default", busybox_pod("hello", "echo hello from $(hostname); echo to stderr >&2; exit 3")
    )
    try:
        pod = real_node.wait_for(
            lambda: (
                (p := api.read_namespaced_pod("hello", "default")).status.phase
                in ("Succeeded", "Failed")
                and p
            ),
            90,
            "pod hello finished",
        )
        assert pod.spec.node_name == real_node.name
        assert pod.status.phase == "Failed"
        assert pod.status.container_statuses[0].state.terminated.exit_code == 3
        assert real_node.pod_log("default", "hello", "main", "stdout") == "hello from hello\n"
        assert real_node.pod_log("default", "hello", "main", "stderr") == "to stderr\n"
    finally:
        api.delete_namespaced_pod("hello", "default", grace_period_seconds=0)
