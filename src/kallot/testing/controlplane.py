"""A real Kubernetes control plane for kallot's tests: etcd, kube-apiserver, kube-scheduler.

Where it sits: ``kallot.testing`` is test support. Nothing in ``kallot.core``, ``kallot.sim``
or ``kallot.kube`` imports it; tests and benchmarks do. The binaries come from
``tools/testenv/build.sh`` (``make controlplane``), which builds them from the published Go
modules into a cache directory outside the repository; this module asks that script where
the directory is, so the cache-key logic lives in one place.

What it gives a test:

- :class:`ControlPlane`, a context manager that runs etcd + kube-apiserver (RBAC on, static
  admin token) and optionally the real kube-scheduler, on free loopback ports in a private
  temporary directory, and writes an admin kubeconfig.
- :func:`create_nodes` / :func:`create_nodes_sync`, which register thousands of Node objects
  (with status: capacity, allocatable, ``Ready=True``) concurrently, and
  :func:`gpu_node_body`, a small builder for a node with ``nvidia.com/gpu`` allocatable.
- pytest fixtures (``control_plane``, ``make_control_plane``), registered for the whole test
  tree by ``tests/conftest.py`` (``pytest_plugins``) so one cluster serves the session.

Long module: the control plane's processes, their configuration files and readiness checks are
one lifecycle (start, wait ready, stop), and the node helpers need its kubeconfig and ports.

Heavy imports (``kubernetes``) are deferred to the functions that need them: this module is
loaded as a pytest plugin for every test run, including the unit tests that never start a
cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import pytest
import yaml

from kallot.config import wire

if TYPE_CHECKING:
    from kallot.k8sclient import api as k8s_api
    from kallot.k8sclient import sync as k8s_sync
    from kallot.k8sclient.client import JsonClient

__all__ = [
    "DEFAULT_FEATURE_GATES",
    "BinariesMissingError",
    "ControlPlane",
    "ControlPlaneError",
    "control_plane",
    "controlplane_bin_dir",
    "create_nodes",
    "create_nodes_sync",
    "find_binaries",
    "gpu_node_body",
    "make_control_plane",
    "until_allowed",
]

# src/kallot/testing/controlplane.py -> repository root.
_REPO_ROOT = Path(__file__).resolve().parents[3]
BUILD_SCRIPT = _REPO_ROOT / "tools" / "testenv" / "build.sh"
BINARIES = ("etcd", "kube-apiserver", "kube-scheduler")

# Beta and on by default in 1.36; set explicitly so the DRA tests keep meaning the same thing
# if a later pin changes the defaults (partitionable devices: MIG counters; consumable
# capacity: shares; device taints: unhealthy GPUs).
DEFAULT_FEATURE_GATES: Mapping[str, bool] = {
    "DRAPartitionableDevices": True,
    "DRAConsumableCapacity": True,
    "DRADeviceTaints": True,
    # Extended resources backed by a DeviceClass (KEP-5004): kube-apiserver keeps
    # DeviceClass.spec.extendedResourceName and pod status.extendedResourceClaimStatus.
    "DRAExtendedResource": True,
}

ADMIN_USER = "kallot-admin"
# The scheduler runs as the identity kubeadm gives it, so the bootstrap RBAC policy (not
# system:masters) decides what it may do, as in a real cluster.
SCHEDULER_USER = "system:kube-scheduler"

_LOG_TAIL_LINES = 40


class ControlPlaneError(RuntimeError):
    """The control plane could not be started, or a request to it failed."""


class BinariesMissingError(ControlPlaneError):
    """The etcd / kube-apiserver / kube-scheduler binaries have not been built."""


# --------------------------------------------------------------------------- binaries


def controlplane_bin_dir() -> Path:
    """Directory holding the test control plane binaries for the current pins.

    ``KALLOT_TESTENV_BIN`` overrides it (a directory with prebuilt binaries). Otherwise
    ``tools/testenv/build.sh --print-bin-dir`` computes it, so the cache key (derived from
    the pinned go.mod/go.sum files) is defined only in that script.
    """
    override = os.environ.get("KALLOT_TESTENV_BIN")
    if override:
        return Path(override)
    if not BUILD_SCRIPT.is_file():
        raise BinariesMissingError(
            f"{BUILD_SCRIPT} not found (kallot is not running from a source checkout); "
            "set KALLOT_TESTENV_BIN to a directory with etcd, kube-apiserver and kube-scheduler"
        )
    out = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--print-bin-dir"],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip())


def helm_template(
    tmp: Path, chart: Path, *, release: str = "kallot", namespace: str, sets: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """``helm template`` of ``chart`` by the test environment's helm (its caches in ``tmp``),
    with ``--set`` for each of ``sets``: the rendered documents."""
    import yaml

    env = {
        **os.environ,
        **{k: str(tmp) for k in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME")},
    }
    helm = str(controlplane_bin_dir() / "helm")
    args = [a for s in sets for a in ("--set", s)]
    out = subprocess.run(
        [helm, "template", release, str(chart), "--namespace", namespace, *args],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def find_binaries(names: Iterable[str] = BINARIES) -> dict[str, Path]:
    """Paths of the named binaries; raises :class:`BinariesMissingError` naming the fix."""
    bin_dir = controlplane_bin_dir()
    found = {name: bin_dir / name for name in names}
    missing = [name for name, path in found.items() if not os.access(path, os.X_OK)]
    if missing:
        raise BinariesMissingError(
            f"test control plane binaries missing from {bin_dir}: {', '.join(missing)}. "
            "Build them with `make controlplane` (bash tools/testenv/build.sh; about 20 "
            "minutes the first time, cached afterwards), or point KALLOT_TESTENV_BIN at a "
            "directory that has them."
        )
    return found


# --------------------------------------------------------------------------- helpers


def _free_port() -> int:
    # The kernel picks a free port; it stays free until a process binds it. A collision in
    # that window makes startup fail with "address already in use", which start() retries.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _generate_service_account_keypair(key_path: Path, pub_path: Path) -> None:
    # kube-apiserver signs service-account tokens with this key. The openssl CLI is used
    # because the `cryptography` package is not among kallot's dependencies and openssl is
    # on every Debian-based machine (ca-certificates depends on it).
    openssl = shutil.which("openssl")
    if openssl is None:
        raise ControlPlaneError("openssl not found on PATH; it generates the service-account key")
    subprocess.run(
        [
            openssl,
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
            str(key_path),
        ],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [openssl, "pkey", "-in", str(key_path), "-pubout", "-out", str(pub_path)],
        check=True,
        capture_output=True,
    )


def _set_pdeathsig() -> None:  # pragma: no cover - runs in the child between fork and exec
    # Linux only: the child gets SIGKILL when the thread that started it dies, so a killed
    # test run (CI timeout, kill -9) does not leave etcd and kube-apiserver behind.
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class _Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path


@dataclass
class _Ports:
    etcd_client: int = field(default_factory=_free_port)
    etcd_peer: int = field(default_factory=_free_port)
    apiserver: int = field(default_factory=_free_port)
    scheduler: int = field(default_factory=_free_port)


# --------------------------------------------------------------------------- control plane


class ControlPlane:
    """etcd + kube-apiserver (+ kube-scheduler) on loopback, for one test session.

    Use as a context manager, or call :meth:`start` and :meth:`stop`. After start:
    :attr:`kubeconfig_path` (admin, token auth, verifies the apiserver's self-signed CA),
    :attr:`server_url`, :attr:`token`.

    Args:
        scheduler: also run kube-scheduler (as ``system:kube-scheduler``, no leader election).
        scheduler_config: extra KubeSchedulerConfiguration fields (profiles, extenders, ...)
            merged over the minimal config this class writes; ``clientConnection`` and
            ``leaderElection`` are always set here.
        feature_gates: passed to kube-apiserver and kube-scheduler.
        service_accounts: keep the ServiceAccount admission plugin on, so pods get a projected
            service-account token (the apiserver signs them with its key); a
            ``ControllerManager`` running the ``serviceaccount-controller`` and
            ``root-ca-certificate-publisher-controller`` must then create each namespace's
            ``default`` ServiceAccount and ``kube-root-ca.crt`` (what a chart installed on a
            real node needs).
        apiserver_args / scheduler_args: extra command-line flags appended last.
        start_timeout: seconds for the whole startup, readiness included.
        stop_timeout: seconds each process gets after SIGTERM before SIGKILL.
        bin_dir: directory with the binaries (default: :func:`controlplane_bin_dir`).
        keep_dir: leave the temporary directory (logs, certs, etcd data) after stop.
    """

    def __init__(
        self,
        *,
        scheduler: bool = True,
        scheduler_config: Mapping[str, Any] | None = None,
        feature_gates: Mapping[str, bool] = DEFAULT_FEATURE_GATES,
        service_accounts: bool = False,
        apiserver_args: Sequence[str] = (),
        scheduler_args: Sequence[str] = (),
        start_timeout: float = 90.0,
        stop_timeout: float = 10.0,
        bin_dir: Path | None = None,
        keep_dir: bool = False,
    ) -> None:
        self.with_scheduler = scheduler
        self.scheduler_config = dict(scheduler_config or {})
        self.feature_gates = dict(feature_gates)
        self.service_accounts = service_accounts
        self.apiserver_args = list(apiserver_args)
        self.scheduler_args = list(scheduler_args)
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.keep_dir = keep_dir
        names = BINARIES if scheduler else ("etcd", "kube-apiserver")
        if bin_dir is None:
            self._bins = find_binaries(names)
        else:
            self._bins = {name: bin_dir / name for name in names}
        self._procs: list[_Proc] = []
        self._dir: Path | None = None
        self.token = secrets.token_hex(16)
        self._scheduler_token = secrets.token_hex(16)
        self._ports = _Ports()
        #: Seconds the last successful start() took, readiness included.
        self.start_seconds: float | None = None

    # -- public surface --------------------------------------------------------------

    @property
    def dir(self) -> Path:
        """Private temporary directory: logs, certificates, kubeconfigs, etcd data."""
        if self._dir is None:
            raise ControlPlaneError("control plane is not started")
        return self._dir

    @property
    def server_url(self) -> str:
        return f"https://127.0.0.1:{self._ports.apiserver}"

    @property
    def etcd_url(self) -> str:
        """etcd's client URL (plain HTTP on loopback; its JSON gateway is under /v3)."""
        return f"http://127.0.0.1:{self._ports.etcd_client}"

    @property
    def kubeconfig_path(self) -> Path:
        """Admin kubeconfig (user in system:masters)."""
        return self.dir / "admin.kubeconfig"

    @property
    def scheduler_kubeconfig_path(self) -> Path:
        """Kubeconfig of kube-scheduler's identity (``system:kube-scheduler``, bootstrap RBAC):
        another scheduler run with it gets the same permissions and API priority level."""
        return self.dir / "scheduler.kubeconfig"

    @property
    def ca_path(self) -> Path:
        """CA bundle of the apiserver's self-signed serving certificate."""
        return self.dir / "pki" / "apiserver.crt"

    @property
    def log_paths(self) -> dict[str, Path]:
        return {p.name: p.log_path for p in self._procs}

    @property
    def pids(self) -> dict[str, int]:
        return {p.name: p.popen.pid for p in self._procs}

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> Self:
        """Start everything and wait until it is ready; on failure stop and raise."""
        if self._procs:
            raise ControlPlaneError("control plane already started")
        # One retry covers the small window in which another process can take a port
        # between _free_port() and the bind in the child.
        for attempt in (1, 2):
            try:
                self._start_once()
                return self
            except ControlPlaneError as exc:
                self.stop()
                if attempt == 2 or "address already in use" not in str(exc):
                    raise
                self._ports = _Ports()
        raise AssertionError("unreachable")

    def stop(self) -> None:
        """SIGTERM every process (scheduler, apiserver, then etcd), SIGKILL after the timeout,
        then remove the temporary directory. Safe to call twice."""
        # The apiserver still flushes to etcd while it shuts down, so etcd goes last.
        front = [p for p in self._procs if p.name != "etcd"]
        back = [p for p in self._procs if p.name == "etcd"]
        for group in (front, back):
            for p in group:
                if p.popen.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        p.popen.send_signal(signal.SIGTERM)
            for p in group:
                try:
                    p.popen.wait(timeout=self.stop_timeout)
                except subprocess.TimeoutExpired:
                    p.popen.kill()
                    p.popen.wait()
        self._procs = []
        if self._dir is not None and not self.keep_dir:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._dir = None

    def api_client(self) -> k8s_sync.ApiClient:
        """A synchronous client for the admin kubeconfig (caller closes it)."""
        from kallot.k8sclient import sync

        return sync.api_client(self.kubeconfig_path)

    async def async_api_client(self, *, pool_size: int = 100) -> k8s_api.ApiClient:
        """A ``kubernetes.aio`` client for the admin kubeconfig (caller closes it)."""
        return await _aio_client_from_kubeconfig(self.kubeconfig_path, pool_size=pool_size)

    def logs(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The last lines of each process's log, for failure messages."""
        return "\n".join(
            f"---- {p.name} (pid {p.popen.pid}, exit {p.popen.poll()}) {p.log_path} ----\n"
            + _tail(p.log_path, lines)
            for p in self._procs
        )

    # -- startup ---------------------------------------------------------------------

    def _start_once(self) -> None:
        t0 = time.monotonic()
        deadline = t0 + self.start_timeout
        self._dir = Path(tempfile.mkdtemp(prefix="kallot-controlplane-"))
        pki = self.dir / "pki"
        pki.mkdir()
        _generate_service_account_keypair(pki / "sa.key", pki / "sa.pub")
        tokens = self.dir / "tokens.csv"
        tokens.write_text(
            f"{self.token},{ADMIN_USER},{ADMIN_USER},system:masters\n"
            f"{self._scheduler_token},{SCHEDULER_USER},{SCHEDULER_USER}\n"
        )
        tokens.chmod(0o600)
        ports = self._ports
        etcd_url = f"http://127.0.0.1:{ports.etcd_client}"
        peer_url = f"http://127.0.0.1:{ports.etcd_peer}"

        etcd = self._spawn(
            "etcd",
            [
                f"--data-dir={self.dir / 'etcd'}",
                "--name=default",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                # Test data is disposable; fsync would dominate write latency.
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )
        # kube-apiserver spends its first seconds on in-process setup and retries etcd until
        # it answers, so both start at once; waiting for etcd first only adds its startup.
        apiserver = self._spawn(
            "kube-apiserver",
            [
                f"--etcd-servers={etcd_url}",
                f"--cert-dir={pki}",
                f"--secure-port={ports.apiserver}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--allow-privileged=true",
                # There is no controller-manager by default: nothing would create the default
                # ServiceAccount the ServiceAccount plugin demands of every pod (unless
                # service_accounts, with a ControllerManager doing it), nor lift the
                # node.kubernetes.io/not-ready taint TaintNodesByCondition puts on every new
                # node (the node lifecycle controller does that in a real cluster).
                "--disable-admission-plugins="
                + ("" if self.service_accounts else "ServiceAccount,")
                + "TaintNodesByCondition",
                "--authorization-mode=RBAC",
                f"--token-auth-file={tokens}",
                f"--service-account-issuer={self.server_url}",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                *self._feature_gate_args(),
                *self.apiserver_args,
            ],
        )
        self._wait_ready(etcd, f"{etcd_url}/readyz", deadline)
        self._wait_ready(apiserver, f"{self.server_url}/readyz", deadline, token=self.token)
        # /readyz does not cover the namespaces the bootstrap controller creates; tests put
        # objects in "default" right away.
        self._wait_ready(
            apiserver,
            f"{self.server_url}/api/v1/namespaces/default",
            deadline,
            token=self.token,
        )
        self._write_kubeconfig(self.kubeconfig_path, ADMIN_USER, self.token)

        sched_kubeconfig = self.scheduler_kubeconfig_path
        self._write_kubeconfig(sched_kubeconfig, SCHEDULER_USER, self._scheduler_token)
        if self.with_scheduler:
            self._start_scheduler(deadline)
        self.start_seconds = time.monotonic() - t0

    def start_scheduler(self, timeout: float = 90.0) -> None:
        """Start kube-scheduler now, on a control plane started without it (a benchmark that
        creates its pods first); returns once its /readyz answers."""
        if "kube-scheduler" in self.pids:
            raise ControlPlaneError("kube-scheduler is already running")
        if "kube-scheduler" not in self._bins:
            self._bins.update(find_binaries(("kube-scheduler",)))
        self._start_scheduler(time.monotonic() + timeout)

    def stop_scheduler(self) -> None:
        """SIGTERM kube-scheduler and wait for it (SIGKILL after ``stop_timeout``)."""
        for p in [p for p in self._procs if p.name == "kube-scheduler"]:
            if p.popen.poll() is None:
                p.popen.terminate()
            try:
                p.popen.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait()
            self._procs.remove(p)

    def _start_scheduler(self, deadline: float) -> None:
        ports = self._ports
        sched_kubeconfig = self.scheduler_kubeconfig_path
        config = self._scheduler_config(sched_kubeconfig)
        config_path = self.dir / "scheduler-config.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        scheduler = self._spawn(
            "kube-scheduler",
            [
                # Leader election is off in the config file (leaderElection.leaderElect);
                # the --leader-elect flag is ignored when --config is given.
                f"--config={config_path}",
                f"--authentication-kubeconfig={sched_kubeconfig}",
                f"--authorization-kubeconfig={sched_kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={ports.scheduler}",
                *self._feature_gate_args(),
                *self.scheduler_args,
            ],
        )
        # The scheduler's /readyz waits for its informers to sync.
        self._wait_ready(scheduler, f"https://127.0.0.1:{ports.scheduler}/readyz", deadline)

    def _feature_gate_args(self) -> list[str]:
        if not self.feature_gates:
            return []
        gates = ",".join(f"{k}={str(v).lower()}" for k, v in sorted(self.feature_gates.items()))
        return [f"--feature-gates={gates}"]

    def _scheduler_config(self, kubeconfig: Path) -> dict[str, Any]:
        config: dict[str, Any] = {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
        }
        config.update(self.scheduler_config)
        config["clientConnection"] = {
            **config.get("clientConnection", {}),
            "kubeconfig": str(kubeconfig),
        }
        config["leaderElection"] = {"leaderElect": False}
        return config

    def _write_kubeconfig(self, path: Path, user: str, token: str) -> None:
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "kallot-test",
                    "cluster": {
                        "server": self.server_url,
                        "certificate-authority": str(self.ca_path),
                    },
                }
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [
                {"name": "kallot-test", "context": {"cluster": "kallot-test", "user": user}}
            ],
            "current-context": "kallot-test",
        }
        path.write_text(yaml.safe_dump(kubeconfig, sort_keys=False))
        path.chmod(0o600)

    def _spawn(self, name: str, args: list[str]) -> _Proc:
        log_path = self.dir / f"{name}.log"
        with log_path.open("wb") as log:
            popen = subprocess.Popen(
                [str(self._bins[name]), *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
                # Own session: a Ctrl-C in the terminal reaches pytest, which then stops the
                # cluster in order, instead of killing the children mid-test.
                start_new_session=True,
                preexec_fn=_set_pdeathsig,  # noqa: PLW1509 - no threads are started between fork and exec
            )
        proc = _Proc(name, popen, log_path)
        self._procs.append(proc)
        return proc

    def _wait_ready(
        self, proc: _Proc, url: str, deadline: float, *, token: str | None = None
    ) -> None:
        """Poll ``url`` until it answers 200, the process exits, or the deadline passes."""
        # Loopback and a self-signed certificate: readiness is about the process, not trust;
        # the kubeconfig written afterwards does verify against the generated CA.
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        interval = 0.02
        last_error = "no answer yet"
        while True:
            if proc.popen.poll() is not None:
                raise ControlPlaneError(
                    f"{proc.name} exited with status {proc.popen.returncode} during startup\n"
                    + self.logs()
                )
            try:
                request = urllib.request.Request(url, headers=headers)
                with urllib.request.urlopen(request, timeout=2, context=ctx) as resp:
                    if resp.status == 200:
                        return
                    last_error = f"HTTP {resp.status}"
            except urllib.error.HTTPError as exc:
                body = exc.read(2000).decode(errors="replace")
                last_error = f"HTTP {exc.code}: {body}"
            except (OSError, ValueError) as exc:
                last_error = repr(exc)
            if time.monotonic() >= deadline:
                raise ControlPlaneError(
                    f"{proc.name} not ready at {url} within {self.start_timeout:.0f}s "
                    f"(last: {last_error})\n" + self.logs()
                )
            # Poll interval of a bounded readiness loop (not a synchronization sleep):
            # starts short because etcd is up in ~100 ms, backs off to 250 ms.
            time.sleep(interval)
            interval = min(interval * 2, 0.25)


# --------------------------------------------------------------------------- nodes


def gpu_node_body(
    name: str,
    gpus: int = 8,
    *,
    cpu_milli: int = 64_000,
    mem_mib: int = 512 * 1024,
    labels: Mapping[str, str] | None = None,
    pods: int = 110,
) -> dict[str, Any]:
    """A Node as a plain dict with ``nvidia.com/gpu`` capacity/allocatable and ``Ready=True``.

    A convenience for tests; any Node dict works with :func:`create_nodes`.
    """
    resources = {
        "cpu": f"{cpu_milli}m",
        "memory": f"{mem_mib}Mi",
        "pods": str(pods),
        wire.RESOURCE_GPU: str(gpus),
    }
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                **(labels or {}),
            },
        },
        "spec": {},
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kallot test node (no kubelet)",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
        },
    }


