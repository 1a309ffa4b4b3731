"""Provisioning: what new nodes the pending work needs (``plan``), of which shapes (``shapes``).

The top layer of the core, above ``scheduler``: the planner runs whole sessions as what-ifs.
Pure (no I/O); the kube shell (``kube.autoscale.provision``) and ``sim.autoscale`` act on its plans.
"""
