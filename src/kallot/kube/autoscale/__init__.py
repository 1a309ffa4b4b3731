"""Autoscaling in the live scheduler: the scale-up loop (``scaleup``) and the capacity it asks
for (``provision``: Karpenter placeholder pods, ProvisioningRequests), consolidation
(``consolidate``), the do-not-disrupt guard (``disruption``), and their wiring next to a
Controller (``wiring``). Top of the kube wing: it runs beside the composition root
(``kube.app``), which never imports it (docs/autoscaling.md)."""
