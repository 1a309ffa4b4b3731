"""Test support for kallot's own tests; never imported by the scheduler, simulator or agent.

``kallot.testing.controlplane``: a real etcd + kube-apiserver + kube-scheduler for tests.
"""
