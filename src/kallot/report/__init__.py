"""Reports on a running fleet from its Prometheus: the waste report (allocated vs used GPU-hours
and their cost) and the series ``kallot rightsize`` recommends from. A shell beside sim, kube and
node: it reads the agents' per-pod series over Prometheus's HTTP API and hands numbers to the
core (``core.rightsize``)."""
