"""What operators and users see: ``kallot explain`` and ``kubectl kallot explain`` (the real
kubectl finding the plugin on the PATH), /metrics /healthz /readyz, graceful shutdown that
hands the Lease back, and structured logs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from kubernetes import client

from kallot.testing.controlplane import controlplane_bin_dir
from kallot.testing.live import Cluster, inventory_node_body, pod_body, wait_until

pytestmark = pytest.mark.controlplane


def _explain(
    cluster: Cluster, *args: str, kubectl: bool = False
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(cluster.cp.kubeconfig_path), "COLUMNS": "200"}
    if kubectl:
        # kubectl runs plugins named kubectl-<name> from the PATH: the venv's kubectl-kallot.
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
        cmd = [str(controlplane_bin_dir() / "kubectl"), "kallot", "explain", *args]
    else:
        cmd = [sys.executable, "-m", "kallot.cli.main", "explain", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, check=False)


def test_explain_pending_bound_and_invalid_pods(cluster: Cluster) -> None:
    cluster.add_nodes([inventory_node_body(f"{cluster.run}-n0", 2)])
    s = cluster.scheduler()
    cluster.create_pods(
        [
            pod_body(
                "fits", resources={"kallot.io/gpu-milli": "250", "kallot.io/gpu-memory": "20Gi"}
            ),
            pod_body("too-big", resources={"nvidia.com/gpu": "4"}),
            pod_body(
                "bad", resources={"nvidia.com/gpu": "1"}, annotations={"kallot.io/topology": "x:y"}
            ),
        ]
    )
    wait_until(lambda: s.check_alive() and cluster.settled(), timeout=30, what="decisions")
    wait_until(
        lambda: any(e["reason"] == "InvalidRequest" for e in cluster.events("bad")),
        timeout=15,
        what="the InvalidRequest event",
    )

    out = _explain(cluster, "too-big", "-n", cluster.ns)
    assert out.returncode == 0, out.stderr
    assert f"Pod {cluster.ns}/too-big: pending (Unschedulable" in out.stdout
    assert "Request: 4 whole GPUs" in out.stdout
    assert "Why: 0/1 nodes are available: 1 node: fewer than 4 GPUs on the node" in out.stdout

    out = _explain(cluster, f"{cluster.ns}/fits")
    assert out.returncode == 0, out.stderr
    assert f"bound to node {cluster.run}-n0" in out.stdout
    assert "250 milli-GPU, 20 GiB, mps" in out.stdout  # the device record, read back

    out = _explain(cluster, "bad", "-n", cluster.ns, kubectl=True)
    assert out.returncode == 0, out.stderr
    assert "the request is invalid" in out.stdout
    assert "metadata.annotations[kallot.io/topology]" in out.stdout

    out = _explain(cluster, "no-such-pod", "-n", cluster.ns, kubectl=True)
    assert out.returncode == 1
    assert f"pod {cluster.ns}/no-such-pod not found" in out.stderr


def test_health_metrics_and_graceful_shutdown(cluster: Cluster) -> None:
    cluster.add_nodes([inventory_node_body(f"{cluster.run}-n0", 8)])
    s = cluster.scheduler("g", leader_elect=True, extra=["--log-format=json"])
    s.wait_ready()
    assert s.get("/healthz")[0] == 200
    cluster.create_pods(
        [pod_body(f"m{i}", resources={"nvidia.com/gpu": "2"}) for i in range(5)]
    )  # 8 GPUs: 4 pods bound, 1 pending
    wait_until(lambda: s.check_alive() and cluster.settled(), timeout=30, what="decisions")

    def scraped() -> bool:
        # The latency histogram is observed when the bind's answer reaches the scheduler,
        # after the bind is visible in the API: wait for all four binds' samples too.
        return s.metric("kallot_pending_pods") == {'{reason="DeviceFit"}': 1.0} and s.metric(
            "kallot_pod_scheduling_duration_seconds_count"
        ) == {"": 4.0}

    wait_until(
        scraped, timeout=10, what="one pod pending for DeviceFit and 4 bind latencies in /metrics"
    )
    attempts = s.metric("kallot_scheduling_attempts_total")
    assert attempts['{result="scheduled"}'] == 4.0
    assert attempts['{result="unschedulable"}'] >= 1.0
    alloc = s.metric("kallot_gpu_allocated_milli")
    assert alloc == {f'{{model="H100-80GB",node="{cluster.run}-n0",queue=""}}': 8000.0}
    assert s.metric("kallot_leader") == {"": 1.0}

    s.popen.send_signal(signal.SIGTERM)
    assert s.popen.wait(20) == 0
    lease = client.CoordinationV1Api(cluster.api).read_namespaced_lease(cluster.lease, "default")
    assert lease.spec is not None
    assert not lease.spec.holder_identity  # handed back: a standby need not wait it out
    # Structured logs: one JSON object per line with a message and the level.
    lines = [json.loads(line) for line in s.log_path.read_text().splitlines() if line.strip()]
    assert {"ts", "level", "logger", "msg"} <= lines[0].keys()
    released = [r for r in lines if r["msg"] == "released"]
    assert released and released[0]["lease"] == f"default/{cluster.lease}"
    assert released[0]["identity"] == "g"