async def _aio_client_from_kubeconfig(
    kubeconfig: str | os.PathLike[str], *, pool_size: int = 100
) -> k8s_api.ApiClient:
    from kallot.k8sclient import api

    configuration = await api.load_configuration(kubeconfig)
    # aiohttp's connector caps parallel requests at this number.
    return api.api_client(configuration, pool_size=pool_size)


async def _request(
    api: k8s_api.ApiClient,
    method: str,
    path: str,
    body: Mapping[str, Any],
    *,
    content_type: str,
    timeout: float,
) -> dict[str, Any]:
    # The generic request path of the generated client (k8sclient.api): the body goes out
    # as the dict it is (the typed create_node would round-trip it through pydantic models,
    # dropping any field the models do not know), and the answer is not turned back into
    # models.
    from kallot.k8sclient import api as k8s
    from kallot.k8sclient.errors import ApiError

    try:
        return await k8s.request_json(
            api, method, path, body=body, content_type=content_type, timeout=timeout
        )
    except ApiError as exc:
        raise ControlPlaneError(str(exc)) from exc


async def _create_one(api: k8s_api.ApiClient, body: Mapping[str, Any], timeout: float) -> str:
    created = await _request(
        api, "POST", "/api/v1/nodes", body, content_type="application/json", timeout=timeout
    )
    name = str(created["metadata"]["name"])
    # Node create keeps the status it is given (kubelets register that way), so normally
    # one POST is enough. If the server dropped it (an admission plugin, a future
    # strategy change), write it through the status subresource.
    wanted = body.get("status") or {}
    if wanted and not (created.get("status") or {}).get("allocatable"):
        await _request(
            api,
            "PATCH",
            f"/api/v1/nodes/{name}/status",
            {"status": wanted},
            content_type="application/merge-patch+json",
            timeout=timeout,
        )
    return name


