"""The chart installed for real: ``helm install`` of charts/kallot on the test node with kallot's
image (``make image-node``). The scheduler's Deployment and the agent's DaemonSet run as
containers under containerd; their service-account tokens are the kubelet's projected ones
(the API server's ServiceAccount admission plugin, kube-controller-manager's service-account
and root-CA publisher controllers), so the chart's RBAC and admission policies are what the
components really run under. GPU pods (a whole GPU, a MIG instance, a share, a DRA claim) are
scheduled by the containerised scheduler and served by the containerised agent (fake backend,
``agent.backend=fake``), ``kallot doctor`` passes against the installation, a new scheduler
pod takes the leader's Lease, and ``helm uninstall`` leaves none of the chart's objects.

The test node has no kube-proxy and one network namespace for every pod of the host: the
install sets ``apiServer.host`` (KUBERNETES_SERVICE_HOST) and ``hostNetwork`` (the pods' own
namespaces have no route out), and one scheduler replica (two on one host would both bind the
secure port).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from kallot.config.inventory import ANNOTATION as INVENTORY_ANNOTATION
from kallot.config.inventory import NodeInventory
from kallot.k8sclient import sync as client
from kallot.node import cdi, dra
from kallot.testing.controllers import ControllerManager
from kallot.testing.controlplane import ControlPlane, controlplane_bin_dir
from kallot.testing.dra import DRA_CONTROLLERS, GROUP, VERSION, claim, exactly
from kallot.testing.gpupods import SCRIPT, expected_view, gpu_pod, run_gpu_pod
from kallot.testing.live import free_port
from kallot.testing.node import BUSYBOX_IMAGE, Node

pytestmark = [pytest.mark.node, pytest.mark.controlplane]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kallot"
INVENTORY = Path(__file__).parent / "data" / "gpu-node.yaml"
NS, RELEASE = "kallot-system", "kallot"
# What a Deployment, a DaemonSet, projected tokens, DRA claims and helm's uninstall need.
CONTROLLERS = (
    "serviceaccount-controller",
    "root-ca-certificate-publisher-controller",
    "deployment-controller",
    "replicaset-controller",
    "daemonset-controller",
    *DRA_CONTROLLERS,
)
DRA_GPU = 2  # agent.dra.gpus: DRA serves GPU 2, the device plugin GPUs 0 (MIG), 1 and 3 (MPS)


class Install:
    """The control plane, the node, the release; helm and kallot's CLI against them."""

    def __init__(self, plane: ControlPlane, node: Node, api: Any, tmp: Path) -> None:
        self.plane, self.node, self.tmp = plane, node, tmp
        self.v1: Any = client.CoreV1Api(api)
        self.apps: Any = k8s.AppsV1Api(api)
        self.co: Any = k8s.CustomObjectsApi(api)
        self.coord: Any = k8s.CoordinationV1Api(api)

    def helm(self, *args: str) -> str:
        env = {**os.environ, "KUBECONFIG": str(self.plane.kubeconfig_path)}
        env.update(
            dict.fromkeys(("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"), str(self.tmp))
        )
        res = subprocess.run(
            [str(controlplane_bin_dir() / "helm"), *args, "-n", NS],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )
        assert res.returncode == 0, f"helm {' '.join(args)}: {res.stderr.strip()}"
        return res.stdout

    def values(self, image: str) -> dict[str, Any]:
        repo, tag = image.rsplit(":", 1)
        small = {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "1Gi"}}
        return {
            "image": {"repository": repo, "tag": tag, "pullPolicy": "Never"},
            "replicas": 1,
            "apiServer": {
                "host": "127.0.0.1",
                "port": int(self.plane.server_url.rsplit(":", 1)[1]),
            },
            "hostNetwork": True,
            "metrics": {"port": free_port()},
            "resources": small,
            "agent": {
                "backend": "fake",
                "fake": {
                    "inventory": yaml.safe_load(INVENTORY.read_text()),
                    "devRoot": str(self.node.dir / "dev"),
                },
                "hostNetwork": True,
                "metricsPort": free_port(),
                "refreshSeconds": 1,
                "resources": small,
                "dra": {
                    "enabled": True,
                    "devicePlugin": True,
                    "gpus": str(DRA_GPU),
                    "cdiDir": str(self.node.cdi_dir),
                },
            },
        }

    def pods(self, component: str) -> list[Any]:
        sel = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component={component}"
        return list(self.v1.list_namespaced_pod(NS, label_selector=sel).items)

    def ready_pod(self, component: str) -> Any:
        """The component's one Ready pod (its containers' logs in the failure message)."""

        def ready() -> Any:
            for p in self.pods(component):
                for c in p.status.container_statuses or []:
                    if c.restart_count > 0:
                        raise AssertionError(f"{p.metadata.name} restarted:\n{self.log(p)}")
                conds = {c.type: c.status for c in p.status.conditions or []}
                if p.metadata.deletion_timestamp is None and conds.get("Ready") == "True":
                    return p
            return None

        return self.node.wait_for(ready, 180, f"the {component} pod Ready")

    def log(self, pod: Any) -> str:
        try:
            return self.node.pod_log(NS, pod.metadata.name, pod.spec.containers[0].name)[-4000:]
        except Exception as exc:  # no log yet: say so
            return f"(no log: {exc})"

    def leader(self) -> str:
        lease = self.coord.read_namespaced_lease(RELEASE, NS)
        return str(lease.spec.holder_identity or "")

    def doctor(self) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "kallot.cli.main",
                "doctor",
                "-n",
                NS,
                f"--kubeconfig={self.plane.kubeconfig_path}",
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )


