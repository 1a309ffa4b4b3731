"""``autoscale`` in the scheduler configuration (config.autoscale): node shapes, Karpenter
NodePools mapped to shapes, consolidation's limits; bad values are one line naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from kallot.config import scheduler as sc
from kallot.config.autoscale import NODEPOOL_LABEL, node_shapes_from_nodepool
from kallot.core.errors import ConfigError
from kallot.core.resources import SharingMode


def doc(**autoscale: Any) -> dict[str, Any]:
    return {"apiVersion": sc.API_VERSION, "kind": sc.KIND, "autoscale": autoscale}


def test_defaults_plan_nothing_and_never_consolidate() -> None:
    config = sc.parse({"apiVersion": sc.API_VERSION, "kind": sc.KIND})
    assert config.autoscale.provisioner == "none"
    assert config.autoscale.shapes() == ()
    assert not config.autoscale.consolidation.config().enabled
    assert config.autoscale.placeholder_namespace == "kube-system"
    assert config.autoscale.scale_up_timeout_seconds == 600


def test_node_shapes_become_core_shapes() -> None:
    shape = {
        "name": "h100",
        "cpu": 96,
        "memoryGiB": 1024,
        "gpuModel": "H100-80GB",
        "gpus": 8,
        "gpuMode": "mig",
        "nodePool": "gpu",
        "costPerHour": 98.3,
    }
    config = sc.parse(doc(provisioner="karpenter", nodeShapes=[shape]))
    (s,) = config.autoscale.shapes()
    assert (s.cpu_milli, s.mem_mib, s.gpus, s.gpu_mode) == (96_000, 1 << 20, 8, SharingMode.MIG)
    assert s.mig_dynamic and s.labels[NODEPOOL_LABEL] == "gpu" and s.price == 98.3


@pytest.mark.parametrize(
    "autoscale, line",
    [
        (
            {
                "nodeShapes": [
                    {"name": "a", "cpu": 8, "memoryGiB": 64, "gpuModel": "H9000", "gpus": 1}
                ]
            },
            "f.yaml: autoscale.nodeShapes.0.gpuModel: got 'H9000', expected a GPU model, one of ",
        ),
        (
            {"consolidation": {"evictionsPerMinute": -1}},
            "f.yaml: autoscale.consolidation.evictionsPerMinute: got -1, expected a number >= 0",
        ),
        (
            {"provisioner": "cas"},
            "f.yaml: autoscale.provisioner: got 'cas', expected ",
        ),
        (
            {"scaleUpTimeoutSeconds": 0},
            "f.yaml: autoscale.scaleUpTimeoutSeconds: got 0, expected a number > 0",
        ),
    ],
)
def test_bad_values_name_the_field(autoscale: dict[str, Any], line: str) -> None:
    with pytest.raises(ConfigError) as err:
        sc.parse(doc(**autoscale), where="f.yaml")
    assert str(err.value).startswith(line), str(err.value)
    assert "\n" not in str(err.value)


NODEPOOL = {
    "apiVersion": "karpenter.sh/v1",
    "kind": "NodePool",
    "metadata": {"name": "gpu"},
    "spec": {
        "template": {
            "metadata": {"labels": {"kallot.io/rack": "r1"}},
            "spec": {
                "requirements": [
                    {
                        "key": "node.kubernetes.io/instance-type",
                        "operator": "In",
                        "values": ["p5.48xlarge"],
                    }
                ],
                "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}],
            },
        }
    },
}
CATALOGUE = {"p5.48xlarge": {"cpu": 192, "memoryGiB": 2048, "gpuModel": "H100-80GB", "gpus": 8}}


def test_a_nodepool_maps_to_shapes() -> None:
    (s,) = node_shapes_from_nodepool(NODEPOOL, CATALOGUE)
    assert s.name == "gpu-p5.48xlarge" and s.gpus == 8
    assert s.labels["kallot.io/rack"] == "r1" and s.labels[NODEPOOL_LABEL] == "gpu"
    assert [t.key for t in s.taints] == ["nvidia.com/gpu"]
    with pytest.raises(ConfigError, match=r"instance type: got 'p5\.48xlarge'"):
        node_shapes_from_nodepool(NODEPOOL, {})
