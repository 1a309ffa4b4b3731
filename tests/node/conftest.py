"""Fixtures for the node agent's tests that need a real API server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from kallot.node.k8s import NodeClient
from kallot.testing.controlplane import ControlPlane


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
