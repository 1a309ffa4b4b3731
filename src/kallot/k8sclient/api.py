"""Loading a kubeconfig (or the in-cluster service account), and the request wrapper every
kallot client uses: the generated client's generic path (``param_serialize`` + ``call_api``),
so objects stay plain dicts end to end (unknown fields of CRDs and annotations survive, and the
hot path skips the pydantic round trip).

Used by ``kube.api.client.KubeClient`` (the scheduler: retries and list/watch on top),
``node.k8s.NodeClient`` (the node agent) and ``testing.controlplane`` (test clusters). Every
failure is a ``k8sclient.errors.ApiError``; status 0 means no answer came.
"""

from __future__ import annotations

import json
import os
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from kubernetes.aio import client as aio_client
from kubernetes.aio import config as aio_config

from kallot.core.errors import ConfigError, KallotError
from kallot.k8sclient.errors import ApiError, error_from_body

#: the generated client's types, for annotations outside this package
ApiClient = aio_client.ApiClient
Configuration = aio_client.Configuration

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

# What a request can raise when no answer came: aiohttp's connection errors are not all
# OSErrors (ServerDisconnectedError, ClientPayloadError), timeouts are TimeoutError.
TRANSPORT_ERRORS = (OSError, TimeoutError, aiohttp.ClientError)


def why(exc: BaseException) -> str:
    """An exception as one short line (the loader's messages span lines)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


# -- configuration ---------------------------------------------------------------------------


async def load_configuration(
    kubeconfig: str | os.PathLike[str] | None = None,
    *,
    context: str | None = None,
    missing: str = "no kubeconfig: pass --kubeconfig, set KUBECONFIG, create ~/.kube/config, "
    "or run inside a cluster",
) -> aio_client.Configuration:
    """The configuration for ``kubeconfig`` (default: the first file of $KUBECONFIG,
    ~/.kube/config, then the in-cluster service account). A bad kubeconfig is a one-line
    ``ConfigError`` naming the file; none at all raises ``KallotError(missing)``."""
    configuration = aio_client.Configuration()
    path = os.fspath(kubeconfig) if kubeconfig else os.environ.get("KUBECONFIG", "")
    path = path.split(os.pathsep)[0] if path else ""
    default = Path("~/.kube/config").expanduser()
    if not path and default.is_file():
        path = str(default)
    if path:
        if not os.path.isfile(path):
            # Checked here: the client would log "Config not found" before its own error.
            why_not = "not a file" if os.path.exists(path) else "No such file or directory"
            raise ConfigError("--kubeconfig", path, f"a readable file ({why_not})")
        try:
            await aio_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=path, context=context, client_configuration=configuration
            )
        # A missing file, YAML that does not parse, or a kubeconfig without the clusters,
        # users or context it names: one line naming the file, not a traceback.
        except (
            aio_config.ConfigException,
            yaml.YAMLError,
            OSError,
            ValueError,
            TypeError,
            KeyError,
            AttributeError,
        ) as exc:
            raise ConfigError("--kubeconfig", path, f"a valid kubeconfig ({why(exc)})") from None
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        aio_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        raise KallotError(missing)
    return configuration


def proxy_once(configuration: aio_client.Configuration) -> None:
    """Read the proxy environment (HTTPS_PROXY, NO_PROXY, ...) once, here.

    The generated client turns on aiohttp's ``trust_env``, which looks the proxy environment
    and ``~/.netrc`` up again in a worker thread on every request: two thread hops per bind,
    a measurable share of the scheduler's time when it binds hundreds of pods a second. The
    API server's address does not change, so the answer does not either."""
    if not configuration.proxy:
        url = urllib.parse.urlsplit(str(configuration.host))
        proxy = urllib.request.getproxies().get(url.scheme)
        if proxy and url.hostname and not urllib.request.proxy_bypass(url.hostname):
            configuration.proxy = proxy
    extra = dict(configuration.client_session_kwargs or {})
    extra.setdefault("trust_env", False)
    configuration.client_session_kwargs = extra


def api_client(
    configuration: aio_client.Configuration, *, pool_size: int | None = None
) -> aio_client.ApiClient:
    """An ApiClient on ``configuration``; ``pool_size`` caps parallel requests (aiohttp's
    connector)."""
    if pool_size is not None:
        configuration.connection_pool_maxsize = pool_size
    return aio_client.ApiClient(configuration=configuration)


async def close(api: aio_client.ApiClient) -> None:
    await api.close()  # type: ignore[no-untyped-call]


# -- requests --------------------------------------------------------------------------------


async def send(
    api: aio_client.ApiClient,
    method: str,
    path: str,
    *,
    query: Sequence[tuple[str, str]] = (),
    body: Any = None,
    content_type: str | None = JSON,
    timeout: float = 30.0,
) -> Any:
    """One request; returns the raw answer (``status``, ``read()``, ``response``) whatever its
    status, or raises ApiError when none came (status 0) or the client refused it.
    ``content_type`` None sends only ``Accept`` (a watch)."""
    headers = {"Accept": JSON}
    if content_type is not None:
        headers = {"Content-Type": content_type, "Accept": JSON}
    try:
        method_, url, headers_, data, post = await api.param_serialize(
            method,
            path,
            query_params=list(query) or None,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        return await api.call_api(method_, url, headers_, data, post, _request_timeout=timeout)
    except TRANSPORT_ERRORS as exc:
        raise ApiError(method, path, 0, f"{type(exc).__name__}: {exc}") from exc
    except aio_client.exceptions.ApiException as exc:
        raise ApiError(method, path, int(exc.status or 0), str(exc.reason)) from exc


async def read(method: str, path: str, resp: Any) -> bytes:
    """The body of an answer; ApiError (status 0) when the connection broke while reading."""
    try:
        raw: bytes = await resp.read()
    except TRANSPORT_ERRORS as exc:
        raise ApiError(method, path, 0, f"{type(exc).__name__}: {exc}") from exc
    return raw


async def request_json(
    api: aio_client.ApiClient,
    method: str,
    path: str,
    *,
    query: Sequence[tuple[str, str]] = (),
    body: Any = None,
    content_type: str = JSON,
    timeout: float = 30.0,
) -> dict[str, Any]:
    """One request, not retried: the decoded JSON answer, or ApiError."""
    resp = await send(
        api, method, path, query=query, body=body, content_type=content_type, timeout=timeout
    )
    raw = await read(method, path, resp)
    if not 200 <= resp.status < 300:
        raise error_from_body(method, path, resp.status, raw)
    result: dict[str, Any] = json.loads(raw) if raw else {}
    return result


# -- watches ---------------------------------------------------------------------------------


async def json_lines(path: str, resp: Any) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects of a watch stream, one per line, until the server ends it; releases
    the connection. Chunks, not readline: a pod's JSON line may exceed aiohttp's 64 KiB line
    limit."""
    try:
        if resp.status != 200:
            raise error_from_body("WATCH", path, resp.status, await resp.read())
        buf = b""
        async for chunk in resp.response.content.iter_any():
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                if line.strip():
                    yield json.loads(line)
    finally:
        resp.response.release()
