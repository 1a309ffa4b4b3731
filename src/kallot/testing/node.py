"""A real Kubernetes node for kallot's tests: containerd v2 and the kubelet, against a
:class:`~kallot.testing.controlplane.ControlPlane`.

Where it sits: test support, like ``kallot.testing.controlplane``; the node tier
(``pytest -m node``, tests/realnode/) uses it. The binaries and the two image archives (the
pause sandbox image, busybox) come from ``tools/testenv/build-node.sh``; this module asks that
script where they are, so the cache key lives in one place. runc is Debian's.

How it runs here (root, no systemd, no registry, no GPU):

- The kubelet's device-plugin directory is fixed at ``/var/lib/kubelet/device-plugins``, so a
  *holder* process (``unshare -m --propagation private``) bind-mounts the node's test
  directory over ``/var/lib/kubelet`` and ``/run/containerd`` in a private mount namespace;
  containerd and the kubelet join it with ``nsenter``, so neither the host nor another test
  node sees those mounts. Agents run outside it and use the test directory's paths
  (:attr:`Node.device_plugin_dir`, :attr:`Node.plugins_registry_dir`, ...): a bind mount
  shows the same inodes under both names.
- containerd: ``restrict_oom_score_adj`` (this VM cannot lower OOM scores), CDI on, reading
  :attr:`Node.cdi_dir`; a loopback-only CNI config (without one the Node stays NotReady);
  the pause image is the sandbox image; images are imported, pods use ``imagePullPolicy:
  Never``.
- kubelet: cgroupfs, no per-QoS cgroups, nothing enforced on node allocatable, cgroup v1
  allowed; serving and healthz ports are free loopback ports so several nodes can coexist.
- Pod logs: the kubelet refuses a loopback node IP, so ``kubectl logs`` through the apiserver
  cannot be counted on; :meth:`Node.pod_log` reads the CRI log file under ``podLogsDir``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import yaml

from kallot.testing.controlplane import ControlPlane, ControlPlaneError

__all__ = [
    "BUSYBOX_IMAGE",
    "PAUSE_IMAGE",
    "Node",
    "NodeError",
    "node_build_dirs",
]

_REPO_ROOT = Path(__file__).resolve().parents[3]
BUILD_SCRIPT = _REPO_ROOT / "tools" / "testenv" / "build-node.sh"
PAUSE_IMAGE = "kallot.invalid/testenv/pause:1"
BUSYBOX_IMAGE = "kallot.invalid/testenv/busybox:1"
RUNC = "/usr/sbin/runc"
CNI_BIN_DIR = "/usr/lib/cni"  # Debian's containernetworking-plugins (loopback)
CNI_ETH0 = _REPO_ROOT / "tools" / "testenv" / "node" / "kallot-test-eth0"
_LOG_TAIL = 40


class NodeError(ControlPlaneError):
    """The test node could not be built, started or read."""


def _ask(flag: str) -> Path:
    res = subprocess.run(
        ["bash", str(BUILD_SCRIPT), flag], capture_output=True, text=True, check=False
    )
    if res.returncode != 0:
        raise NodeError(f"{BUILD_SCRIPT} {flag} failed: {res.stderr.strip()}")
    return Path(res.stdout.strip())


def node_build_dirs() -> tuple[Path, Path]:
    """The binaries' and the images' directories (``KALLOT_TESTENV_NODE`` overrides both:
    ``bin/`` and ``images/`` under it)."""
    override = os.environ.get("KALLOT_TESTENV_NODE")
    if override:
        bins, images = Path(override) / "bin", Path(override) / "images"
    else:
        bins, images = _ask("--print-dir") / "bin", _ask("--print-images")
    missing = [
        p for p in (bins / "containerd", bins / "kubelet", images / "busybox.tar") if not p.exists()
    ]
    if missing:
        raise NodeError(
            f"test node binaries missing ({', '.join(map(str, missing))}): run `make node` "
            f"(bash tools/testenv/build-node.sh)"
        )
    if not Path(RUNC).exists():
        raise NodeError(f"{RUNC} is missing: run `make node` (it installs Debian's runc)")
    return bins, images


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: Path, lines: int = _LOG_TAIL) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


@dataclass
class _Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path


class Node:
    """containerd + kubelet registering Node ``name`` with ``control_plane``.

    Use as a context manager. After start: the Node object exists and is Ready, both images
    are imported. ``kubelet_config`` is merged over the KubeletConfiguration written here.
    """

    def __init__(
        self,
        control_plane: ControlPlane,
        *,
        name: str = "",
        kubelet_config: dict[str, Any] | None = None,
        start_timeout: float = 120.0,
        keep_dir: bool = bool(os.environ.get("KALLOT_NODE_KEEP")),
    ) -> None:
        self.cp = control_plane
        self.name = name or f"kallot-node-{secrets.token_hex(3)}"
        self.extra_kubelet_config = dict(kubelet_config or {})
        self.start_timeout = start_timeout
        self.keep_dir = keep_dir
        self.bin, self.images = node_build_dirs()
        self._dir: Path | None = None
        self._holder: subprocess.Popen[bytes] | None = None
        self._procs: dict[str, _Proc] = {}
        self._client: Any = None
        self.kubelet_port = 0

    # -- paths ---------------------------------------------------------------------------

    @property
    def dir(self) -> Path:
        if self._dir is None:
            raise NodeError("node is not started")
        return self._dir

    @property
    def kubelet_dir(self) -> Path:
        """What the kubelet sees as /var/lib/kubelet."""
        return self.dir / "kubelet"

    @property
    def device_plugin_dir(self) -> Path:
        return self.kubelet_dir / "device-plugins"

    @property
    def plugins_registry_dir(self) -> Path:
        return self.kubelet_dir / "plugins_registry"

    @property
    def plugins_dir(self) -> Path:
        return self.kubelet_dir / "plugins"

    @property
    def pod_resources_socket(self) -> Path:
        return self.kubelet_dir / "pod-resources" / "kubelet.sock"

    @property
    def cdi_dir(self) -> Path:
        return self.dir / "cdi"

    @property
    def pod_logs_dir(self) -> Path:
        return self.dir / "pods"

    @property
    def containerd_socket(self) -> Path:
        return self.dir / "containerd.sock"

    # -- lifecycle -----------------------------------------------------------------------

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Self:
        deadline = time.monotonic() + self.start_timeout
        # Short: containerd's shim sockets and the kubelet's plugin sockets must fit in
        # sun_path (108 bytes).
        self._dir = Path(tempfile.mkdtemp(prefix="kn-", dir="/tmp"))
        try:
            for d in ("kubelet/device-plugins", "run-containerd", "cdi", "cni", "pods"):
                (self.dir / d).mkdir(parents=True)
            self._write_configs()
            self._start_holder()
            self._start_containerd(deadline)
            for image in ("pause.tar", "busybox.tar"):
                self.ctr("images", "import", "--local", str(self.images / image))
            self.start_kubelet()
            self.wait_ready(deadline - time.monotonic())
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Delete the Node object, stop the kubelet, containers and containerd, remove the
        directory. Safe to call twice."""
        if self._dir is None:
            return
        with contextlib.suppress(Exception):
            self._api().delete_node(self.name)
        self.stop_kubelet()
        # The kubelet leaves its pods running; stop them so their shims exit with containerd.
        if "containerd" in self._procs:
            with contextlib.suppress(Exception):
                self._crictl_stop_all()
        self._stop_proc("containerd")
        if self._holder is not None:
            self._kill_tree(self._holder)
            self._holder = None
        if self._client is not None:
            self._client.close()
            self._client = None
        if not self.keep_dir:
            # The namespace died with the holder, so its mounts are gone; what remains under
            # the directory is ordinary files (overlay snapshots are unmounted by then).
            shutil.rmtree(self._dir, ignore_errors=True)
        self._dir = None

    def logs(self) -> str:
        return "\n".join(
            f"---- {p.name} (exit {p.popen.poll()}) {p.log} ----\n{_tail(p.log)}"
            for p in self._procs.values()
        )

    def start_kubelet(self) -> None:
        self._spawn(
            "kubelet",
            [
                str(self.bin / "kubelet"),
                f"--config={self.dir / 'kubelet.yaml'}",
                f"--kubeconfig={self.cp.kubeconfig_path}",
                "--root-dir=/var/lib/kubelet",
                f"--hostname-override={self.name}",
                "--v=2",
            ],
        )

    def stop_kubelet(self) -> None:
        self._stop_proc("kubelet")

    def restart_kubelet(self) -> None:
        """What a kubelet restart does on a node: the device-plugin manager starts over (new
        kubelet.sock, plugins must register again)."""
        self.stop_kubelet()
        self.start_kubelet()

    def wait_ready(self, timeout: float = 60.0) -> None:
        self.wait_for(self._ready, timeout, f"Node {self.name} Ready")

    def wait_for(self, cond: Callable[[], Any], timeout: float, what: str) -> Any:
        """Poll ``cond`` (every 0.25 s: a bounded readiness poll) until it returns truthy."""
        deadline = time.monotonic() + timeout
        last: object = None
        while True:
            for p in self._procs.values():
                if p.popen.poll() is not None:
                    raise NodeError(f"{p.name} exited while waiting for {what}\n{self.logs()}")
            try:
                value = cond()
                if value:
                    return value
            except Exception as exc:
                last = exc
            if time.monotonic() >= deadline:
                raise NodeError(
                    f"{what}: not within {timeout:.0f}s (last: {last!r})\n{self.logs()}"
                )
            time.sleep(0.25)

    def pod_log(self, namespace: str, pod: str, container: str, stream: str = "") -> str:
        """The container's output from the kubelet's CRI log file, without the CRI prefix
        (``<time> <stream> <F|P> ``; partial lines joined): both streams in the order the
        runtime read them (which interleaves stdout and stderr arbitrarily), or only
        ``stream`` ("stdout", "stderr")."""
        pod_dirs = list(self.pod_logs_dir.glob(f"{namespace}_{pod}_*"))
        if len(pod_dirs) != 1:
            raise NodeError(f"no single log dir for pod {namespace}/{pod} in {self.pod_logs_dir}")
        files = sorted((pod_dirs[0] / container).glob("*.log"))
        if not files:
            raise NodeError(f"no log of container {container} in {pod_dirs[0]}")
        out: list[str] = []
        for line in files[-1].read_text().splitlines():
            _ts, which, tag, text = [*line.split(" ", 3), "", "", "", ""][:4]
            if not stream or which == stream:
                out.append(text if tag == "P" else text + "\n")
        return "".join(out)

    def kubelet_log_count(self, text: str) -> int:
        """How often ``text`` is in the kubelet's log (all its runs): a restart test waits for
        one more registration than before."""
        p = self._procs.get("kubelet")
        path = p.log if p is not None else self.dir / "kubelet.log"
        return path.read_text(errors="replace").count(text)

    def ctr(self, *args: str) -> str:
        """Run ``ctr -n k8s.io`` against this node's containerd."""
        res = subprocess.run(
            [str(self.bin / "ctr"), f"--address={self.containerd_socket}", "-n", "k8s.io", *args],
            capture_output=True,
            text=True,
            check=False,
        )
        if res.returncode != 0:
            raise NodeError(f"ctr {' '.join(args)} failed: {res.stderr.strip()}")
        return res.stdout

    # -- internals -----------------------------------------------------------------------

    def _api(self) -> Any:
        """One client for the node's own reads (closed in stop)."""
        if self._client is None:
            self._client = self.cp.api_client()
        from kallot.k8sclient import sync

        return sync.CoreV1Api(self._client)

    def _ready(self) -> bool:
        node = self._api().read_node(self.name)
        return any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))

    def _write_configs(self) -> None:
        d = self.dir
        # loopback, then an eth0 inside the pod's namespace only (tools/testenv/node/
        # kallot-test-eth0): the CRI wants an eth0 with an IP; nothing touches the host network.
        (d / "cni" / "10-kallot-test.conflist").write_text(
            '{"cniVersion": "1.0.0", "name": "kallot-test", '
            '"plugins": [{"type": "loopback"}, {"type": "kallot-test-eth0"}]}\n'
        )
        (d / "cni-bin").mkdir()
        shutil.copy(CNI_ETH0, d / "cni-bin" / CNI_ETH0.name)
        runtime = "plugins.'io.containerd.cri.v1.runtime'"
        (d / "containerd.toml").write_text(
            f"""version = 3
root = "{d}/containerd"
state = "{d}/run-containerd/state"
[grpc]
  address = "{self.containerd_socket}"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
[{runtime}]
  enable_cdi = true
  cdi_spec_dirs = ["{self.cdi_dir}"]
  # This VM cannot lower a process's OOM score; the kubelet's pods would fail to start.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
[{runtime}.cni]
  bin_dirs = ["{CNI_BIN_DIR}", "{d}/cni-bin"]
  conf_dir = "{d}/cni"
  max_conf_num = 1
[{runtime}.containerd]
  default_runtime_name = "runc"
[{runtime}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{runtime}.containerd.runtimes.runc.options]
  BinaryName = "{RUNC}"
  SystemdCgroup = false
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "{PAUSE_IMAGE}"
"""
        )
        self.kubelet_port = _free_port()
        config: dict[str, Any] = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "address": "127.0.0.1",
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": _free_port(),
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            # cgroup v1 here, and no systemd: cgroupfs, no per-QoS tree, nothing enforced.
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupsPerQOS": False,
            "enforceNodeAllocatable": [],
            "failSwapOn": False,
            "podLogsDir": str(self.pod_logs_dir),
            "staticPodPath": "",
            # The test directory is on a small tmpfs next to other jobs: never evict or
            # garbage-collect the imported images because of someone else's disk use.
            "evictionHard": {
                "memory.available": "1Mi",
                "nodefs.available": "0%",
                "imagefs.available": "0%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "nodeStatusUpdateFrequency": "2s",
            "syncFrequency": "5s",
            "fileCheckFrequency": "5s",
            "serializeImagePulls": False,
            "resolvConf": "/etc/resolv.conf",
            "maxPods": 20,
        }
        config.update(self.extra_kubelet_config)
        (d / "kubelet.yaml").write_text(yaml.safe_dump(config))

    def _start_holder(self) -> None:
        d = self.dir
        script = (
            "set -e; mkdir -p /var/lib/kubelet /run/containerd; "
            f"mount --bind {d}/kubelet /var/lib/kubelet; "
            f"mount --bind {d}/run-containerd /run/containerd; "
            "echo ready; exec sleep infinity"
        )
        holder = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "bash", "-c", script],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        assert holder.stdout is not None
        line = holder.stdout.readline()
        if line.strip() != b"ready":
            holder.kill()
            err = holder.stderr.read().decode() if holder.stderr else ""
            raise NodeError(f"mount namespace setup failed: {err.strip()}")
        self._holder = holder

    def _spawn(self, name: str, argv: list[str]) -> None:
        assert self._holder is not None
        log = self.dir / f"{name}.log"
        with log.open("ab") as f:
            popen = subprocess.Popen(
                ["nsenter", f"--mount=/proc/{self._holder.pid}/ns/mnt", "--", *argv],
                stdin=subprocess.DEVNULL,
                stdout=f,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
                start_new_session=True,
            )
        self._procs[name] = _Proc(name, popen, log)

    def _start_containerd(self, deadline: float) -> None:
        self._spawn(
            "containerd", [str(self.bin / "containerd"), f"--config={self.dir / 'containerd.toml'}"]
        )
        self.wait_for(
            lambda: self.containerd_socket.exists() and self.ctr("version"),
            deadline - time.monotonic(),
            "containerd socket",
        )

    def _crictl_stop_all(self) -> None:  # ctr sees the CRI's containers in namespace k8s.io
        for cid in self.ctr("tasks", "list", "-q").split():
            with contextlib.suppress(NodeError):
                self.ctr("tasks", "kill", "-s", "SIGKILL", cid)

    def _stop_proc(self, name: str, timeout: float = 15.0) -> None:
        p = self._procs.pop(name, None)
        if p is not None:
            self._kill_tree(p.popen, timeout)

    @staticmethod
    def _kill_tree(popen: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
        if popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGTERM)
            try:
                popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(popen.pid, signal.SIGKILL)
                popen.wait()
