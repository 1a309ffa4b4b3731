"""Fixtures for the report tests: a control plane (etcd + kube-apiserver; the kallot scheduler
runs as a subprocess per test) and the Prometheus binary built by tools/testenv."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kallot.testing.controlplane import ControlPlane


@pytest.fixture(scope="package")
def report_cp() -> Iterator[ControlPlane]:
    with ControlPlane(scheduler=False) as plane:
        yield plane
