"""The scheduler's secure port, from a tenant's side (docs/security.md, "Endpoints").

A real ``kallot scheduler`` serves ``/metrics`` over TLS on its secure port and asks the real API
server who the caller is (TokenReview) and whether RBAC lets them ``get /metrics``
(SubjectAccessReview): no token and a made-up token are 401, a tenant's service account 403, the
service account bound to the chart's metrics-reader ClusterRole 200; the probes answer anyone.
"""

from __future__ import annotations

import ssl
import subprocess
import sys
from pathlib import Path

import pytest
from kubernetes import client

from kallot.config import tls
from kallot.testing.live import Cluster, SchedulerProcess, wait_until

pytestmark = pytest.mark.controlplane


def _token(cluster: Cluster, sa: str) -> str:
    core = client.CoreV1Api(cluster.api)
    core.create_namespaced_service_account(
        cluster.ns, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=sa))
    )
    req = core.create_namespaced_service_account_token(
        sa,
        cluster.ns,
        client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
        ),
    )
    assert req.status is not None
    return str(req.status.token)


def _metrics_reader(cluster: Cluster, sa: str) -> None:
    """What the chart's ``<release>-metrics-reader`` ClusterRole grants, bound to ``sa``."""
    rbac = client.RbacAuthorizationV1Api(cluster.api)
    name = f"{cluster.ns}-metrics-reader"
    rbac.create_cluster_role(
        client.V1ClusterRole(
            metadata=client.V1ObjectMeta(name=name),
            rules=[client.V1PolicyRule(non_resource_urls=["/metrics"], verbs=["get"])],
        )
    )
    rbac.create_cluster_role_binding(
        client.V1ClusterRoleBinding(
            metadata=client.V1ObjectMeta(name=name),
            role_ref=client.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=name
            ),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name=sa, namespace=cluster.ns)],
        )
    )


def test_metrics_need_a_token_rbac_allows(cluster: Cluster, tmp_path: Path) -> None:
    prometheus = _token(cluster, "prometheus")
    tenant = _token(cluster, "tenant")
    _metrics_reader(cluster, "prometheus")
    s = SchedulerProcess(cluster.cp.kubeconfig_path, tmp_path / "scheduler.log")
    cluster.schedulers.append(s)
    wait_until(s.secure_ready, timeout=60, what="the secure port's /readyz")

    # The probes answer anyone, as kube-scheduler's --authorization-always-allow-paths.
    assert s.get_secure("/healthz") == (200, "ok\n")
    status, body = s.get_secure("/metrics")
    assert status == 401 and "bearer token" in body and "kallot_" not in body
    status, body = s.get_secure("/metrics", token="not-a-token")
    assert status == 401 and "refused" in body and "kallot_" not in body
    status, body = s.get_secure("/metrics", token=tenant)
    assert status == 403, body
    assert f"system:serviceaccount:{cluster.ns}:tenant" in body and "kallot_" not in body
    # RBAC is asked (the ClusterRole binding may take a moment to reach the authorizer).
    wait_until(
        lambda: s.get_secure("/metrics", token=prometheus)[0] == 200,
        timeout=30,
        what="the metrics reader's scrape to pass",
    )
    status, body = s.get_secure("/metrics", token=prometheus)
    assert status == 200 and "kallot_nodes" in body
    # Plain HTTP is a different listener; TLS is what the secure port speaks.
    with pytest.raises(OSError):
        import urllib.request

        urllib.request.urlopen(f"http://127.0.0.1:{s.secure_port}/healthz", timeout=5)


def test_secure_port_serves_the_given_certificate(cluster: Cluster, tmp_path: Path) -> None:
    cert, key = tls.self_signed(["kallot.example"])
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    s = SchedulerProcess(
        cluster.cp.kubeconfig_path,
        tmp_path / "scheduler.log",
        extra=[
            f"--tls-cert-file={tmp_path / 'tls.crt'}",
            f"--tls-private-key-file={tmp_path / 'tls.key'}",
        ],
    )
    cluster.schedulers.append(s)
    wait_until(s.secure_ready, timeout=60, what="the secure port's /readyz")
    served = ssl.get_server_certificate(("127.0.0.1", s.secure_port))
    assert ssl.PEM_cert_to_DER_cert(served) == ssl.PEM_cert_to_DER_cert(cert.decode())


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--tls-cert-file=/nonexistent/tls.crt"], "--tls-private-key-file: got '', expected"),
        (
            ["--tls-cert-file=/nonexistent/tls.crt", "--tls-private-key-file=/nonexistent/k"],
            "--tls-cert-file: got '/nonexistent/tls.crt', expected a readable PEM file",
        ),
        (["--secure-address=0.0.0.0:99999"], "expected a port from 0 to 65535"),
    ],
)
def test_bad_serving_flags_are_one_line(args: list[str], expected: str, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    out = subprocess.run(
        [sys.executable, "-m", "kallot.cli.main", "scheduler", f"--kubeconfig={kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2, out.stderr
    assert expected in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
