"""Fixtures for the control-plane tests (tests/controlplane).

The shared fixtures, ``control_plane`` (one etcd + kube-apiserver + kube-scheduler per
session) and ``make_control_plane`` (private clusters per test), live in
``kallot.testing.controlplane`` and are registered for the whole tree by tests/conftest.py.
The ones here are conveniences on top of them for tests that use the shared cluster.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client

from kallot.testing.controlplane import ControlPlane

RUN_LABEL = "kallot.test/run"


@pytest.fixture
def core_v1(control_plane: ControlPlane) -> Iterator[client.CoreV1Api]:
    """CoreV1Api on the shared cluster, as the admin user."""
    with control_plane.api_client() as api:
        yield client.CoreV1Api(api)


@pytest.fixture
def run_labels(core_v1: client.CoreV1Api) -> Iterator[dict[str, str]]:
    """Labels unique to this test (``kallot.test/run: <8 hex>``). Nodes carrying them are
    deleted afterwards, so the shared cluster does not accumulate them."""
    labels = {RUN_LABEL: uuid.uuid4().hex[:8]}
    yield labels
    core_v1.delete_collection_node(label_selector=f"{RUN_LABEL}={labels[RUN_LABEL]}")
