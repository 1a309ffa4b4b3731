"""The official client's quantity parser (``kubernetes.utils.parse_quantity``), for the node
agent, which reads a pod's ``kallot.io/gpu-milli`` leniently (a malformed value counts as 0).

The scheduler validates quantities with its own parser (``kube.translate.quantity``), which
names the field and rejects what the API server rejects.
"""

from __future__ import annotations

from kubernetes.utils.quantity import parse_quantity

__all__ = ["parse_quantity"]
