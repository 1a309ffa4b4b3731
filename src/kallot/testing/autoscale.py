"""What the live autoscaling tests and bench/autoscale_live.py share: the scheduler
configuration file they start ``kallot scheduler`` with (its ``autoscale`` section,
docs/autoscaling.md) and the body of a ReplicaSet of kallot GPU pods.

Where it sits: test support next to ``kallot.testing.live`` (clusters, pods, schedulers) and
``kallot.testing.karpenter_fleet`` (the Karpenter fleet).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from kallot.testing.live import pod_body


def consolidation(gain: int = 1) -> dict[str, Any]:
    """Consolidation on, as the live tests run it: a round a second, 10 evictions a minute,
    ``gain`` GPUs a move must free (``gainThreshold``)."""
    return {"enabled": True, "evictionsPerMinute": 10, "gainThreshold": gain, "intervalSeconds": 1}


def config_file(
    path: Path,
    *,
    provisioner: str = "",
    namespace: str = "",
    shapes: Sequence[Mapping[str, Any]] = (),
    consolidate: Mapping[str, Any] | None = None,
) -> Path:
    """Write a ``KallotSchedulerConfiguration`` whose ``autoscale`` has what is given
    (``provisioner``, ``placeholderNamespace``, ``nodeShapes``, ``consolidation``) to ``path``;
    the path, for ``--config``."""
    autoscale: dict[str, Any] = {}
    if provisioner:
        autoscale["provisioner"] = provisioner
    if namespace:
        autoscale["placeholderNamespace"] = namespace
    if shapes:
        autoscale["nodeShapes"] = [dict(s) for s in shapes]
    if consolidate is not None:
        autoscale["consolidation"] = dict(consolidate)
    doc = {
        "apiVersion": "kallot.io/v1alpha1",
        "kind": "KallotSchedulerConfiguration",
        "autoscale": autoscale,
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def replica_set(
    name: str,
    resources: Mapping[str, str],
    *,
    replicas: int = 1,
    node_selector: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A ReplicaSet of ``replicas`` kallot pods asking ``resources``, labelled ``app=name``."""
    template = pod_body("x", resources=resources, labels={"app": name})
    del template["metadata"]["name"]
    if node_selector:
        template["spec"]["nodeSelector"] = dict(node_selector)
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": template["metadata"], "spec": template["spec"]},
        },
    }
