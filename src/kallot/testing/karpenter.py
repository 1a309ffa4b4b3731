"""Karpenter's KWOK provider against a test ``ControlPlane``: real Karpenter (provisioning,
NodeClaims, disruption and consolidation) whose "cloud" creates Node objects.

The binary comes from ``tools/testenv/build-karpenter.sh`` (its own cache key;
``KALLOT_TESTENV_KARPENTER_BIN`` overrides the directory); the CRDs are the files the same
module ships (``kwok/charts/crds``, ``kwok/apis/crds``). KWOK's own stage controller is not run:
nothing plays the kubelet, so a test reports a node Ready itself (``mark_ready``) once Karpenter
has created it. Instance types come from ``instance_types`` (the provider's JSON format).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Self

from kallot.testing.controlplane import (
    BinariesMissingError,
    ControlPlane,
    _free_port,
    _set_pdeathsig,
    _tail,
    controlplane_bin_dir,
)

_REPO_ROOT = Path(__file__).resolve().parents[3]
BUILD_SCRIPT = _REPO_ROOT / "tools" / "testenv" / "build-karpenter.sh"
BINARY = "kwok-controller"
CRDS = (
    "kwok/charts/crds/karpenter.sh_nodepools.yaml",
    "kwok/charts/crds/karpenter.sh_nodeclaims.yaml",
    "kwok/charts/crds/karpenter.sh_nodeoverlays.yaml",
    "kwok/charts/crds/autoscaling.x-k8s.io_capacitybuffers.yaml",
    "kwok/apis/crds/karpenter.kwok.sh_kwoknodeclasses.yaml",
)


def _script(flag: str) -> Path:
    out = subprocess.run(
        ["bash", str(BUILD_SCRIPT), flag], check=True, capture_output=True, text=True
    )
    return Path(out.stdout.strip())


def karpenter_binary() -> Path:
    override = os.environ.get("KALLOT_TESTENV_KARPENTER_BIN")
    path = (Path(override) if override else _script("--print-bin-dir")) / BINARY
    if not path.is_file():
        raise BinariesMissingError(
            f"{path} not found; run `make controlplane` (tools/testenv/build-karpenter.sh)"
        )
    return path


def crd_files() -> list[Path]:
    """Karpenter's CRDs, as its module ships them (the module cache, `go mod download`)."""
    return [_script("--print-module-dir") / f for f in CRDS]


class Karpenter:
    """``with Karpenter(cp, instance_types) as k:`` runs the KWOK provider against ``cp``
    (CRDs installed first) and stops it on exit."""

    def __init__(
        self,
        cp: ControlPlane,
        instance_types: Sequence[Mapping[str, Any]],
        *,
        ns: str = "karpenter",
    ) -> None:
        self.cp = cp
        self.instance_types = list(instance_types)
        self.ns = ns
        self.dir = cp.dir / "karpenter"
        self.log_path = self.dir / "karpenter.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        kubectl = controlplane_bin_dir() / "kubectl"
        r = subprocess.run(
            [str(kubectl), "--kubeconfig", str(self.cp.kubeconfig_path), *args],
            input=stdin,
            capture_output=True,
            text=True,
            check=False,
        )
        if r.returncode:
            raise RuntimeError(f"kubectl {' '.join(args)}: {r.stderr.strip()}")
        return r.stdout

    def apply(self, obj: Mapping[str, Any]) -> None:
        self.kubectl("apply", "--server-side", "-f", "-", stdin=json.dumps(obj))

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def __enter__(self) -> Self:
        binary = karpenter_binary()
        self.dir.mkdir(parents=True, exist_ok=True)
        for f in crd_files():
            self.kubectl("apply", "--server-side", "-f", str(f))
        self.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        self.kubectl("create", "namespace", self.ns)
        types = self.dir / "instance_types.json"
        types.write_text(json.dumps(self.instance_types))
        env = {
            **os.environ,
            "KUBECONFIG": str(self.cp.kubeconfig_path),
            "SYSTEM_NAMESPACE": self.ns,
            "DISABLE_WEBHOOK": "true",
            "DISABLE_LEADER_ELECTION": "true",
            "LEADER_ELECTION_NAMESPACE": self.ns,
            "INSTANCE_TYPES_FILE_PATH": str(types),
            "METRICS_PORT": str(_free_port()),
            "HEALTH_PROBE_PORT": str(_free_port()),
            "CLUSTER_NAME": "kallot-test",
        }
        log = self.log_path.open("wb")
        self._proc = subprocess.Popen(
            [str(binary)], env=env, stdout=log, stderr=subprocess.STDOUT,
            preexec_fn=_set_pdeathsig,  # noqa: PLW1509 - no threads start between fork and exec
        )  # fmt: skip
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()

    def logs(self) -> str:
        return _tail(self.log_path)

    def mark_ready(self, node: str) -> None:
        """Report ``node`` Ready, as its kubelet would (there is none)."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        cond = {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "reported by the test (no kubelet)",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        self.kubectl(
            "patch", "node", node, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": {"conditions": [cond]}}),
        )  # fmt: skip
