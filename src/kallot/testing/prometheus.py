"""A real Prometheus for tests: the binary ``tools/testenv/build-prometheus.sh`` builds from its
Go module (pinned in tools/testenv/prometheus/go.mod), started on loopback with a fresh TSDB,
scraping static targets (the node agents' and the scheduler's ``/metrics``) every second.

``KALLOT_PROMETHEUS_BIN`` overrides the binary's directory. ``Prometheus.wait_for(query)``
synchronizes on what Prometheus has stored (no sleeps): it polls an instant query until it
returns what the test waits for.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kallot.testing.controlplane import BinariesMissingError

BUILD_SCRIPT = Path(__file__).resolve().parents[3] / "tools" / "testenv" / "build-prometheus.sh"
SCRAPE_S = 1


def prometheus_bin() -> Path:
    """The prometheus binary for the current pin; BinariesMissingError naming the fix."""
    override = os.environ.get("KALLOT_PROMETHEUS_BIN")
    if override:
        path = Path(override) / "prometheus"
    else:
        if not BUILD_SCRIPT.is_file():
            raise BinariesMissingError(
                f"{BUILD_SCRIPT} not found; set KALLOT_PROMETHEUS_BIN to a directory with prometheus"
            )
        out = subprocess.run(
            ["bash", str(BUILD_SCRIPT), "--print-bin-dir"],
            check=True,
            capture_output=True,
            text=True,
        )
        path = Path(out.stdout.strip()) / "prometheus"
    if not os.access(path, os.X_OK):
        raise BinariesMissingError(
            f"prometheus missing at {path}: build it with `bash tools/testenv/build-prometheus.sh` "
            "(about 10 minutes on 2 cores the first time, cached afterwards)"
        )
    return path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prometheus:
    """One Prometheus process; use as a context manager."""

    def __init__(self, targets: Sequence[str], *, job: str = "kallot-agent") -> None:
        self.targets = list(targets)
        self.job = job
        self.dir = Path(tempfile.mkdtemp(prefix="kallot-prom-"))
        self.port = 0
        self.popen: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Prometheus:
        binary = prometheus_bin()
        config = {
            "global": {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s"},
            "scrape_configs": [
                {"job_name": self.job, "static_configs": [{"targets": self.targets}]}
            ],
        }
        (self.dir / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        for _attempt in range(3):
            self.port = _free_port()
            log = (self.dir / "prometheus.log").open("wb")
            self.popen = subprocess.Popen(
                [
                    str(binary),
                    f"--config.file={self.dir / 'prometheus.yml'}",
                    f"--storage.tsdb.path={self.dir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            if self._wait_ready(60):
                return self
            self.close()
        raise RuntimeError(f"prometheus did not become ready; log: {self.dir / 'prometheus.log'}")

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen is not None and self.popen.poll() is not None:
                return False  # exited (e.g. the port was taken meanwhile)
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return True
            except OSError:
                pass
            time.sleep(0.1)  # polling a process's readiness, not synchronizing on state
        return False

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self.popen = None

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query's result vector."""
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
        with urllib.request.urlopen(url, timeout=10) as r:
            data = json.loads(r.read())
        return list(data["data"]["result"])

    def wait_for(
        self,
        promql: str,
        ok: Callable[[list[dict[str, Any]]], bool] = bool,
        *,
        timeout: float = 120.0,
    ) -> list[dict[str, Any]]:
        """Poll ``promql`` until ``ok(result)``; TimeoutError naming the query otherwise."""
        deadline = time.monotonic() + timeout
        result: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            result = self.query(promql)
            if ok(result):
                return result
            time.sleep(0.25)
        raise TimeoutError(f"prometheus: {promql!r} not as expected after {timeout}s: {result}")
