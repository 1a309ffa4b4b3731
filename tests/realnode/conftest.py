"""Fixtures of the node tier (``pytest -m node``): a private control plane and one real node
(containerd + kubelet, ``kallot.testing.node``) for the package.

Private, not the session's ``control_plane``: pods other tests create expect to stay pending or
to be bound to Node objects without a kubelet; a real kubelet would run them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kallot.testing.controlplane import ControlPlane
from kallot.testing.node import Node


@pytest.fixture(scope="package")
def node_plane() -> Iterator[ControlPlane]:
    with ControlPlane(scheduler=True) as plane:
        yield plane


@pytest.fixture(scope="package")
def real_node(node_plane: ControlPlane) -> Iterator[Node]:
    with Node(node_plane) as node:
        yield node
