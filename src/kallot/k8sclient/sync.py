"""The synchronous typed client (``kubernetes.client``), for the test helpers
(``kallot.testing``) and tests only: building objects in a test cluster, reading them back.

The scheduler and the node agent never use it: they talk through ``k8sclient.api`` in plain
dicts.
"""

from __future__ import annotations

import os

from kubernetes import client, config

ApiClient = client.ApiClient
ApiException = client.ApiException
CoreV1Api = client.CoreV1Api
ApiextensionsV1Api = client.ApiextensionsV1Api
CustomObjectsApi = client.CustomObjectsApi
V1Namespace = client.V1Namespace
V1ObjectMeta = client.V1ObjectMeta
V1Pod = client.V1Pod
V1CustomResourceDefinition = client.V1CustomResourceDefinition


def api_client(kubeconfig: str | os.PathLike[str]) -> client.ApiClient:
    """A synchronous ApiClient for ``kubeconfig`` (the caller closes it)."""
    api: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=os.fspath(kubeconfig)
    )
    return api
