"""Fixtures for the node agent's tests that need a real API server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from kallot.node.k8s import NodeClient
from kallot.testing.controlplane import ControlPlane
from kallot.testing.live import Cluster


@pytest.fixture(scope="package")
def node_cp() -> Iterator[ControlPlane]:
    """One etcd + kube-apiserver for tests/node (no scheduler: nothing binds pods here)."""
    with ControlPlane(scheduler=False) as plane:
        yield plane


@pytest.fixture
async def client(node_cp: ControlPlane) -> AsyncIterator[NodeClient]:
    c = await NodeClient.connect(node_cp.kubeconfig_path)
    yield c
    await c.close()


@pytest.fixture
def cluster(node_cp: ControlPlane, tmp_path: Path) -> Iterator[Cluster]:
    """A namespace of this test on ``node_cp`` (scheduler processes, pods, nodes), cleaned up."""
    with node_cp.api_client() as api:
        c = Cluster(node_cp, api, tmp_path)
        try:
            yield c
        finally:
            c.close()
