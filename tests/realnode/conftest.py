"""Fixtures of the node tier (``pytest -m node``): a private control plane and one real node
(containerd + kubelet, ``kallot.testing.node``) for the package.

Private, not the session's ``control_plane``: pods other tests create expect to stay pending or
to be bound to Node objects without a kubelet; a real kubelet would run them.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

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


ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="package")
def kallot_image(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """kallot's image (``make image-node``) as an OCI archive a node's containerd imports:
    its reference and the archive (layers uncompressed: pushing is then a copy, not a gzip of
    600 MB on a shared core)."""
    ref = subprocess.run(
        ["make", "-s", "--no-print-directory", "-C", str(ROOT), "print-image"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    buildah = shutil.which("buildah")
    assert buildah, "buildah is missing: run `make image-node` (it installs it)"
    archive = tmp_path_factory.mktemp("image") / "kallot.tar"
    pushed = subprocess.run(
        [buildah, "push", "--quiet", "--disable-compression", ref, f"oci-archive:{archive}:{ref}"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert pushed.returncode == 0, (
        f"{ref} is not in buildah's storage ({pushed.stderr.strip()}): run `make image-node`"
    )
    return ref, archive
