"""The test control plane itself: real etcd + kube-apiserver + kube-scheduler v1.36.3.

These need the binaries from ``make controlplane``; without them they fail (never skip)
with a message saying to build them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch

from kallot.testing.controlplane import (
    ControlPlane,
    ControlPlaneError,
    create_nodes,
    gpu_node_body,
)

pytestmark = pytest.mark.controlplane

K8S_VERSION = "v1.36.3"


def _run_id(labels: dict[str, str]) -> str:
    return "-".join(labels.values())


def _selector(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in labels.items())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_apiserver_reports_pinned_version(control_plane: ControlPlane) -> None:
    with control_plane.api_client() as api:
        info = client.VersionApi(api).get_code()
    assert info.git_version == K8S_VERSION
    assert (info.major, info.minor) == ("1", "36")


def test_rbac_denies_anonymous(control_plane: ControlPlane) -> None:
    # With --authorization-mode=AlwaysAllow this request would succeed; RBAC must refuse it.
    ctx = ssl.create_default_context(cafile=str(control_plane.ca_path))
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{control_plane.server_url}/api/v1/nodes", context=ctx, timeout=10)
    assert err.value.code == 403


def test_feature_gates_reach_the_apiserver(control_plane: ControlPlane) -> None:
    # DRA's resource.k8s.io/v1 is served, and the gates were accepted on the command line
    # (the apiserver exits on an unknown gate, so being up is most of the proof).
    with control_plane.api_client() as api:
        groups = client.ApisApi(api).get_api_versions()
    served = {(g.name, v.version) for g in groups.groups for v in g.versions}
    assert ("resource.k8s.io", "v1") in served
    cmdline = Path(f"/proc/{control_plane.pids['kube-apiserver']}/cmdline").read_text()
    gates = next(a for a in cmdline.split("\0") if a.startswith("--feature-gates="))
    enabled = set(gates.removeprefix("--feature-gates=").split(","))
    assert {
        "DRAConsumableCapacity=true",
        "DRAPartitionableDevices=true",
        "DRADeviceTaints=true",
    } <= enabled


async def test_create_1000_gpu_nodes_and_list_them(
    control_plane: ControlPlane, core_v1: client.CoreV1Api, run_labels: dict[str, str]
) -> None:
    run_id = _run_id(run_labels)
    bodies = [
        gpu_node_body(f"gpu-{run_id}-{i:04d}", gpus=8, labels=run_labels) for i in range(1000)
    ]
    t0 = time.monotonic()
    names = await create_nodes(control_plane.kubeconfig_path, bodies, concurrency=64)
    elapsed = time.monotonic() - t0
    print(f"created 1000 nodes in {elapsed:.1f}s ({1000 / elapsed:.0f}/s)")
    assert names == [b["metadata"]["name"] for b in bodies]

    nodes = core_v1.list_node(label_selector=_selector(run_labels)).items
    listed = []
    for n in nodes:
        assert n.metadata is not None and n.metadata.name is not None
        listed.append(n.metadata.name)
    assert sorted(listed) == sorted(names)
    for node in nodes:
        assert node.status is not None and node.spec is not None
        assert node.status.allocatable is not None and node.status.capacity is not None
        assert node.status.allocatable["nvidia.com/gpu"] == "8"
        assert node.status.capacity["nvidia.com/gpu"] == "8"
        # No controller-manager would ever lift a not-ready taint; the scheduler must see
        # the nodes as they were written.
        assert not node.spec.taints
        assert node.status.conditions is not None
        ready = [c for c in node.status.conditions if c.type == "Ready"]
        assert [c.status for c in ready] == ["True"]


def test_scheduler_binds_gpu_pod_to_the_gpu_node(
    core_v1: client.CoreV1Api, run_labels: dict[str, str]
) -> None:
    # Two nodes without GPUs and one with: only the scheduler's resource fit can pick the
    # right one. The nodeSelector keeps the pod off nodes other tests may have created.
    run_id = _run_id(run_labels)
    labels = run_labels
    bodies = [
        gpu_node_body(f"cpu-{run_id}-a", gpus=0, labels=labels),
        gpu_node_body(f"gpu-{run_id}", gpus=8, labels=labels),
        gpu_node_body(f"cpu-{run_id}-b", gpus=0, labels=labels),
    ]
    for body in bodies:
        core_v1.create_node(client.V1Node.model_validate(body))
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"gpu-pod-{run_id}"},
        "spec": {
            "nodeSelector": labels,
            "containers": [
                {
                    "name": "main",
                    # Never pulled: there is no kubelet.
                    "image": "registry.invalid/kallot/none:0",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }
    created = core_v1.create_namespaced_pod("default", client.V1Pod.model_validate(pod))
    assert created.metadata is not None and created.metadata.name is not None
    try:
        node_name = None
        w = watch.Watch()  # type: ignore[no-untyped-call]  # kubernetes.watch is untyped
        # Starting at the creation's resourceVersion, no later change can be missed.
        for event in w.stream(  # type: ignore[no-untyped-call]  # kubernetes.watch is untyped
            core_v1.list_namespaced_pod,
            "default",
            field_selector=f"metadata.name={created.metadata.name}",
            resource_version=created.metadata.resource_version,
            timeout_seconds=60,
        ):
            node_name = event["object"].spec.node_name
            if node_name:
                w.stop()  # type: ignore[no-untyped-call]  # kubernetes.watch is untyped
        assert node_name == f"gpu-{run_id}", "pod was not bound to the GPU node within 60s"
    finally:
        core_v1.delete_namespaced_pod(created.metadata.name, "default", grace_period_seconds=0)


def test_stop_leaves_no_processes_and_no_files() -> None:
    cp = ControlPlane(scheduler=True)
    with cp:
        pids = dict(cp.pids)
        workdir = cp.dir
        port = int(cp.server_url.rsplit(":", 1)[1])
        assert set(pids) == {"etcd", "kube-apiserver", "kube-scheduler"}
        assert all(_alive(pid) for pid in pids.values())
        print(f"control plane (with scheduler) ready in {cp.start_seconds:.2f}s")
    assert [name for name, pid in pids.items() if _alive(pid)] == []
    assert not workdir.exists()
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port)):
        pass


def test_killed_test_process_takes_the_cluster_with_it(tmp_path: Path) -> None:
    # A test run killed with SIGKILL (CI timeout) gets no chance to stop the cluster;
    # PR_SET_PDEATHSIG must end etcd and kube-apiserver anyway.
    script = (
        "import json, sys, time\n"
        "from kallot.testing.controlplane import ControlPlane\n"
        "cp = ControlPlane(scheduler=False, keep_dir=True).start()\n"
        "print(json.dumps({'pids': list(cp.pids.values()), 'dir': str(cp.dir)}), flush=True)\n"
        "sys.stdin.read()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    info = json.loads(child.stdout.readline())
    try:
        assert all(_alive(pid) for pid in info["pids"])
        child.kill()
        child.wait()
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in info["pids"]) and time.monotonic() < deadline:
            time.sleep(0.05)  # poll interval, bounded by the deadline
        assert [pid for pid in info["pids"] if _alive(pid)] == []
    finally:
        for pid in info["pids"]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(info["dir"], ignore_errors=True)


def test_scheduler_started_after_the_control_plane_and_stopped_alone(
    make_control_plane: Any,
) -> None:
    # A benchmark creates its pods first, then starts kube-scheduler (bench/live.py --drain).
    cp = make_control_plane(scheduler=False)
    assert "kube-scheduler" not in cp.pids
    assert cp.scheduler_kubeconfig_path.is_file()
    cp.start_scheduler()
    pid = cp.pids["kube-scheduler"]
    os.kill(pid, 0)  # running
    with pytest.raises(ControlPlaneError, match="already running"):
        cp.start_scheduler()
    cp.stop_scheduler()
    assert "kube-scheduler" not in cp.pids
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with cp.api_client() as api:  # the rest keeps running
        assert client.VersionApi(api).get_code().git_version
