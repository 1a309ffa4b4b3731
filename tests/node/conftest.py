"""Fixtures for the node agent's tests: the three fake nodes under tests/node/data."""

from __future__ import annotations

from pathlib import Path

import pytest

from kallot.config.inventory import NodeInventory
from kallot.node.discovery import build_inventory
from kallot.node.fake import FakeBackend

DATA = Path(__file__).parent / "data"
HGX = DATA / "hgx-h100-8.yaml"
MIG = DATA / "mig-a100-mixed.yaml"
PCIE = DATA / "pcie-l40s-8.yaml"


def inventory_of(path: Path) -> NodeInventory:
    backend = FakeBackend.from_file(path)
    return build_inventory(backend.raw(), backend.sharing())


@pytest.fixture
def hgx() -> NodeInventory:
    return inventory_of(HGX)


@pytest.fixture
def mig_node() -> NodeInventory:
    return inventory_of(MIG)


@pytest.fixture
def pcie() -> NodeInventory:
    return inventory_of(PCIE)