async def create_nodes(
    api_or_kubeconfig: k8s_api.ApiClient | str | os.PathLike[str],
    bodies: Iterable[Mapping[str, Any]],
    *,
    concurrency: int = 64,
    request_timeout: float = 60.0,
) -> list[str]:
    """Create Node objects (dict bodies, status included) with ``concurrency`` requests in
    flight; returns the created names in body order.

    ``api_or_kubeconfig`` is a ``kubernetes.aio`` ApiClient (left open) or a kubeconfig path
    (a client is made and closed here). The first failure cancels the rest and raises
    :class:`ControlPlaneError`; nodes created before it stay.
    """
    items = list(bodies)
    names: list[str] = [""] * len(items)
    async with _client(api_or_kubeconfig, pool_size=concurrency) as api:
        queue = iter(enumerate(items))

        async def worker() -> None:
            # Workers pull from one shared iterator: at most `concurrency` requests in
            # flight, and no task per node (5,000 pending tasks cost more than they help).
            for i, body in queue:
                names[i] = await _create_one(api, body, request_timeout)

        try:
            async with asyncio.TaskGroup() as group:
                for _ in range(max(1, min(concurrency, len(items)))):
                    group.create_task(worker())
        except ExceptionGroup as eg:
            first = eg.exceptions[0]
            if isinstance(first, ControlPlaneError):
                raise first from None
            raise ControlPlaneError(f"creating nodes failed: {first!r}") from first
    return names


