"""Fixtures for the live scheduler's tests (tests/kube).

``kube_cp`` is one etcd + kube-apiserver for the whole directory (no kube-scheduler: nothing
else binds pods here). Each test gets a ``Cluster`` (kallot.testing.live): its own namespace,
node names and Lease, the scheduler subprocesses it starts, and a teardown that kills those
schedulers and removes the test's pods and nodes, so the next test starts from an empty cluster.
``fleet`` is the Karpenter fleet (kallot.testing.karpenter_fleet) of the autoscaling tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kallot.testing import karpenter_fleet
from kallot.testing.controlplane import DEFAULT_FEATURE_GATES, ControlPlane
from kallot.testing.karpenter import Karpenter
from kallot.testing.live import Cluster


@pytest.fixture(scope="package")
def kube_cp() -> Iterator[ControlPlane]:
    # GenericWorkload + scheduling.k8s.io/v1alpha2: the upstream Workload API (PodGroups and
    # pods' spec.schedulingGroup), alpha in 1.36, which kube.owners derives gangs from.
    with ControlPlane(
        scheduler=False,
        feature_gates={**DEFAULT_FEATURE_GATES, "GenericWorkload": True},
        apiserver_args=["--runtime-config=scheduling.k8s.io/v1alpha2=true"],
    ) as cp:
        yield cp


@pytest.fixture
def cluster(kube_cp: ControlPlane, tmp_path: Path) -> Iterator[Cluster]:
    with kube_cp.api_client() as api:
        c = Cluster(kube_cp, api, tmp_path)
        try:
            yield c
        finally:
            c.close()


@pytest.fixture(scope="package")
def fleet() -> Iterator[Karpenter]:
    """Karpenter's KWOK provider on a control plane of its own, with kube-scheduler (its
    placeholders are kube-scheduler's pods), shared by the autoscaling tests: each starts with
    ``karpenter_fleet.fresh``."""
    with karpenter_fleet.karpenter_fleet() as k:
        yield k
