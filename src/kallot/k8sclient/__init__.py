"""kallot's one door to the Kubernetes API: the official ``kubernetes`` client, used by the
scheduler (``kube.api.client``), the node agent (``node.k8s``) and the test helpers
(``kallot.testing``), and imported nowhere else (an import-linter contract checks it).

- ``k8sclient.errors``: ``ApiError``, the one error type of a request (no heavy import).
- ``k8sclient.api``: kubeconfig / in-cluster loading (``connect``), the request wrapper on the
  generated client's generic path (``send``, ``request_json``: objects stay plain dicts, raw
  JSON with ``_preload_content=False``), and the watch stream reader (``json_lines``).
- ``k8sclient.client``: ``JsonClient`` (requests retried per a ``RetryPolicy``), the base of the
  scheduler's ``KubeClient`` and the node agent's ``NodeClient``.
- ``k8sclient.sync``: the synchronous typed client, for the test helpers only.
- ``k8sclient.quantity``: the client's ``parse_quantity``, for the node agent.

Importing this package imports nothing heavy: ``kubernetes`` is loaded when ``k8sclient.api``
(or ``k8sclient.sync``) is, which the scheduler does only when it first talks to the API.
"""