def create_nodes_sync(
    kubeconfig: str | os.PathLike[str],
    bodies: Iterable[Mapping[str, Any]],
    *,
    concurrency: int = 64,
    request_timeout: float = 60.0,
) -> list[str]:
    """:func:`create_nodes` for synchronous code (runs its own event loop)."""
    return asyncio.run(
        create_nodes(kubeconfig, bodies, concurrency=concurrency, request_timeout=request_timeout)
    )


async def until_subject_allowed(
    client: JsonClient, user: str, path: str, *, verb: str = "get", timeout: float = 30.0
) -> None:
    """Until the API server's authorizer lets ``user`` (a service account's full name) ``verb``
    the non-resource ``path``: a SubjectAccessReview, as a secure port asks it."""
    ns = user.split(":")[2] if user.startswith("system:serviceaccount:") else ""
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{ns}"],
            "nonResourceAttributes": {"path": path, "verb": verb},
        },
    }
    deadline = time.monotonic() + timeout
    while True:
        got = await client.request(
            "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", body=review
        )
        if (got.get("status") or {}).get("allowed"):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"RBAC never allowed {user} to {verb} {path}")
        await asyncio.sleep(0.1)


async def until_allowed(
    client: JsonClient,
    verb: str,
    resource: str,
    *,
    group: str = "",
    subresource: str = "",
    namespace: str = "",
    timeout: float = 30.0,
) -> None:
    """Until the API server lets ``client``'s own identity do ``verb`` on ``resource``: RBAC
    objects just written take effect once the server's authorizer has read them (its informers,
    asynchronously), so a test that writes them and at once acts under them can be refused.
    Asked with a SelfSubjectAccessReview, which goes through that same authorizer."""
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {
            "resourceAttributes": {
                "group": group,
                "resource": resource,
                "subresource": subresource,
                "verb": verb,
                "namespace": namespace,
            }
        },
    }
    deadline = time.monotonic() + timeout
    path = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
    while True:
        got = await client.request("POST", path, body=review)
        if (got.get("status") or {}).get("allowed"):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"RBAC never allowed {verb} {resource}: {got.get('status')}")
        await asyncio.sleep(0.1)


