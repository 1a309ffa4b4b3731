"""The live scheduler's door to the API server: ``client`` (``KubeClient``: lists, watches,
binds, evictions, status, Events, on ``k8sclient``) and ``k8s_fields`` (the Kubernetes object
fields the shell reads, in one place). Lowest in the kube wing: every package above talks to
Kubernetes through it, and it imports none of them."""