@pytest.fixture(scope="module")
def install(
    kallot_image: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Install]:
    image, archive = kallot_image
    with (
        ControlPlane(scheduler=True, service_accounts=True) as plane,
        ControllerManager(plane, controllers=CONTROLLERS),
        Node(plane) as node,
        plane.api_client() as api,
    ):
        inst = Install(plane, node, api, tmp_path_factory.mktemp("helm"))
        node.ctr("images", "import", "--local", str(archive))
        # What GFD/NFD would label: the agent's DaemonSet runs on GPU nodes only.
        inst.v1.patch_node(node.name, {"metadata": {"labels": {"nvidia.com/gpu.present": "true"}}})
        values = inst.tmp / "values.yaml"
        values.write_text(yaml.safe_dump(inst.values(image)))
        inst.helm("install", RELEASE, str(CHART), "--create-namespace", "-f", str(values))
        try:
            yield inst
        finally:
            for p in inst.v1.list_namespaced_pod("default").items:
                inst.v1.delete_namespaced_pod(p.metadata.name, "default", grace_period_seconds=1)


def _inventory(inst: Install) -> NodeInventory:
    inv: NodeInventory = inst.node.wait_for(
        lambda: (
            (a := inst.v1.read_node(inst.node.name).metadata.annotations or {}).get(
                INVENTORY_ANNOTATION
            )
            and NodeInventory.from_json(a[INVENTORY_ANNOTATION])
        ),
        60,
        "the agent's inventory on the Node",
    )
    return inv


def _dra_pod(name: str, claim_name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "kallot",
            "terminationGracePeriodSeconds": 1,
            "automountServiceAccountToken": False,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
            "containers": [
                {
                    "name": "main",
                    "image": BUSYBOX_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", SCRIPT],
                    "resources": {"requests": {"cpu": "10m"}, "claims": [{"name": "gpu"}]},
                }
            ],
        },
    }