async def until_denied(
    attempt: Callable[[], Awaitable[object]], *, timeout: float = 60.0
) -> Exception:
    """Until ``attempt`` (a dry run: it passes admission and writes nothing) is refused with 403
    or 422: the API server loads admission policies asynchronously, so a test that creates one
    and at once acts under it can be let through. Returns the refusal."""
    from kallot.k8sclient.errors import ApiError

    deadline = time.monotonic() + timeout
    while True:
        try:
            await attempt()
        except ApiError as exc:
            assert exc.status in (403, 422), exc
            return exc
        if time.monotonic() > deadline:
            raise AssertionError("the admission policy never took effect")
        await asyncio.sleep(0.2)


async def service_account_token(
    client: JsonClient,
    namespace: str,
    service_account: str,
    *,
    bound_pod: Mapping[str, Any] | None = None,
) -> str:
    """A fresh token of ``service_account`` (TokenRequest, one hour). ``bound_pod``: the
    token is bound to that pod, so it carries the pod's node claim
    (``authentication.kubernetes.io/node-name``), as a kubelet-projected token does."""
    spec: dict[str, Any] = {"expirationSeconds": 3600}
    if bound_pod is not None:
        meta = bound_pod["metadata"]
        spec["boundObjectRef"] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta["name"],
            "uid": meta["uid"],
        }
    token = await client.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token",
        body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )
    return str(token["status"]["token"])


