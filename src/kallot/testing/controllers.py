"""kube-controller-manager against a test ``ControlPlane``: the Job controller creates a Job's
pods for real (owner references, labels, completion indexes), as in a cluster.

The binary comes from ``tools/testenv/build-kcm.sh`` (its own module and cache key, separate
from the main control-plane binaries); ``KALLOT_TESTENV_KCM_BIN`` overrides the directory.
Only the controllers a test names run (default: ``job``); no garbage collector, so a test
deletes its Jobs before their pods.
"""

from __future__ import annotations

import contextlib
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

import yaml

from kallot.testing.controlplane import (
    BinariesMissingError,
    ControlPlane,
    ControlPlaneError,
    _free_port,
    _set_pdeathsig,
    _tail,
)

_REPO_ROOT = Path(__file__).resolve().parents[3]
BUILD_SCRIPT = _REPO_ROOT / "tools" / "testenv" / "build-kcm.sh"
BINARY = "kube-controller-manager"


def kcm_binary() -> Path:
    """The kube-controller-manager binary; BinariesMissingError names how to build it."""
    override = os.environ.get("KALLOT_TESTENV_KCM_BIN")
    if override:
        bin_dir = Path(override)
    else:
        out = subprocess.run(
            ["bash", str(BUILD_SCRIPT), "--print-bin-dir"],
            check=True,
            capture_output=True,
            text=True,
        )
        bin_dir = Path(out.stdout.strip())
    path = bin_dir / BINARY
    if not os.access(path, os.X_OK):
        raise BinariesMissingError(
            f"{path} is missing: build it with `bash tools/testenv/build-kcm.sh` (cached "
            "afterwards), or point KALLOT_TESTENV_KCM_BIN at a directory that has it."
        )
    return path


class ControllerManager:
    """kube-controller-manager running ``controllers`` against ``cp`` (as its admin)."""

    def __init__(
        self,
        cp: ControlPlane,
        *,
        controllers: Sequence[str] = ("job",),
        start_timeout: float = 90.0,
        stop_timeout: float = 10.0,
    ) -> None:
        self.cp = cp
        self.controllers = tuple(controllers)
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.binary = kcm_binary()
        self.port = _free_port()
        self.log_path = cp.dir / "kube-controller-manager.log"
        self._popen: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        kubeconfig = str(self.cp.kubeconfig_path)
        with self.log_path.open("ab") as log:
            self._popen = subprocess.Popen(
                [
                    str(self.binary),
                    f"--kubeconfig={kubeconfig}",
                    f"--authentication-kubeconfig={kubeconfig}",
                    f"--authorization-kubeconfig={kubeconfig}",
                    f"--controllers={','.join(self.controllers)}",
                    "--leader-elect=false",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={self.port}",
                    f"--cert-dir={self.cp.dir / 'kcm-certs'}",
                    *self.cp._feature_gate_args(),  # the plane's gates (DRA ones too)
                    # What the root-ca-certificate-publisher-controller publishes in every
                    # namespace (kube-root-ca.crt, the ca.crt of projected tokens).
                    f"--root-ca-file={self.cp.ca_path}",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_set_pdeathsig,  # noqa: PLW1509 - no threads between fork and exec
            )
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # loopback, self-signed: readiness, not trust
        deadline = time.monotonic() + self.start_timeout
        url = f"https://127.0.0.1:{self.port}/healthz"
        last = "no answer yet"
        assert self._popen is not None
        while True:
            if self._popen.poll() is not None:
                raise ControlPlaneError(
                    f"{BINARY} exited with status {self._popen.returncode}\n" + _tail(self.log_path)
                )
            try:
                with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:
                    if resp.status == 200:
                        return
                    last = f"HTTP {resp.status}"
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}"
            except (OSError, ValueError) as exc:
                last = repr(exc)
            if time.monotonic() >= deadline:
                self.stop()
                raise ControlPlaneError(f"{BINARY} not healthy at {url} ({last})")
            time.sleep(0.1)  # bounded readiness poll, not a synchronization sleep

    def stop(self) -> None:
        p, self._popen = self._popen, None
        if p is None or p.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=self.stop_timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    def logs(self) -> str:
        return _tail(self.log_path)


# Owners' CRDs from their projects' published Go modules, at the versions pinned in
# tools/testenv/crds/crds.txt (no hand-written copies), fetched by tools/testenv/fetch-crds.sh
# (`make controlplane`) into their own cache key.
FETCH_CRDS = _REPO_ROOT / "tools" / "testenv" / "fetch-crds.sh"
CRD_PINS = _REPO_ROOT / "tools" / "testenv" / "crds" / "crds.txt"


def owner_crd_pins() -> dict[str, tuple[str, str, str]]:
    """name -> (module, version, path of the CRD in the module), from crds.txt."""
    out: dict[str, tuple[str, str, str]] = {}
    for line in CRD_PINS.read_text().splitlines():
        fields = line.split()
        if len(fields) == 5 and not line.startswith("#"):
            out[fields[0]] = (fields[1], fields[2], fields[4])
    return out


def owner_crd(name: str) -> dict[str, Any]:
    """The CRD of an owner (a name of crds.txt: ``jobset``, ``workload``, ...), as its Go module
    ships it. BinariesMissingError names how to fetch them when they are not in the cache."""
    if name not in owner_crd_pins():
        raise KeyError(f"{name!r} is not in {CRD_PINS}")
    override = os.environ.get("KALLOT_TESTENV_CRDS")
    if override:
        crd_dir = Path(override)
    else:
        out = subprocess.run(
            ["bash", str(FETCH_CRDS), "--print-dir"], check=True, capture_output=True, text=True
        )
        crd_dir = Path(out.stdout.strip())
    path = crd_dir / f"{name}.yaml"
    if not path.is_file():
        raise BinariesMissingError(
            f"{path} is missing: fetch the owners' CRDs with `make controlplane` (or `bash "
            "tools/testenv/fetch-crds.sh`; cached afterwards), or point KALLOT_TESTENV_CRDS at "
            "a directory that has them."
        )
    # libyaml where present: the pure-Python loader takes ~30 s for these ~6 MB of schemas.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crd: dict[str, Any] = yaml.load(path.read_text(), Loader=loader)
    return crd
