"""kallot's own image (``make image``, here with buildah on the local base of
``make image-base``) runs on the real node: imported into containerd from an OCI archive, with
nothing mounted it runs as uid 65532, ``kallot --version`` answers and ``kallot sim openb``
writes its report (HOME, MPLCONFIGDIR and the working directory are /tmp in the image).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kallot.k8sclient import sync as client
from kallot.testing.controlplane import ControlPlane
from kallot.testing.node import Node

pytestmark = [pytest.mark.node, pytest.mark.controlplane]


def test_kallots_image_runs_on_the_node_as_65532_with_nothing_mounted(
    node_plane: ControlPlane, real_node: Node, kallot_image: tuple[str, Path]
) -> None:
    ref, archive = kallot_image
    real_node.ctr("images", "import", "--local", str(archive))
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "kallot-image"},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "main",
                    "image": ref,
                    "imagePullPolicy": "Never",
                    "command": [
                        "sh",
                        "-c",
                        "id -u; pwd; kallot --version; kallot sim openb >/dev/null && ls kallot-report",
                    ],
                }
            ],
        },
    }
    with node_plane.api_client() as api:
        v1: Any = client.CoreV1Api(api)
        v1.create_namespaced_pod("default", body)
        try:
            pod = real_node.wait_for(
                lambda: (
                    (p := v1.read_namespaced_pod("kallot-image", "default")).status.phase
                    in ("Succeeded", "Failed")
                    and p
                ),
                180,
                "the kallot image's pod finished",
            )
            log = real_node.pod_log("default", "kallot-image", "main")
            assert pod.status.phase == "Succeeded", log
            lines = log.splitlines()
            assert lines[:3] == ["65532", "/tmp", "kallot 0.1.0"], log
            assert "openb.html" in lines[3:], log
        finally:
            v1.delete_namespaced_pod("kallot-image", "default", grace_period_seconds=1)