async def service_account_kubeconfig(
    client: JsonClient,
    cp: ControlPlane,
    namespace: str,
    service_account: str,
    path: Path,
    *,
    bound_pod: Mapping[str, Any] | None = None,
) -> Path:
    """A kubeconfig at ``path`` for a fresh token of ``service_account``
    (``service_account_token``)."""
    token = await service_account_token(client, namespace, service_account, bound_pod=bound_pod)
    import yaml

    kubeconfig = yaml.safe_load(cp.kubeconfig_path.read_text())
    kubeconfig["users"][0]["user"] = {"token": token}
    path.write_text(yaml.safe_dump(kubeconfig))
    return path


@contextlib.asynccontextmanager
async def _client(
    api_or_kubeconfig: k8s_api.ApiClient | str | os.PathLike[str], *, pool_size: int
) -> AsyncIterator[k8s_api.ApiClient]:
    if isinstance(api_or_kubeconfig, str | os.PathLike):
        api = await _aio_client_from_kubeconfig(api_or_kubeconfig, pool_size=pool_size)
        try:
            yield api
        finally:
            await api.close()  # type: ignore[no-untyped-call]
    else:
        yield api_or_kubeconfig


# --------------------------------------------------------------------------- pytest fixtures


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """One etcd + kube-apiserver + kube-scheduler for the whole test session.

    Shared: tests that add cluster-scoped objects (nodes) should remove them, or use
    :func:`make_control_plane` for a private cluster.
    """
    with ControlPlane(scheduler=True) as cp:
        yield cp


@pytest.fixture
def make_control_plane() -> Iterator[Callable[..., ControlPlane]]:
    """Factory for private, started control planes (``ControlPlane`` keyword arguments);
    each is stopped when the test ends."""
    started: list[ControlPlane] = []

    def make(**kwargs: Any) -> ControlPlane:
        cp = ControlPlane(**kwargs).start()
        started.append(cp)
        return cp

    yield make
    for cp in reversed(started):
        cp.stop()