def test_the_chart_runs_gpu_pods_through_its_containers(install: Install) -> None:
    inst, node, v1 = install, install.node, install.v1
    sched = inst.ready_pod("scheduler")
    agent = inst.ready_pod("agent")
    assert agent.spec.node_name == node.name
    assert sched.spec.containers[0].image == agent.spec.containers[0].image
    # The scheduler's container leads (the chart's --identity is the pod's name).
    node.wait_for(lambda: inst.leader() == sched.metadata.name, 60, "the scheduler pod leads")
    # The kubelet registered the containerised agent's device plugins and its DRA driver.
    node.wait_for(
        lambda: (
            (a := v1.read_node(node.name).status.allocatable or {}).get("nvidia.com/gpu") == "2"
            and a.get("nvidia.com/mig-1g.10gb") == "1"
        ),
        60,
        "the agent's resources in the Node's allocatable",
    )
    slices = node.wait_for(
        lambda: inst.co.list_cluster_custom_object(GROUP, VERSION, "resourceslices")["items"],
        60,
        "the agent's ResourceSlices",
    )
    inv = _inventory(inst)
    # The inventory marks the GPU DRA serves: the scheduler never hands it to a device-plugin pod.
    assert {d.index for d in inv.devices if d.dra} == {DRA_GPU}
    (dra_uuid,) = {
        d["attributes"]["uuid"]["string"]
        for sl in slices
        for d in sl["spec"].get("devices") or []
        if d["name"] == f"gpu-{DRA_GPU}"
    }
    spec = json.loads(cdi.device_plugin_spec_path(node.cdi_dir).read_text())
    assert spec["kind"] == cdi.DEVICE_PLUGIN_KIND

    for name, resources in [
        ("whole", {"nvidia.com/gpu": "1"}),
        ("mig", {"nvidia.com/mig-1g.10gb": "1"}),
        ("share", {"kallot.io/gpu-milli": "300", "kallot.io/gpu-memory": "20Gi"}),
    ]:
        record, shown = run_gpu_pod(node, v1, gpu_pod(name, resources))
        assert record is not None and shown == expected_view(record, inv), (name, record)
        assert all(d.index != DRA_GPU for d in record.devices), (name, record)

    body = claim("whole", [exactly("gpu", dra.CLASS_GPU)])
    body["metadata"].pop("uid")
    inst.co.create_namespaced_custom_object(GROUP, VERSION, "default", "resourceclaims", body)
    _, shown = run_gpu_pod(node, v1, _dra_pod("dra", "whole"))
    assert shown == {
        f"NVIDIA_VISIBLE_DEVICES={dra_uuid}",
        f"KALLOT_DRA_DEVICE=gpu-{DRA_GPU}",
        f"dev=/dev/nvidia{DRA_GPU}",
        *(f"dev=/dev/{n}" for n in cdi.CONTROL_NODES),
    }

    res = inst.doctor()
    assert res.returncode == 0, res.stdout + res.stderr

    # Leader election: the leader's pod is deleted (it hands the Lease back on SIGTERM), the
    # ReplicaSet's new pod takes the Lease and schedules.
    v1.delete_namespaced_pod(sched.metadata.name, NS)
    new = node.wait_for(
        lambda: (h := inst.leader()) not in ("", sched.metadata.name) and h,
        120,
        "a new scheduler pod holds the Lease",
    )
    assert new in {p.metadata.name for p in inst.pods("scheduler")}
    # The new leader rebuilds its view from the API alone: a whole GPU it hands out is one the
    # device plugin serves, never GPU 2, which the DRA claim holds (it once was: the agent
    # published every GPU in the inventory the scheduler places extended resources by).
    record, shown = run_gpu_pod(node, v1, gpu_pod("after", {"nvidia.com/gpu": "1"}))
    assert record is not None and shown == expected_view(record, inv)
    assert all(d.index != DRA_GPU for d in record.devices), record


def test_helm_uninstall_leaves_none_of_the_charts_objects(install: Install) -> None:
    inst = install
    for p in inst.v1.list_namespaced_pod("default").items:
        inst.v1.delete_namespaced_pod(p.metadata.name, "default", grace_period_seconds=1)
    # Gone before the agent goes: the kubelet unprepares the DRA claim through it.
    inst.node.wait_for(
        lambda: not inst.v1.list_namespaced_pod("default").items, 90, "the GPU pods gone"
    )
    inst.helm("uninstall", RELEASE, "--wait", "--timeout=120s")
    sel = f"app.kubernetes.io/instance={RELEASE}"

    def leftovers() -> list[str]:
        core, apps = inst.v1, inst.apps
        rbac: Any = k8s.RbacAuthorizationV1Api(core.api_client)
        adm: Any = k8s.AdmissionregistrationV1Api(core.api_client)
        lists = [
            core.list_namespaced_pod(NS, label_selector=sel),
            core.list_namespaced_config_map(NS, label_selector=sel),
            core.list_namespaced_service_account(NS, label_selector=sel),
            core.list_namespaced_service(NS, label_selector=sel),
            apps.list_namespaced_deployment(NS, label_selector=sel),
            apps.list_namespaced_daemon_set(NS, label_selector=sel),
            apps.list_namespaced_replica_set(NS, label_selector=sel),
            apps.list_namespaced_controller_revision(NS, label_selector=sel),
            rbac.list_cluster_role(label_selector=sel),
            rbac.list_cluster_role_binding(label_selector=sel),
            adm.list_validating_admission_policy(label_selector=sel),
            adm.list_validating_admission_policy_binding(label_selector=sel),
        ]
        out = [
            f"{i.kind or type(i).__name__} {i.metadata.name}"
            for items in lists
            for i in items.items
        ]
        classes = inst.co.list_cluster_custom_object(
            GROUP, VERSION, "deviceclasses", label_selector=sel
        )["items"]
        out += [f"deviceclass {c['metadata']['name']}" for c in classes]
        # The agent's ResourceSlices (not the chart's, but its pods'): deleted on shutdown.
        slices = inst.co.list_cluster_custom_object(GROUP, VERSION, "resourceslices")["items"]
        out += [f"resourceslice {s['metadata']['name']}" for s in slices]
        return out

    def nothing_left() -> bool:
        if left := leftovers():
            raise AssertionError(f"left behind: {left}")
        return True

    inst.node.wait_for(nothing_left, 120, "none of the release's objects left")
