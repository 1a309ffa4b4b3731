"""The agent's exporter with ``--metrics-auth delegated``, from a tenant's side (docs/security.md).

The agent, assembled with the real API server as its authority, serves ``/metrics`` over HTTPS:
its per-pod series name every namespace and pod on the node, so no token and a made-up one get
401, a tenant's service account 403, and only a service account that RBAC lets ``get
/metrics`` gets the series; the kubelet's probes need no token. The answers are cached (a second
scrape sends no review), as kube-scheduler caches them.
"""

from __future__ import annotations

import asyncio
import shutil
import ssl
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from kallot.config import tls
from kallot.k8sclient.delegated import DelegatedAuth
from kallot.node.agent import Agent, AgentConfig
from kallot.node.deviceplugin import StaticRecordSource
from kallot.node.fake import FakeBackend
from kallot.node.k8s import NodeClient
from kallot.testing.controlplane import (
    ControlPlane,
    service_account_token,
    until_subject_allowed,
)
from kallot.testing.kubelet import FakeKubelet

pytestmark = pytest.mark.controlplane

DATA = Path(__file__).parent / "data"
NS = "exporter-auth"


@pytest.fixture
def sockdir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="kea-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _get(port: int, path: str, token: str | None = None) -> tuple[int, str]:
    unverified = ssl.create_default_context()
    unverified.check_hostname = False
    unverified.verify_mode = ssl.CERT_NONE  # self-signed, as Prometheus scrapes it
    req = urllib.request.Request(f"https://127.0.0.1:{port}{path}")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10, context=unverified) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


async def test_exporter_answers_only_rbac_allowed_scrapers(
    node_cp: ControlPlane, client: NodeClient, sockdir: Path
) -> None:
    await client.request(
        "POST",
        "/api/v1/namespaces",
        body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
    )
    for sa in ("prometheus", "tenant"):
        await client.request(
            "POST",
            f"/api/v1/namespaces/{NS}/serviceaccounts",
            body={"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa}},
        )
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    await client.request(
        "POST",
        f"{rbac}/clusterroles",
        body={
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": f"{NS}-metrics-reader"},
            "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}],
        },
    )
    await client.request(
        "POST",
        f"{rbac}/clusterrolebindings",
        body={
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{NS}-metrics-reader"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": f"{NS}-metrics-reader",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": NS}],
        },
    )
    prometheus = await service_account_token(client, NS, "prometheus")
    tenant = await service_account_token(client, NS, "tenant")
    # The binding reaches the API server's authorizer asynchronously: wait for it, so the first
    # scrape's decision (cached 10 s) is the binding's.
    await until_subject_allowed(client, f"system:serviceaccount:{NS}:prometheus", "/metrics")

    kubelet = FakeKubelet(sockdir)
    await kubelet.start()
    backend = FakeBackend.from_file(DATA / "hgx-h100-8.yaml")
    auth = DelegatedAuth(client)
    agent = Agent(
        AgentConfig(
            node="gpu-1",
            plugin_dir=sockdir,
            sharing=backend.sharing(),
            refresh_s=3600,
            metrics_address="127.0.0.1:0",
            metrics_tls=tls.server_context(None, None),
        ),
        backend,
        StaticRecordSource(),
        metrics_auth=auth,
    )
    await agent.start()
    port = agent.metrics_port
    try:

        def scrape(token: str | None, path: str = "/metrics") -> tuple[int, str]:
            return _get(port, path, token)

        assert await asyncio.to_thread(scrape, None, "/healthz") == (200, "ok\n")
        status, body = await asyncio.to_thread(scrape, None)
        assert status == 401 and "DCGM" not in body and "kallot_" not in body
        status, body = await asyncio.to_thread(scrape, "made-up")
        assert status == 401 and "kallot_" not in body
        status, body = await asyncio.to_thread(scrape, tenant)
        assert status == 403 and f"system:serviceaccount:{NS}:tenant" in body, body
        status, body = await asyncio.to_thread(scrape, prometheus)
        assert status == 200 and "kallot_gpu" in body, body
        sent = auth.reviews
        assert (await asyncio.to_thread(scrape, prometheus))[0] == 200
        assert auth.reviews == sent  # cached: no second TokenReview or SubjectAccessReview
    finally:
        await agent.stop()
        await kubelet.stop()
