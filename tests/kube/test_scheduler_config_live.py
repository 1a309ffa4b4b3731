"""``kallot scheduler --config FILE`` against the real API server: the file's schedulerName,
plugins and tolerated taints are what the running scheduler uses (docs/scheduler-config.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kallot.config import scheduler as scheduler_config
from kallot.testing.live import Cluster, inventory_node_body, pod_body, wait_until

pytestmark = pytest.mark.controlplane

POOL_TAINT = "example.com/gpu-pool"


def test_the_scheduler_runs_what_its_configuration_file_says(
    cluster: Cluster, tmp_path: Path
) -> None:
    name = f"kallot-{cluster.run}"
    node = inventory_node_body(f"{cluster.run}-n0", 2)
    node.setdefault("spec", {})["taints"] = [
        {"key": POOL_TAINT, "value": "gpu", "effect": "NoSchedule"}
    ]
    cluster.add_nodes([node])
    path = tmp_path / "gpu-pool.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": scheduler_config.API_VERSION,
                "kind": scheduler_config.KIND,
                "profiles": [
                    {
                        "schedulerName": name,
                        "plugins": {"score": {"enabled": [{"name": "GpuPacking", "weight": 2}]}},
                    }
                ],
                # Without this the pod (no toleration) would pend: the taint is not tolerated
                # by default.
                "toleratedTaints": [POOL_TAINT],
            }
        )
    )
    s = cluster.scheduler(extra=["--config", str(path)])
    cluster.create_pods([pod_body("p", resources={"nvidia.com/gpu": "1"}, scheduler=name)])
    wait_until(
        lambda: s.check_alive() and cluster.pod("p")["spec"].get("nodeName"),
        timeout=60,
        what="the pod bound by the scheduler named in the file",
    )
    assert cluster.pod("p")["spec"]["nodeName"] == f"{cluster.run}-n0"
    assert "policy=gpu-pool" in s.log_path.read_text()
